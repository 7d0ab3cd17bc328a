"""The operator's one loop: read the indexes, poll the agents, write what differs.

kopf's handlers only keep indexes and wake this loop; every write (the ConfigMap, pod labels,
Services, ModelPreset status, Events) happens here, in one task, so there is one writer per
object and no two handlers race on the same ConfigMap. A pass computes the whole desired state
from snapshots (render.py, status.py are pure) and writes only the differences, so passes are
idempotent and a failed write is simply retried by the next pass.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import logging
import re
import secrets
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import aiohttp

from .agents import AgentPod, AgentTls, AgentUrl, poll_agents
from .kube import Cluster, KubeError, ns_path, preset_status_path
from .relist import MAX_PAGES, PAGE, Listing, page_items, resource_version, vanished
from .render import CONFIGMAP_LIMIT, Rendering, configmap_patch, configmap_size, render
from .status import AgentReport, compute_status, needs_write, transitions

log = logging.getLogger("corral.operator")

GROUP, VERSION = "corral.dev", "v1alpha1"
PRESET_LABEL_PREFIX = "preset.corral.dev/"
MANAGED_BY = {"app.kubernetes.io/managed-by": "corral-operator"}
PRESET_NAME_LABEL = "corral.dev/modelpreset"
# An Event about a cluster-scoped object (a ModelPreset) must live in `default`: the apiserver
# refuses one whose namespace differs from its involvedObject's ("" here) unless it is default.
EVENTS_NAMESPACE = "default"
_LABEL_KEY = re.compile(r"^([a-z0-9.-]{1,253}/)?[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$")
_LABEL_VALUE = re.compile(r"^([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?$")


def preset_label(name: str) -> str:
    """The agent pod label key for a preset. ModelPreset names are DNS-1035 labels (≤ 63, CRD
    rule), which is exactly what a label key's name part accepts."""
    return PRESET_LABEL_PREFIX + name


def parse_selector(text: str) -> dict[str, str]:
    """``a=b,c=d`` → {a: b, c: d}. Equality only: it also becomes the Services' selector."""
    out: dict[str, str] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        key, eq, value = (s.strip() for s in part.partition("="))
        if not eq or not _LABEL_KEY.match(key) or not _LABEL_VALUE.match(value):
            raise ValueError(f"agent selector {part!r}: only label=value terms are supported")
        out[key] = value
    return out


@dataclass(frozen=True)
class Config:
    namespace: str = "default"
    configmap: str = "corral-presets"
    agent_selector: Mapping[str, str] = field(
        default_factory=lambda: {
            "app.kubernetes.io/name": "corral",
            "app.kubernetes.io/component": "agent",
        }
    )
    agent_port: int = 8080
    poll_interval: float = 10.0
    poll_timeout: float = 3.0
    debounce: float = 0.2  # coalesce a burst of watch events into one pass
    verbose: bool = False
    # The agents' API key (they guard GET /models with it); never shown in a repr or a log.
    agent_api_key: str | None = field(default=None, repr=False)
    # The agents serve HTTPS (--agent-ca-file): how their certificates are checked.
    agent_tls: AgentTls | None = field(default=None, repr=False)
    liveness: str | None = None  # kopf's liveness endpoint URL
    # Seconds between the reconciler's own listings, which drop what vanished while no watch
    # saw it go (relist.py).
    relist_interval: float = 60.0
    # Post Events about ModelPresets (in namespace `default`, the only one the apiserver takes
    # them in for a cluster-scoped object): off where the operator may not write there.
    events: bool = True

    @property
    def stale_after(self) -> dt.timedelta:
        return dt.timedelta(seconds=max(3 * self.poll_interval, 3 * self.poll_timeout))


class Store(Protocol):
    """A kopf index: key → the values indexed under it."""

    def __getitem__(self, key: Any) -> Iterable[Any]: ...
    def __iter__(self) -> Any: ...


@dataclass
class Indexes:
    presets: Store  # name → ModelPreset object (plain dict)
    nodes: Store  # name → labels
    agents: Store  # pod name → AgentPod
    services: Store  # name → Service object (ours only)
    configmaps: Store  # name → data


def _values(store: Store) -> list[Any]:
    out: list[Any] = []
    for key in list(store):
        try:
            out.extend(store[key])
        except KeyError:  # removed between listing and reading
            continue
    return out


def _items(store: Store, key: Any) -> list[Any]:
    try:
        return list(store[key])
    except KeyError:  # removed between listing and reading
        return []


