"""``--peers-from-service``: the agent's peers from its headless Service's EndpointSlices.

A thin I/O layer over the pure :class:`~node_agent.core.endpoint_slices.SliceView`: list the
slices labelled ``kubernetes.io/service-name=<service>`` and managed by the EndpointSlice
controller in the namespace, watch them from the
list's resourceVersion (reconnecting from the last one seen when the server ends the watch), and
list again when the view says the watch cannot resume (410 Gone, any ERROR event). Every change
of the peer set goes to ``on_change`` (``Peers.use_discovered``). The apiserver is asked with
the pod's service-account token (read per request: projected tokens rotate) and CA, from
``$KUBERNETES_SERVICE_HOST``/``_PORT`` as client-go's in-cluster config does; with
``--kube-api URL`` it is asked at that URL as is (``kubectl proxy`` adds the credentials). No
Kubernetes client library: two GET requests do not need one, and start-up stays light.

An apiserver that cannot be reached, or that refuses, leaves the peer set as it was (the
peers' subscriptions already drop peers that stop answering) and is asked again after a
growing pause; so does an answer of a shape nobody expected (the task must outlive it: a
discovery that ended would freeze the peer set until a restart), and a watch that ends as
soon as it began (no pause would hammer the apiserver).
"""

from __future__ import annotations

import asyncio
import json
import logging
import ssl
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlencode

import aiohttp

from node_agent.core.endpoint_slices import (
    MANAGED_BY,
    MANAGED_BY_LABEL,
    SERVICE_LABEL,
    SliceView,
    Step,
)
from node_agent.errors import ConfigError
from node_agent.tls_client import ca_context

log = logging.getLogger("corral.peers")

SERVICE_ACCOUNT = Path("/var/run/secrets/kubernetes.io/serviceaccount")
WATCH_SECONDS = 290  # the apiserver ends a watch after this; it resumes from the last version
RETRY_SECONDS = (1.0, 30.0)  # first and longest pause after a failed list or watch
QUICK_END_SECONDS = 1.0  # a watch that ends sooner is paused after, as a failed one


@dataclass(frozen=True, slots=True)
class KubeApi:
    """Where the apiserver is and how to authenticate to it."""

    server: str
    token_file: Path | None = None
    ssl_context: ssl.SSLContext | None = None

    def headers(self) -> dict[str, str]:
        if self.token_file is None:
            return {}
        return {"Authorization": f"Bearer {self.token_file.read_text(encoding='ascii').strip()}"}


def kube_api(
    explicit: str | None, env: Mapping[str, str], account: Path = SERVICE_ACCOUNT
) -> KubeApi:
    """``--kube-api URL`` as given, else the pod's in-cluster apiserver and credentials."""
    if explicit is not None:
        return KubeApi(explicit.rstrip("/"))
    host, port = env.get("KUBERNETES_SERVICE_HOST"), env.get("KUBERNETES_SERVICE_PORT")
    if not host or not port:
        raise ConfigError(
            "--peers-from-service: not in a Kubernetes pod ($KUBERNETES_SERVICE_HOST and "
            "$KUBERNETES_SERVICE_PORT are unset); give --kube-api URL (e.g. `kubectl proxy`'s "
            "http://127.0.0.1:8001), or name the peers with --peer URL"
        )
    token, ca = account / "token", account / "ca.crt"
    missing = [str(p) for p in (token, ca) if not p.is_file()]
    if missing:
        raise ConfigError(
            "--peers-from-service: no service-account credentials in the pod "
            f"({', '.join(missing)} missing): mount the token (automountServiceAccountToken: "
            "true; the chart does when agent.peers.enabled is on)"
        )
    context = ca_context(str(ca), "--peers-from-service: the cluster CA")
    bracketed = f"[{host}]" if ":" in host else host
    return KubeApi(f"https://{bracketed}:{port}", token_file=token, ssl_context=context)


def service_namespace(
    given: str | None, env: Mapping[str, str], account: Path = SERVICE_ACCOUNT
) -> str:
    """The Service's namespace: as given, else the pod's own (``$POD_NAMESPACE``, else the
    service account's namespace file)."""
    if given:
        return given
    if env.get("POD_NAMESPACE"):
        return env["POD_NAMESPACE"]
    try:
        return (account / "namespace").read_text(encoding="utf-8").strip()
    except OSError:
        raise ConfigError(
            "--peers-from-service NAME: the pod's namespace is unknown ($POD_NAMESPACE unset, "
            f"no {account / 'namespace'}): give it as NAMESPACE/NAME"
        ) from None


