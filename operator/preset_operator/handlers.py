"""kopf glue: indexes of what the reconciler reads, and event handlers that wake it.

Deliberately no on.create/update/delete handlers, daemons or timers: those make kopf store state
in annotations and add finalizers to the ModelPresets, and the design wants neither (a deleted
preset must go away even while the operator is down). Indexes and event handlers write nothing.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping
from typing import Any

import kopf

from .agents import AgentPod
from .reconcile import GROUP, MANAGED_BY, VERSION, Indexes, Reconciler

LoginFn = Callable[..., Any]


def _plain(body: Mapping[str, Any]) -> dict[str, Any]:
    # kopf bodies are live views over the latest raw object; the index must keep a snapshot.
    return copy.deepcopy(dict(body))


def build_registry(reconciler: Reconciler, login: LoginFn | None = None) -> kopf.OperatorRegistry:
    """A fresh registry (not kopf's global one), so tests can run operators side by side."""
    registry = kopf.OperatorRegistry()
    cfg = reconciler.config
    on_login = kopf.on.login(registry=registry)
    on_login(login if login is not None else kopf.login_via_client)

    def wake(**_: Any) -> None:
        reconciler.wake()

    @kopf.index(GROUP, VERSION, "modelpresets", id="corral_presets", registry=registry)
    def presets_index(name: str, body: kopf.Body, **_: Any) -> dict[str, Any]:
        return {name: _plain(body)}

    @kopf.index("", "v1", "nodes", id="corral_nodes", registry=registry)
    def nodes_index(name: str, labels: Mapping[str, str], **_: Any) -> dict[str, Any]:
        return {name: dict(labels)}

    @kopf.index(
        "", "v1", "pods", id="corral_agents", labels=dict(cfg.agent_selector), registry=registry
    )
    def agents_index(
        name: str,
        labels: Mapping[str, str],
        spec: Mapping[str, Any],
        status: Mapping[str, Any],
        meta: Mapping[str, Any],
        **_: Any,
    ) -> dict[str, Any]:
        return {
            name: AgentPod(
                name=name,
                node=spec.get("nodeName"),
                ip=status.get("podIP"),
                labels=dict(labels),
                deleting=bool(meta.get("deletionTimestamp")),
                resource_version=meta.get("resourceVersion"),
            )
        }

    @kopf.index("", "v1", "services", id="corral_services", labels=MANAGED_BY, registry=registry)
    def services_index(name: str, body: kopf.Body, **_: Any) -> dict[str, Any]:
        return {name: _plain(body)}

    def is_presets_cm(name: str, **_: Any) -> bool:
        return name == cfg.configmap

    @kopf.index(
        "", "v1", "configmaps", id="corral_configmaps", when=is_presets_cm, registry=registry
    )
    def configmaps_index(name: str, body: kopf.Body, **_: Any) -> dict[str, Any]:
        return {name: dict(body.get("data") or {})}

    kopf.on.event(GROUP, VERSION, "modelpresets", registry=registry)(wake)
    kopf.on.event("", "v1", "nodes", registry=registry)(wake)
    kopf.on.event("", "v1", "pods", labels=dict(cfg.agent_selector), registry=registry)(wake)
    kopf.on.event("", "v1", "services", labels=MANAGED_BY, registry=registry)(wake)
    kopf.on.event("", "v1", "configmaps", when=is_presets_cm, registry=registry)(wake)

    @kopf.on.startup(registry=registry)  # type: ignore[arg-type]  # kopf injects indexes by id
    def attach(
        corral_presets: kopf.Index[str, Any],
        corral_nodes: kopf.Index[str, Any],
        corral_agents: kopf.Index[str, Any],
        corral_services: kopf.Index[str, Any],
        corral_configmaps: kopf.Index[str, Any],
        **_: Any,
    ) -> None:
        # The indexes are live views that kopf keeps filled; the reconciler reads them.
        reconciler.attach(
            Indexes(
                presets=corral_presets,
                nodes=corral_nodes,
                agents=corral_agents,
                services=corral_services,
                configmaps=corral_configmaps,
            )
        )

    return registry


def operator_settings() -> kopf.OperatorSettings:
    settings = kopf.OperatorSettings()
    # One replica (the chart's Deployment uses Recreate): no peering objects, no extra RBAC.
    settings.peering.standalone = True
    # Our Events are posted by the reconciler, on transitions only; kopf's own would be noise.
    settings.posting.enabled = False
    # Namespaces and CRDs are known up front: no list/watch on namespaces or CRDs needed.
    settings.scanning.disabled = True
    return settings
