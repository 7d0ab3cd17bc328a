"""Which agents are this one's peers, from the agents' headless Service's EndpointSlices.

Pure: the I/O layer (``api/peer_discovery.py``) lists the slices labelled
``kubernetes.io/service-name=<service>``, then watches them from the list's resourceVersion,
and hands every answer to a :class:`SliceView`; the view says whether to go on watching or to
list again, and :meth:`SliceView.peers` is the peer set that follows.

An endpoint becomes a peer when it is serving and not terminating. ``ready`` would not do: the
chart's headless Service publishes not-ready addresses (metrics and status reach an agent that
is starting), and the EndpointSlice controller then sets ``ready`` true for every pod; it sets
``serving`` from the pod's readiness whatever the Service says (a nil ``serving`` defers to
``ready``, a nil ``ready`` means ready: discovery.k8s.io/v1's documented defaults). This agent
is left out by its pod name (the endpoint's ``targetRef``) or its pod IP (the downward API's
``POD_NAME`` / ``POD_IP``). A dual-stack Service has one slice per address family for the same
pods: each pod is one peer, at its IPv4 address when it has one.

Only slices the EndpointSlice controller manages count (``MANAGED_BY``, in the selector and on
each object): anyone who may create an EndpointSlice in the namespace could otherwise label a
hand-made one and point the agents, with their API key, at an address of their choosing. An
answer of an unexpected shape (a list, null, endpoints that are not objects) is left out with
one line saying what it was, never a crash: the watch must outlive any object it is sent.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum
from typing import Any

SERVICE_LABEL = "kubernetes.io/service-name"
MANAGED_BY_LABEL = "endpointslice.kubernetes.io/managed-by"
MANAGED_BY = "endpointslice-controller.k8s.io"  # the controller that follows the Service's pods
PORT_NAME = "http"  # the chart's name for the agent's port


@dataclass(frozen=True, slots=True)
class Me:
    """This agent, as its EndpointSlices would name it."""

    pod_name: str | None = None
    pod_ip: str | None = None


class Step(Enum):
    WATCH = "watch"  # go on (or reconnect the watch from ``resource_version``)
    RELIST = "relist"  # the watch cannot resume: list again


@dataclass(frozen=True, slots=True)
class Endpoint:
    pod: str  # the pod's name, else its address (an endpoint without a targetRef)
    family: str  # IPv4 or IPv6
    address: str
    port: int


class SliceView:
    """The service's EndpointSlices as last listed and watched, by slice name."""

    def __init__(self, me: Me, scheme: str = "http") -> None:
        self._me = me
        self._scheme = scheme
        self._slices: dict[str, tuple[Endpoint, ...]] = {}
        self.resource_version: str | None = None
        self.skipped: list[str] = []  # why a slice was left out, once per change (for the log)

    def listed(self, body: Any) -> None:
        """A list's answer: it replaces everything known (slices gone meanwhile disappear).
        ValueError for an answer that is not a list of slices (nothing known changes)."""
        if not isinstance(body, Mapping) or not isinstance(body.get("items"), list | None):
            raise ValueError(f"the list answer is not an EndpointSliceList: {_shape(body)}")
        self.skipped = []
        self._slices = {}
        for item in body.get("items") or ():
            self._put(item)
        self.resource_version = _version(body)

    def event(self, event: Any) -> Step:
        """One watch event: ADDED/MODIFIED replace a slice, DELETED drops it, BOOKMARK only
        moves the resourceVersion on; an ERROR (410 Gone above all) means list again."""
        self.skipped = []
        obj = event.get("object") if isinstance(event, Mapping) else None
        if not isinstance(obj, Mapping):
            # Not an event the watch protocol sends: start over.
            self.skipped.append(f"watch event {_shape(event)}: not a watch event")
            return Step.RELIST
        kind = event.get("type")
        if kind == "ERROR":
            # A Status object; 410: the resourceVersion is older than the apiserver keeps.
            # Any other error leaves nothing to resume from either.
            self.resource_version = None
            return Step.RELIST
        if kind in ("ADDED", "MODIFIED"):
            self._put(obj)
        elif kind == "DELETED":
            self._slices.pop(_name(obj), None)
        elif kind != "BOOKMARK":
            return Step.RELIST
        self.resource_version = _version(obj) or self.resource_version
        return Step.WATCH

    def peers(self) -> tuple[str, ...]:
        """The peers' base URLs, sorted (the ranking breaks ties by order: keep it stable)."""
        by_pod: dict[str, Endpoint] = {}
        for endpoints in self._slices.values():
            for ep in endpoints:
                seen = by_pod.get(ep.pod)
                if seen is None or (seen.family != "IPv4" and ep.family == "IPv4"):
                    by_pod[ep.pod] = ep
        return tuple(sorted(self._url(ep) for ep in by_pod.values()))

    def _url(self, ep: Endpoint) -> str:
        host = f"[{ep.address}]" if ep.family == "IPv6" else ep.address
        return f"{self._scheme}://{host}:{ep.port}"

    def _put(self, item: Any) -> None:
        if not isinstance(item, Mapping):
            self.skipped.append(f"list item {_shape(item)}: not an EndpointSlice")
            return
        name = _name(item)
        self._slices.pop(name, None)
        family = item.get("addressType")
        port = _port(item.get("ports"))
        endpoints = item.get("endpoints") or []
        why = None
        if _label(item, MANAGED_BY_LABEL) != MANAGED_BY:
            why = f"not managed by {MANAGED_BY} (a hand-made slice)"
        elif family not in ("IPv4", "IPv6"):
            why = f"addressType {family}"
        elif port is None:
            why = "no port named http"
        elif not isinstance(endpoints, list) or not all(map(_well_formed, endpoints)):
            why = f"endpoints of an unexpected shape: {_shape(endpoints)}"
        if why is not None:
            self.skipped.append(f"EndpointSlice {name}: {why}")
            return
        assert port is not None and isinstance(family, str)
        self._slices[name] = tuple(
            Endpoint(pod=_pod(ep) or address, family=family, address=address, port=port)
            for ep in endpoints
            if _usable(ep) and not self._is_me(ep)
            for address in (ep.get("addresses") or ())[:1]  # the API: others are ignored
        )

    def _is_me(self, ep: Mapping[str, Any]) -> bool:
        pod = _pod(ep)
        if self._me.pod_name is not None and pod == self._me.pod_name:
            return True
        return self._me.pod_ip is not None and self._me.pod_ip in (ep.get("addresses") or ())


