"""The few Kubernetes API writes the operator makes, as one small async client.

Why not the ``kubernetes`` package's typed API: since v33 its create calls want pydantic models
and its PATCH picks ``json-patch+json`` for a dict body unless told otherwise; every call would
also block a thread. The package is still used for what it does well: finding the credentials
(in-cluster service account with token rotation, or a kubeconfig). Reads come from kopf's
watch-fed indexes, not from here.
"""

from __future__ import annotations

import json
import ssl
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol
from urllib.parse import quote

import aiohttp

from .relist import METADATA_LIST

MERGE_PATCH = "application/merge-patch+json"


class KubeError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"HTTP {status}: {message}")
        self.status = status
        self.body = message

    def object_missing(self, name: str) -> bool:
        """Whether the apiserver said the object ``name`` itself does not exist (a Status of
        reason NotFound naming it), not a path or subresource it does not serve."""
        if self.status != 404:
            return False
        try:
            answer = json.loads(self.body)
        except ValueError:
            return False
        details = answer.get("details") if isinstance(answer, dict) else None
        return (
            answer.get("reason") == "NotFound"
            and isinstance(details, dict)
            and details.get("name") == name
        )


class Cluster(Protocol):
    """What the reconciler needs from the API (a seam for tests of the glue)."""

    async def create(self, path: str, body: Mapping[str, Any]) -> dict[str, Any]: ...
    async def patch(self, path: str, body: Mapping[str, Any]) -> dict[str, Any]: ...
    async def delete(self, path: str) -> None: ...
    async def list_metadata(self, path: str, params: Mapping[str, str]) -> dict[str, Any]: ...


def ns_path(namespace: str, plural: str, name: str | None = None, *, group: str = "") -> str:
    base = f"/apis/{group}" if group else "/api/v1"
    path = f"{base}/namespaces/{quote(namespace)}/{plural}"
    return f"{path}/{quote(name)}" if name else path


def preset_status_path(name: str) -> str:
    return f"/apis/corral.dev/v1alpha1/modelpresets/{quote(name)}/status"


SA_TOKEN = "/var/run/secrets/kubernetes.io/serviceaccount/token"


@dataclass
class Credentials:
    server: str
    token: str | None = None
    ssl_context: ssl.SSLContext | bool | None = None
    # Projected service-account tokens rotate (the kubelet rewrites the file about hourly):
    # read it per request rather than once.
    token_file: str | None = None

    def bearer(self) -> str | None:
        if self.token_file is not None:
            with open(self.token_file, encoding="ascii") as f:
                return f.read().strip()
        return self.token


def load_credentials() -> Credentials:
    """In-cluster service account, else the current kubeconfig context."""
    from kubernetes import client, config  # the operator extra

    token_file: str | None = None
    try:
        config.load_incluster_config()  # type: ignore[no-untyped-call]
        token_file = SA_TOKEN
    except config.ConfigException:
        config.load_kube_config()  # type: ignore[no-untyped-call]
    cfg = client.Configuration.get_default_copy()
    hook: Any = getattr(cfg, "refresh_api_key_hook", None)
    if hook is not None:  # exec-based kubeconfig credentials fill api_key here
        hook(cfg)
    token = (cfg.api_key or {}).get("authorization") or (cfg.api_key or {}).get("BearerToken")
    if token and token.lower().startswith("bearer "):
        token = token[7:]
    ctx: ssl.SSLContext | bool | None = None
    if cfg.host.startswith("https"):
        if not cfg.verify_ssl:
            ctx = False
        else:
            ctx = ssl.create_default_context(cafile=cfg.ssl_ca_cert)
            if cfg.cert_file and cfg.key_file:
                ctx.load_cert_chain(cfg.cert_file, cfg.key_file)
    return Credentials(server=cfg.host, token=token, ssl_context=ctx, token_file=token_file)


class HttpCluster:
    """``Cluster`` over aiohttp."""

    def __init__(self, session: aiohttp.ClientSession, credentials: Credentials) -> None:
        self._session = session
        self._creds = credentials

    async def _call(
        self,
        method: str,
        path: str,
        body: Mapping[str, Any] | None = None,
        ctype: str | None = None,
        *,
        accept: str = "application/json",
        params: Mapping[str, str] | None = None,
    ) -> dict[str, Any] | None:
        headers = {"Accept": accept}
        token = self._creds.bearer()
        if token:
            headers["Authorization"] = f"Bearer {token}"
        if ctype:
            headers["Content-Type"] = ctype
        url = self._creds.server.rstrip("/") + path
        async with self._session.request(
            method,
            url,
            json=body,
            params=dict(params or {}),
            headers=headers,
            ssl=self._creds.ssl_context if self._creds.ssl_context is not None else True,
        ) as resp:
            if resp.status == 404 and method in ("GET", "DELETE"):
                return None
            if resp.status >= 400:
                text = await resp.text()
                raise KubeError(resp.status, text[:500])
            data = await resp.json(content_type=None)
            return data if isinstance(data, dict) else {}

    async def create(self, path: str, body: Mapping[str, Any]) -> dict[str, Any]:
        return await self._call("POST", path, body, "application/json") or {}

    async def patch(self, path: str, body: Mapping[str, Any]) -> dict[str, Any]:
        return await self._call("PATCH", path, body, MERGE_PATCH) or {}

    async def delete(self, path: str) -> None:
        await self._call("DELETE", path)

    async def list_metadata(self, path: str, params: Mapping[str, str]) -> dict[str, Any]:
        """One page of a listing, metadata only (names and resourceVersions)."""
        return await self._call("GET", path, accept=METADATA_LIST, params=params) or {}
