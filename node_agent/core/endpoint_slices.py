"""Which agents are this one's peers, from the agents' headless Service's EndpointSlices.

Pure: the I/O layer (``router/peer_discovery.py``) lists the slices labelled
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
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum
from typing import Any

SERVICE_LABEL = "kubernetes.io/service-name"
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

    def listed(self, body: Mapping[str, Any]) -> None:
        """A list's answer: it replaces everything known (slices gone meanwhile disappear)."""
        self.skipped = []
        self._slices = {}
        for item in body.get("items") or ():
            self._put(item)
        self.resource_version = _version(body)

    def event(self, event: Mapping[str, Any]) -> Step:
        """One watch event: ADDED/MODIFIED replace a slice, DELETED drops it, BOOKMARK only
        moves the resourceVersion on; an ERROR (410 Gone above all) means list again."""
        self.skipped = []
        kind = event.get("type")
        obj = event.get("object")
        if not isinstance(obj, Mapping):
            return Step.RELIST  # not an event the watch protocol sends: start over
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

    def _put(self, item: Mapping[str, Any]) -> None:
        name = _name(item)
        family = item.get("addressType")
        port = _port(item.get("ports") or ())
        if family not in ("IPv4", "IPv6") or port is None:
            self._slices.pop(name, None)
            why = f"addressType {family}" if port is not None else "no port named http"
            self.skipped.append(f"EndpointSlice {name}: {why}")
            return
        self._slices[name] = tuple(
            Endpoint(pod=_pod(ep) or address, family=family, address=address, port=port)
            for ep in item.get("endpoints") or ()
            if _usable(ep) and not self._is_me(ep)
            for address in (ep.get("addresses") or ())[:1]  # the API: others are ignored
        )

    def _is_me(self, ep: Mapping[str, Any]) -> bool:
        pod = _pod(ep)
        if self._me.pod_name is not None and pod == self._me.pod_name:
            return True
        return self._me.pod_ip is not None and self._me.pod_ip in (ep.get("addresses") or ())


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
    given = [p for p in ports if isinstance(p, Mapping) and isinstance(p.get("port"), int)]
    named = [p for p in given if p.get("name") == PORT_NAME]
    chosen = named or (given if len(given) == 1 else [])
    return int(chosen[0]["port"]) if chosen else None


def _name(obj: Mapping[str, Any]) -> str:
    return str((obj.get("metadata") or {}).get("name") or "")


def _version(obj: Mapping[str, Any]) -> str | None:
    version = (obj.get("metadata") or {}).get("resourceVersion")
    return str(version) if version else None