def _well_formed(ep: Any) -> bool:
    """An endpoint whose parts have the API's types (absent parts are fine)."""
    if not isinstance(ep, Mapping):
        return False
    addresses, conditions, ref = ep.get("addresses"), ep.get("conditions"), ep.get("targetRef")
    return (
        (
            addresses is None
            or (isinstance(addresses, list) and all(isinstance(a, str) for a in addresses))
        )
        and isinstance(conditions, Mapping | None)
        and isinstance(ref, Mapping | None)
    )


def _usable(ep: Mapping[str, Any]) -> bool:
    conditions = ep.get("conditions") or {}
    if conditions.get("terminating") is True:
        return False
    serving = conditions.get("serving")
    return bool(conditions.get("ready", True) if serving is None else serving)


def _pod(ep: Mapping[str, Any]) -> str | None:
    ref = ep.get("targetRef") or {}
    return str(ref["name"]) if ref.get("kind") == "Pod" and ref.get("name") else None


def _port(ports: Any) -> int | None:
    """The agent's port: the one named ``http``, else the only one (a nil port means every
    port, of no use for a URL)."""
    if not isinstance(ports, list):
        return None
    given = [p for p in ports if isinstance(p, Mapping) and isinstance(p.get("port"), int)]
    named = [p for p in given if p.get("name") == PORT_NAME]
    chosen = named or (given if len(given) == 1 else [])
    return int(chosen[0]["port"]) if chosen else None


def _metadata(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    metadata = obj.get("metadata")
    return metadata if isinstance(metadata, Mapping) else {}


def _name(obj: Mapping[str, Any]) -> str:
    return str(_metadata(obj).get("name") or "")


def _label(obj: Mapping[str, Any], key: str) -> Any:
    labels = _metadata(obj).get("labels")
    return labels.get(key) if isinstance(labels, Mapping) else None


def _version(obj: Mapping[str, Any]) -> str | None:
    version = _metadata(obj).get("resourceVersion")
    return str(version) if version else None


def _shape(value: Any) -> str:
    """What an unexpected value was, short enough for one log line."""
    text = repr(value)
    return f"{type(value).__name__} {text[:80]}{'…' if len(text) > 80 else ''}"
