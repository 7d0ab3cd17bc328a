"""kmock's Kubernetes emulator, held to the apiserver rules the operator depends on.

The plain emulator stores whatever it is sent; a real apiserver refused the operator's Events
(posted in its own namespace about a cluster-scoped ModelPreset). This one checks, as the
apiserver does, every object created: the path's namespace against ``metadata.namespace``
(``rest.BeforeCreate``), Events against ``ValidateEventCreate`` for core/v1 (the legacy rules:
an Event about a cluster-scoped object lives in ``default`` or has no namespace) and every
built-in kind against its OpenAPI schema (kubernetes-validate, strict: unknown fields fail), and
every ModelPreset against the CRD's schema and CEL rules (``tests.crd_rules``, cel-cpp).
It also records the operator's own requests, told apart by its bearer token, as RBAC
(group, resource, verb, namespace) tuples, for the check against the chart's roles.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import aiohttp.web
import attrs
import kmock as kmocklib
import kubernetes_validate

from tests.crd_rules import errors as crd_errors

KUBE_VERSION = "1.35"
OPERATOR_TOKEN = "corral-operator-test-token"
_DNS1123_SUBDOMAIN = re.compile(
    r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
)
_VERBS = {"LIST": "list", "WATCH": "watch", "FETCH": "get", "CREATE": "create", "DELETE": "delete"}


@dataclass(frozen=True, order=True)
class Access:
    """One RBAC permission as a request needs it (namespace None: cluster scope)."""

    group: str
    resource: str  # plural, or plural/subresource
    verb: str
    namespace: str | None
    name: str | None = None  # the object's name; in a grant, its resourceNames (None: any)


def event_errors(event: dict[str, Any]) -> list[str]:
    """What the apiserver's ValidateEventCreate (core/v1, no eventTime) refuses."""
    errors: list[str] = []
    namespace = (event.get("metadata") or {}).get("namespace") or ""
    involved = event.get("involvedObject") or {}
    involved_ns = involved.get("namespace") or ""
    if event.get("eventTime") in (None, ""):
        if not involved_ns:
            if namespace not in ("", "default"):
                errors.append(
                    f"involvedObject.namespace: Invalid value: {involved_ns!r}: "
                    "does not match event.namespace"
                )
        elif namespace != involved_ns:
            errors.append(
                f"involvedObject.namespace: Invalid value: {involved_ns!r}: "
                "does not match event.namespace"
            )
    if namespace and not _DNS1123_SUBDOMAIN.match(namespace):
        errors.append(f"namespace: Invalid value: {namespace!r}")
    return errors


@attrs.define(kw_only=True)
class StrictEmulator(kmocklib.KubernetesEmulator):
    operator_access: list[Access] = attrs.field(factory=list, init=False)
    refused: list[str] = attrs.field(factory=list, init=False)
    crd_rules: bool = True
    """Off for a test of an apiserver that lacks the CRD's rules (an old copy of the CRD)."""

    async def _handle(self, request: kmocklib.Request) -> aiohttp.web.StreamResponse:
        if request.resource is not None:
            operator = request.headers.get("Authorization") == f"Bearer {OPERATOR_TOKEN}"
            if operator and request.resource.plural:  # not API discovery (/api/v1, /apis/…)
                self.operator_access.append(access_of(request))
            if request.action == kmocklib.action.CREATE:
                errors = _create_errors(request, crd_rules=self.crd_rules)
                if errors:
                    if operator:  # the tests' own bad objects are not the operator's fault
                        self.refused.extend(errors)
                    raise kmocklib.KubernetesError(
                        status=422, reason="Invalid", message="; ".join(errors)
                    )
        return await super()._handle(request)


def access_of(request: kmocklib.Request) -> Access:
    assert request.resource is not None and request.action is not None
    resource = request.resource.plural or ""
    if request.subresource:
        resource += f"/{request.subresource}"
    verb = _VERBS.get(request.action.name)
    if verb is None:  # UPDATE: PATCH or PUT
        verb = "patch" if request.method.name == "PATCH" else "update"
    return Access(request.resource.group or "", resource, verb, request.namespace, request.name)


def _create_errors(request: kmocklib.Request, *, crd_rules: bool) -> list[str]:
    obj = request.data if isinstance(request.data, dict) else {}
    meta = obj.get("metadata") or {}
    errors: list[str] = []
    if request.namespace and meta.get("namespace") not in (None, request.namespace):
        errors.append(
            "the namespace of the provided object does not match the namespace sent on the "
            f"request ({meta.get('namespace')!r} vs {request.namespace!r})"
        )
    group = obj.get("apiVersion", "").rpartition("/")[0]
    if "." not in group:  # a built-in kind: kubernetes-validate has its schema
        try:
            kubernetes_validate.validate(obj, KUBE_VERSION, strict=True)
        except kubernetes_validate.ValidationError as exc:
            errors.append(f"{obj.get('kind')}: {exc.message}")
    if obj.get("kind") == "Event":
        errors.extend(event_errors(obj))
    if obj.get("kind") == "ModelPreset" and crd_rules:
        errors.extend(crd_errors(obj))
    return errors