def _name_of(value: Any) -> str:
    if isinstance(value, AgentPod):
        return value.name
    return str(value["metadata"]["name"])


def _version_of(value: Any) -> str | None:
    if isinstance(value, AgentPod):
        return value.resource_version
    return resource_version(value) if isinstance(value, Mapping) else None


def _first(store: Store, key: str) -> Any | None:
    try:
        return next(iter(store[key]), None)
    except KeyError:
        return None


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


class Reconciler:
    def __init__(
        self,
        config: Config,
        cluster: Cluster,
        session: aiohttp.ClientSession,
        agent_url: AgentUrl,
        clock: Callable[[], dt.datetime] = _now,
    ) -> None:
        self.config = config
        self.cluster = cluster
        self.session = session
        self.agent_url = agent_url
        self.clock = clock
        self.reports: dict[str, AgentReport] = {}
        self._indexes: Indexes | None = None
        self._armed = asyncio.Event()
        self._wake = asyncio.Event()
        self._last_poll: dt.datetime | None = None
        # preset name → why its Service could not be created (a Service of that name exists
        # that is not ours); recomputed by every pass, so it clears once the name is free.
        self.service_conflicts: dict[str, str] = {}
        # Why the last pass could not write the presets ConfigMap (too large), if it could not.
        self.configmap_problem: str | None = None
        self.passes = 0
        # kind → the (name, resourceVersion) index entries the last listing showed are gone.
        self._gone: dict[str, frozenset[tuple[str, str | None]]] = {}
        self._last_relist: float | None = None

    # --- called from kopf handlers -------------------------------------------------------
    def attach(self, indexes: Indexes) -> None:
        self._indexes = indexes

    def wake(self) -> None:
        """A watched object changed. kopf runs event handlers only once every index has been
        filled from its initial listing, so the first wake also means "safe to write": before
        it, an empty index would look like "all presets deleted" and wipe the ConfigMap."""
        self._armed.set()
        self._wake.set()

    # --- the loop -------------------------------------------------------------------------
    async def run(self) -> None:
        await self._armed.wait()
        while True:
            await asyncio.sleep(self.config.debounce)
            self._wake.clear()
            try:
                loop_now = asyncio.get_running_loop().time()
                if self._last_relist is None or (
                    loop_now - self._last_relist >= self.config.relist_interval
                ):
                    self._last_relist = loop_now
                    await self.relist()
                await self.reconcile_once()
            except asyncio.CancelledError:
                raise
            except Exception:  # task boundary: log, and let the next pass retry
                log.exception("reconcile pass failed")
            delay = self.config.poll_interval
            if self._last_poll is not None:
                since = (self.clock() - self._last_poll).total_seconds()
                delay = max(0.0, self.config.poll_interval - since)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), timeout=delay)

    # --- what vanished while no watch saw it go (relist.py) ---------------------------------
    def _listings(self) -> dict[str, tuple[str, dict[str, str]]]:
        cfg = self.config
        selector = ",".join(f"{k}={v}" for k, v in sorted(cfg.agent_selector.items()))
        managed = ",".join(f"{k}={v}" for k, v in sorted(MANAGED_BY.items()))
        return {
            "presets": (f"/apis/{GROUP}/{VERSION}/modelpresets", {}),
            "agents": (ns_path(cfg.namespace, "pods"), {"labelSelector": selector}),
            "services": (ns_path(cfg.namespace, "services"), {"labelSelector": managed}),
        }

    async def _list(self, path: str, params: Mapping[str, str]) -> Listing:
        names: set[str] = set()
        version: str | None = None
        token: str | None = None
        for _ in range(MAX_PAGES):
            page = {**params, "limit": str(PAGE), **({"continue": token} if token else {})}
            found, rv, token = page_items(await self.cluster.list_metadata(path, page))
            names.update(found)
            version = version or rv  # the first page's: the listing's snapshot
            if token is None:
                return Listing(frozenset(names), version)
        raise ValueError(f"listing {path} has more than {MAX_PAGES} pages")

    async def relist(self) -> None:
        """List each indexed kind; remember which index entries that shows are gone."""
        idx = self._indexes
        if idx is None:
            return
        stores: dict[str, Store] = {
            "presets": idx.presets,
            "agents": idx.agents,
            "services": idx.services,
        }
        for kind, (path, params) in self._listings().items():
            # The index is read before the listing: an entry learnt in between is newer than
            # the listing and kept.
            entries = [
                (name, _version_of(v))
                for name in list(stores[kind])
                for v in _items(stores[kind], name)
            ]
            try:
                listing = await self._list(path, params)
            except (KubeError, aiohttp.ClientError, TimeoutError, ValueError) as exc:
                log.warning("listing %s failed: %s", kind, exc)
                continue
            gone = vanished(entries, listing)
            if gone and gone != self._gone.get(kind):
                log.info(
                    "%s gone while no watch saw it: %s", kind, ", ".join(sorted(n for n, _ in gone))
                )
            self._gone[kind] = gone

    def _forget(self, obj: Mapping[str, Any]) -> None:
        """The apiserver says this preset is gone (404) while its index entry lives on (its
        deletion fell in a watch gap): drop it now, not at the next listing. Until then each
        pass wrote its status again and made its Service again, which the garbage collector
        removed again (a loop of passes every 0.2 s; 7 failed writes in 2 s in a CI run)."""
        entry = (_name_of(obj), _version_of(obj))
        self._gone["presets"] = self._gone.get("presets", frozenset()) | {entry}
        log.info("ModelPreset %s is gone (404): dropped", entry[0])
        self._wake.set()  # its Service goes in the next pass

    def _live(self, kind: str, store: Store) -> list[Any]:
        gone = self._gone.get(kind, frozenset())
        return [v for v in _values(store) if (_name_of(v), _version_of(v)) not in gone]

    async def reconcile_once(self) -> None:
        idx = self._indexes
        if idx is None:
            return
        self.passes += 1
        now = self.clock()
        presets = sorted(self._live("presets", idx.presets), key=lambda o: o["metadata"]["name"])
        node_labels: dict[str, Mapping[str, str]] = {}
        for name in list(idx.nodes):
            labels = _first(idx.nodes, name)
            if labels is not None:
                node_labels[name] = labels
        pods: list[AgentPod] = sorted(self._live("agents", idx.agents), key=lambda p: p.name)
        if self._last_poll is None or (
            (now - self._last_poll).total_seconds() >= self.config.poll_interval
        ):
            self.reports = await poll_agents(
                self.session,
                pods,
                self.agent_url,
                self.reports,
                now,
                self.config.poll_timeout,
                self.config.agent_api_key,
                self.config.agent_tls,
            )
            self._last_poll = now
        agent_nodes = {
            p.node: node_labels[p.node]
            for p in pods
            if p.node and not p.deleting and p.node in node_labels
        }
        rendering = render(presets, agent_nodes)
        await self._write_configmap(rendering)
        await self._write_pod_labels(pods, rendering)
        await self._write_services(presets)
        await self._write_statuses(presets, rendering, now)

    # --- writers --------------------------------------------------------------------------
    async def _guard(self, what: str, coro: Any) -> None:
        try:
            await coro
        except KubeError as exc:
            log.warning("%s failed: %s", what, exc)

    async def _write_configmap(self, rendering: Rendering) -> None:
        assert self._indexes is not None
        cfg = self.config
        current = _first(self._indexes.configmaps, cfg.configmap)
        desired = rendering.configmap_data()
        path = ns_path(cfg.namespace, "configmaps", cfg.configmap)
        size = configmap_size(desired)
        if size > CONFIGMAP_LIMIT:
            # The apiserver would refuse the write: keep what the nodes have, and say why in
            # every preset's status (Degraded, with an Event) instead of a log line only.
            problem = (
                f"the presets ConfigMap {cfg.namespace}/{cfg.configmap} would be {size} bytes, "
                f"over the {CONFIGMAP_LIMIT}-byte limit of a ConfigMap "
                f"({len(rendering.node_sets)} nodes, {len(rendering.files)} presets): it is not "
                "updated; shorten the presets (args, aliases) or run fewer of them"
            )
            if problem != self.configmap_problem:
                log.warning("%s", problem)
            self.configmap_problem = problem
            return
        self.configmap_problem = None
        if current is None:
            body = {
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": {"name": cfg.configmap, "namespace": cfg.namespace},
                "data": desired,
            }
            try:
                await self.cluster.create(ns_path(cfg.namespace, "configmaps"), body)
                log.info(
                    "created ConfigMap %s with %d preset(s)", cfg.configmap, len(rendering.files)
                )
                return
            except KubeError as exc:
                if exc.status != 409:  # exists but not indexed yet: fall through to patch
                    log.warning("creating ConfigMap %s failed: %s", cfg.configmap, exc)
                    return
            current = {}
        patch = configmap_patch(current, desired)
        if patch:
            log.info(
                "ConfigMap %s: %d node(s), %d preset(s), %d key(s) changed",
                cfg.configmap,
                len(rendering.node_sets),
                len(rendering.files),
                len(patch),
            )
            await self._guard("patching the ConfigMap", self.cluster.patch(path, {"data": patch}))

    async def _write_pod_labels(self, pods: list[AgentPod], rendering: Rendering) -> None:
        """Label each agent pod with the presets it serves: offered in its node's file *and*
        listed by its agent — so a Service never routes to an agent that would answer
        "model not found" because the kubelet has not delivered the new file yet."""
        for pod in pods:
            if not pod.node or pod.deleting:
                continue
            report = self.reports.get(pod.node)
            if report is None or report.last_seen is None:
                # Never heard from this agent (a fresh operator whose first poll failed, or a
                # pod without an IP yet): what it serves is unknown, so its labels stay as the
                # previous operator left them rather than taking its Services' traffic away.
                continue
            listed = report.models
            want = {
                preset_label(name): "true"
                for name, preset in rendering.presets.items()
                if pod.node in rendering.offered(name) and preset.model_name in listed
            }
            have = {k: v for k, v in pod.labels.items() if k.startswith(PRESET_LABEL_PREFIX)}
            if want == have:
                continue
            patch: dict[str, str | None] = dict(want)
            patch.update({k: None for k in have if k not in want})
            log.info("pod %s: preset labels %s", pod.name, sorted(want))
            await self._guard(
                f"labelling pod {pod.name}",
                self.cluster.patch(
                    ns_path(self.config.namespace, "pods", pod.name),
                    {"metadata": {"labels": patch}},
                ),
            )

    def desired_service(self, obj: Mapping[str, Any]) -> dict[str, Any]:
        meta = obj["metadata"]
        name = meta["name"]
        labels = {**MANAGED_BY, PRESET_NAME_LABEL: name}
        svc_meta: dict[str, Any] = {
            "name": name,
            "namespace": self.config.namespace,
            "labels": labels,
        }
        if meta.get("uid"):
            # A namespaced object may be owned by a cluster-scoped one, so the garbage collector
            # removes the Service with its ModelPreset even while the operator is down. No
            # blockOwnerDeletion: it would need `update` on modelpresets/finalizers.
            svc_meta["ownerReferences"] = [
                {
                    "apiVersion": f"{GROUP}/{VERSION}",
                    "kind": "ModelPreset",
                    "name": name,
                    "uid": meta["uid"],
                    "controller": True,
                }
            ]
        return {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": svc_meta,
            "spec": {
                "type": "ClusterIP",
                "selector": {**self.config.agent_selector, preset_label(name): "true"},
                "ports": [self._service_port()],
            },
        }

    def _service_port(self) -> dict[str, Any]:
        """A preset Service's port: 443, named and declared https, when the agents serve it
        (a mesh or a gateway reads the name and appProtocol), else 80."""
        if self.config.agent_tls is None:
            return {
                "name": "http",
                "port": 80,
                "targetPort": self.config.agent_port,
                "protocol": "TCP",
            }
        return {
            "name": "https",
            "port": 443,
            "targetPort": self.config.agent_port,
            "protocol": "TCP",
            "appProtocol": "https",
        }

    async def _write_services(self, presets: list[dict[str, Any]]) -> None:
        assert self._indexes is not None
        ns = self.config.namespace
        wanted = {o["metadata"]["name"]: self.desired_service(o) for o in presets}
        services = {
            s["metadata"]["name"]: s for s in self._live("services", self._indexes.services)
        }
        conflicts: dict[str, str] = {}
        for name, want in wanted.items():
            have = services.get(name)
            if have is None:
                try:
                    await self.cluster.create(ns_path(ns, "services"), want)
                    log.info("created Service %s", name)
                except KubeError as exc:
                    if exc.status == 409:
                        # Not in our index, so not ours (the chart's, a user's): never adopt
                        # it — patching its selector would hijack its traffic, and our owner
                        # reference would let the garbage collector delete it with the preset.
                        conflicts[name] = (
                            f"Service {ns}/{name} exists and was not created by the corral "
                            "operator: it is left alone; rename the ModelPreset or delete that "
                            "Service"
                        )
                        if name not in self.service_conflicts:
                            log.warning("%s", conflicts[name])
                    else:
                        log.warning("creating Service %s failed: %s", name, exc)
                continue
            patch = _service_patch(have, want)
            if patch:
                log.info("updating Service %s", name)
                await self._guard(
                    f"patching Service {name}",
                    self.cluster.patch(ns_path(ns, "services", name), patch),
                )
        for name in services:
            if name not in wanted:
                log.info("deleting Service %s (its ModelPreset is gone)", name)
                await self._guard(
                    f"deleting Service {name}", self.cluster.delete(ns_path(ns, "services", name))
                )
        self.service_conflicts = conflicts

    async def _write_statuses(
        self, presets: list[dict[str, Any]], rendering: Rendering, now: dt.datetime
    ) -> None:
        for obj in presets:
            meta = obj["metadata"]
            name = meta["name"]
            preset = rendering.presets.get(name)
            old = obj.get("status") or None
            new = compute_status(
                model_name=preset.model_name
                if preset
                else (obj.get("spec") or {}).get("modelName") or name,
                generation=int(meta.get("generation") or 0),
                matched=rendering.matched.get(name, ()),
                reports=self.reports,
                previous=old,
                now=now,
                stale_after=self.config.stale_after,
                conflicts=rendering.conflicts.get(name),
                invalid=rendering.invalid.get(name),
                load_on_startup=bool(preset and preset.lifecycle.load_on_startup),
                preset_hash=rendering.hashes.get(name),
                problems=[
                    *(
                        [("ServiceConflict", self.service_conflicts[name])]
                        if name in self.service_conflicts
                        else []
                    ),
                    *(
                        [("ConfigMapTooLarge", self.configmap_problem)]
                        if self.configmap_problem
                        else []
                    ),
                ],
            )
            if not needs_write(old, new):
                continue
            try:
                await self.cluster.patch(preset_status_path(name), {"status": new})
            except KubeError as exc:
                log.warning("writing the status of ModelPreset %s failed: %s", name, exc)
                if exc.object_missing(name):
                    self._forget(obj)
                continue
            for event in transitions(old, new) if self.config.events else ():
                await self._guard(f"posting an event for {name}", self._post_event(obj, event, now))

    async def _post_event(self, obj: Mapping[str, Any], event: Any, now: dt.datetime) -> None:
        meta = obj["metadata"]
        stamp = now.strftime("%Y-%m-%dT%H:%M:%SZ")
        body = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {
                # Explicit unique names (not generateName): simpler to emulate and to grep.
                "name": f"{meta['name']}.{secrets.token_hex(8)}",
                "namespace": EVENTS_NAMESPACE,
            },
            # No involvedObject.namespace: the ModelPreset is cluster-scoped.
            "involvedObject": {
                "apiVersion": f"{GROUP}/{VERSION}",
                "kind": "ModelPreset",
                "name": meta["name"],
                "uid": meta.get("uid", ""),
            },
            "type": event.type,
            "reason": event.reason,
            "message": event.message[:1024],
            "source": {"component": "corral-operator"},
            "reportingComponent": "corral.dev/operator",
            "firstTimestamp": stamp,
            "lastTimestamp": stamp,
            "count": 1,
        }
        log.info(
            "event %s %s on ModelPreset %s: %s",
            event.type,
            event.reason,
            meta["name"],
            event.message,
        )
        await self.cluster.create(ns_path(EVENTS_NAMESPACE, "events"), body)


def _service_patch(have: Mapping[str, Any], want: Mapping[str, Any]) -> dict[str, Any]:
    """A merge patch for the fields we own (the apiserver fills in clusterIP & co.)."""
    patch: dict[str, Any] = {}
    hmeta, wmeta = have.get("metadata") or {}, want["metadata"]
    hlabels = hmeta.get("labels") or {}
    if any(hlabels.get(k) != v for k, v in wmeta["labels"].items()):
        patch.setdefault("metadata", {})["labels"] = wmeta["labels"]
    if "ownerReferences" in wmeta and hmeta.get("ownerReferences") != wmeta["ownerReferences"]:
        patch.setdefault("metadata", {})["ownerReferences"] = wmeta["ownerReferences"]
    hspec, wspec = have.get("spec") or {}, want["spec"]
    hsel = hspec.get("selector") or {}
    if hsel != wspec["selector"]:
        sel: dict[str, str | None] = dict(wspec["selector"])
        sel.update({k: None for k in hsel if k not in wspec["selector"]})
        patch.setdefault("spec", {})["selector"] = sel
    if hspec.get("ports") != wspec["ports"]:
        patch.setdefault("spec", {})["ports"] = wspec["ports"]
    return patch