class PeerDiscovery:
    """Lists and watches one Service's EndpointSlices for as long as the agent runs."""

    def __init__(
        self,
        api: KubeApi,
        namespace: str,
        service: str,
        view: SliceView,
        on_change: Callable[[tuple[str, ...]], None],
    ) -> None:
        self._api = api
        self._view = view
        self._on_change = on_change
        self.where = f"{namespace}/{service}"
        self._path = f"/apis/discovery.k8s.io/v1/namespaces/{quote(namespace)}/endpointslices"
        self._selector = f"{SERVICE_LABEL}={service},{MANAGED_BY_LABEL}={MANAGED_BY}"
        self._peers: tuple[str, ...] | None = None

    async def run(self) -> None:
        # read_bufsize: one watch event is one line, and a slice of 100 endpoints can pass
        # aiohttp's default 64 KiB line limit.
        async with aiohttp.ClientSession(
            timeout=aiohttp.ClientTimeout(
                total=None, sock_connect=10, sock_read=WATCH_SECONDS + 30
            ),
            read_bufsize=2**22,
        ) as session:
            pause = RETRY_SECONDS[0]
            while True:
                try:
                    await self._list(session)
                    resume = True
                    while resume:
                        began = time.monotonic()
                        resume = await self._watch(session)
                        if time.monotonic() - began >= QUICK_END_SECONDS:
                            pause = RETRY_SECONDS[0]
                            continue
                        log.info("peers from %s: the watch ended at once", self.where)
                        await asyncio.sleep(pause)
                        pause = min(pause * 2, RETRY_SECONDS[1])
                except Exception as exc:  # the task's boundary; CancelledError goes on
                    log.warning(
                        "peers from EndpointSlices of %s: %s (again in %gs; peers unchanged)",
                        self.where,
                        exc or type(exc).__name__,
                        pause,
                    )
                    await asyncio.sleep(pause)
                    pause = min(pause * 2, RETRY_SECONDS[1])

    async def _list(self, session: aiohttp.ClientSession) -> None:
        async with self._get(session, {"labelSelector": self._selector}) as answer:
            await _check(answer, "list")
            self._view.listed(await answer.json(content_type=None))
        self._changed()

    async def _watch(self, session: aiohttp.ClientSession) -> bool:
        """Follow one watch to its end: True to resume from the last version, False to list."""
        query = {
            "labelSelector": self._selector,
            "watch": "true",  # as client-go sends it
            "allowWatchBookmarks": "true",
            "timeoutSeconds": str(WATCH_SECONDS),
        }
        if self._view.resource_version is not None:
            query["resourceVersion"] = self._view.resource_version
        async with self._get(session, query) as answer:
            if answer.status == 410:
                log.info("peers from %s: resourceVersion too old, listing again", self.where)
                return False
            await _check(answer, "watch")
            async for line in answer.content:
                if not line.strip():
                    continue
                step = self._view.event(json.loads(line))
                self._changed()
                if step is Step.RELIST:
                    log.info("peers from %s: the watch cannot resume, listing again", self.where)
                    return False
        return True

    def _get(self, session: aiohttp.ClientSession, query: dict[str, str]) -> Any:
        return session.get(
            f"{self._api.server}{self._path}?{urlencode(query)}",
            headers=self._api.headers(),
            ssl=self._api.ssl_context if self._api.ssl_context is not None else True,
        )

    def _changed(self) -> None:
        for why in self._view.skipped:
            log.warning("peers from %s: %s, left out", self.where, why)
        peers = self._view.peers()
        if peers != self._peers:
            self._peers = peers
            self._on_change(peers)


async def _check(answer: aiohttp.ClientResponse, verb: str) -> None:
    if answer.status == 200:
        return
    text = (await answer.text())[:300]
    hint = ""
    if answer.status in (401, 403):
        hint = " (the agent's ServiceAccount needs get/list/watch on endpointslices here)"
    raise ValueError(f"{verb} answered {answer.status}{hint}: {text}")
