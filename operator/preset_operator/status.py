"""ModelPreset.status from placement and what the agents report (pure: ``now`` is an argument).

The operator is the only writer of the status. Every matched node is counted by state
(``nodeCounts``); a few (those that need a look first) are detailed: the model's state on that
node, its memory figures, the last error. An agent not seen for ``stale_after`` makes its nodes
``Unknown`` (never a stale ``Loaded``). Two conditions in the
standard shape (type, status, observedGeneration, lastTransitionTime, reason, message):

- ``Ready``: every matched node offers the model, in the preset's current version (the agent
  reports the hash of the preset section it serves), and can serve it now (loaded or sleeping;
  or unloaded-and-healthy for a model loaded on first request). ``observedGeneration`` moves to
  the preset's generation once no node is still to take it up (``_TAKING_UP``); until then the
  status keeps the generation it last confirmed.
- ``Degraded``: something needs a human: a node failed to run it, an agent is not answering, its
  name collides with another preset on a node, the spec cannot be rendered, a Service of its
  name exists that the operator did not create (it is never adopted), or the presets would not
  fit in the ConfigMap.
"""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from node_agent.models_schema import RefusedPreset, dump, parse_entries
from node_agent.redact import redact

log = logging.getLogger("corral.operator")

# Agent (llama.cpp) state value → the state shown in the status.
_STATES = {
    "loaded": "Loaded",
    "loading": "Loading",
    "sleeping": "Sleeping",
    "downloading": "Downloading",
    "unloaded": "Unloaded",
}
_SERVING = {"Loaded", "Sleeping"}
_BAD = {"Failed", "Unknown", "Conflict"}
# Nodes that have not taken up the preset's current version yet. (An agent not seen recently
# cannot say either, but it is Degraded and keeps Ready False: holding observedGeneration for
# it too would show every preset on a lost node as a rollout in progress forever.)
_TAKING_UP = {"Pending", "Outdated"}


def fmt_time(t: dt.datetime) -> str:
    return t.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass(frozen=True)
class ModelReport:
    """One entry of an agent's ``GET /models``."""

    value: str
    failed: bool = False
    exit_code: int | None = None
    memory: Mapping[str, Any] | None = None
    error: str | None = None
    preset_hash: str | None = None  # the version of its preset section the node serves


@dataclass(frozen=True)
class AgentReport:
    """The last thing known about one node's agent."""

    last_seen: dt.datetime | None  # last successful poll
    models: Mapping[str, ModelReport] = field(default_factory=dict)  # by model id
    error: str | None = None  # why the latest poll failed, if it did


def parse_models(body: object) -> dict[str, ModelReport]:
    """An agent's ``GET /models`` body → reports, through the schema the agent builds it from.

    Corral keeps its figures under each entry's ``corral`` key (``corral.memory``, and
    ``corral.error``: the child's own last error line); llama.cpp's router sends neither.
    Malformed entries are skipped, since one odd model must not blank the others' status.
    """
    entries, skipped = parse_entries(body)
    for why in skipped:
        log.warning("agent's GET /models: skipped %s", why)
    out: dict[str, ModelReport] = {}
    for name, entry in entries.items():
        corral = entry.corral
        memory = corral.memory if corral is not None else None
        out[name] = ModelReport(
            value=entry.status.value,
            failed=bool(entry.status.failed),
            exit_code=entry.status.exit_code,
            memory=dump(memory) if memory is not None else None,
            error=corral.error if corral is not None else None,
            preset_hash=corral.preset_hash if corral is not None else None,
        )
    for refusal in _refused(body):
        # A preset the agent refused alone: Failed on this node, with the agent's file:line
        # and reason (its other models are served). A listed model of that name stands only
        # when it is the preset's (its earlier version, kept running): the node's own model
        # of that name is not the ModelPreset's (issue 26, row 10).
        for name in refusal.models:
            listed = entries.get(name)
            if listed is not None and listed.source == "preset":
                continue
            out[name] = ModelReport(
                value="unloaded",
                failed=True,
                error=f"the agent refused this preset: {refusal.origin}: {refusal.reason}",
            )
    return out


def _refused(body: object) -> list[RefusedPreset]:
    raw = body.get("refused") if isinstance(body, dict) else None
    out: list[RefusedPreset] = []
    for item in raw if isinstance(raw, list) else []:
        try:
            out.append(RefusedPreset.model_validate(item))
        except ValidationError as exc:
            log.warning("agent's GET /models: skipped a refused preset: %s", exc.errors()[0]["msg"])
    return out


def node_entry(
    node: str,
    model_name: str,
    report: AgentReport | None,
    previous: Mapping[str, Any] | None,
    conflict: str | None,
    now: dt.datetime,
    stale_after: dt.timedelta,
    preset_hash: str | None = None,
) -> dict[str, Any]:
    """One node's detail. With ``preset_hash`` (the current version's), a node that reports
    another version (or none) is ``Outdated``, whatever its model's state."""
    prev = previous or {}
    # No per-node "last seen" time: it moved on every poll, a heartbeat rewritten into the
    # status of every preset (Kubernetes moved Nodes' heartbeats to Lease objects for that).
    entry: dict[str, Any] = {"name": node}
    last_error = prev.get("lastError")
    if conflict is not None:
        entry["state"] = "Conflict"
        last_error = conflict
    elif report is None or report.last_seen is None or now - report.last_seen > stale_after:
        entry["state"] = "Unknown"
        if report is not None and report.error:
            last_error = report.error
    else:
        model = report.models.get(model_name)
        if model is None:
            entry["state"] = "Pending"  # the agent has not picked up the new file yet
        elif preset_hash is not None and model.preset_hash != preset_hash and not model.failed:
            # It still serves (or offers) an earlier version: the kubelet has not synced the
            # new file yet, or the agent is restarting the child with the new arguments.
            entry["state"] = "Outdated"
        else:
            state = _STATES.get(model.value, "Unknown")
            if model.value == "unloaded" and model.failed:
                state = "Failed"
                last_error = model.error or (
                    f"llama-server exited with code {model.exit_code}"
                    if model.exit_code is not None
                    else "llama-server failed"
                )
            elif model.error:
                last_error = model.error
            entry["state"] = state
            if model.memory is not None:
                entry["memory"] = dict(model.memory)
    if last_error:
        # The agent redacts what it serves; an older agent or a conflict text may not have.
        entry["lastError"] = redact(str(last_error))[:1024]
    return entry


def _condition(
    ctype: str,
    status: bool,
    reason: str,
    message: str,
    generation: int,
    previous: Mapping[str, Any] | None,
    now: dt.datetime,
) -> dict[str, Any]:
    value = "True" if status else "False"
    since = fmt_time(now)
    if previous is not None and previous.get("status") == value:
        since = str(previous.get("lastTransitionTime") or since)
    return {
        "type": ctype,
        "status": value,
        "observedGeneration": generation,
        "lastTransitionTime": since,
        "reason": reason,
        "message": message,
    }


def _count(nodes: Sequence[Mapping[str, Any]], state: str) -> int:
    return sum(1 for n in nodes if n["state"] == state)


# Bounds of what one status carries, whatever the number of nodes: the apiserver refuses a
# condition message over the CRD's maxLength (32768) with a 422, and the status would freeze;
# a status also travels in every watch event of the preset. Every node is counted
# (``nodeCounts``); only the first NODES_SHOWN are detailed, the ones that need a look first.
NODES_SHOWN = 32
NAMES_IN_MESSAGE = 10
ERROR_IN_MESSAGE = 200
MESSAGE_LIMIT = 4096
# Every state a node can be in, and the order nodes are detailed in: those that need a human
# first, then those on their way.
NODE_STATES = (
    "Failed",
    "Conflict",
    "Unknown",
    "Pending",
    "Outdated",
    "Downloading",
    "Loading",
    "Unloaded",
    "Sleeping",
    "Loaded",
)
_ORDER = {state: i for i, state in enumerate(NODE_STATES)}


def _names(nodes: Sequence[Mapping[str, Any]]) -> str:
    """``a, b, c`` for a few nodes, ``a, b, … and 90 more`` past NAMES_IN_MESSAGE."""
    shown = ", ".join(str(n["name"]) for n in nodes[:NAMES_IN_MESSAGE])
    more = len(nodes) - NAMES_IN_MESSAGE
    return f"{shown}, … and {more} more" if more > 0 else shown


def _bounded(message: str) -> str:
    return message if len(message) <= MESSAGE_LIMIT else message[: MESSAGE_LIMIT - 1] + "…"


def _shown(nodes: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    ranked = sorted(nodes, key=lambda n: (_ORDER.get(n["state"], 0), n["name"]))
    return sorted(ranked[:NODES_SHOWN], key=lambda n: n["name"])


def compute_status(
    *,
    model_name: str,
    generation: int,
    matched: Sequence[str],
    reports: Mapping[str, AgentReport],
    previous: Mapping[str, Any] | None,
    now: dt.datetime,
    stale_after: dt.timedelta,
    conflicts: Mapping[str, str] | None = None,
    invalid: str | None = None,
    load_on_startup: bool = False,
    problems: Sequence[tuple[str, str]] = (),
    preset_hash: str | None = None,
) -> dict[str, Any]:
    """The whole status of one preset. ``problems``: (reason, message) of what keeps the
    operator from carrying it out (a foreign Service of its name, a ConfigMap too large), each
    a reason to be Degraded. ``preset_hash``: the hash of its section as rendered now, which
    each node must report before it counts (None: not checked)."""
    prev = previous or {}
    prev_nodes = {n.get("name"): n for n in prev.get("nodes") or [] if isinstance(n, Mapping)}
    prev_conds = {c.get("type"): c for c in prev.get("conditions") or [] if isinstance(c, Mapping)}
    conflicts = conflicts or {}
    nodes = [
        node_entry(
            node,
            model_name,
            reports.get(node),
            prev_nodes.get(node),
            conflicts.get(node),
            now,
            stale_after,
            preset_hash,
        )
        for node in sorted(matched)
    ]
    ok = set(_SERVING) if load_on_startup else _SERVING | {"Unloaded"}
    not_ready = [n for n in nodes if n["state"] not in ok]

    def names(state: str) -> str:
        return _names([n for n in nodes if n["state"] == state])

    if invalid is not None:
        ready = (False, "InvalidSpec", invalid)
        degraded = (True, "InvalidSpec", invalid)
    elif not nodes:
        ready = (False, "NoMatchingNodes", "no node running an agent matches spec.placement")
        degraded = (False, "AsExpected", "no node to serve it on")
    else:
        for state, reason in (
            ("Failed", "NodesFailed"),
            ("Unknown", "AgentsUnknown"),
            ("Conflict", "NameConflict"),
            ("Pending", "Pending"),
            ("Outdated", "Updating"),
            ("Downloading", "Downloading"),
            ("Loading", "Loading"),
            ("Unloaded", "Loading"),
        ):
            count = sum(1 for n in not_ready if n["state"] == state)
            if count:
                ready = (
                    False,
                    reason,
                    f"{state} on {count} of {len(nodes)} node(s): {names(state)}",
                )
                break
        else:
            ready = (True, "AllNodesReady", f"serving on {len(nodes)} node(s)")
        bad = [n for n in nodes if n["state"] in _BAD]
        if bad:
            first = bad[0]
            reason = {"Failed": "NodesFailed", "Unknown": "AgentsUnknown"}.get(
                first["state"], "NameConflict"
            )
            detail = "; ".join(
                f"{n['name']}: {n['state']}"
                + (f" ({n['lastError'][:ERROR_IN_MESSAGE]})" if n.get("lastError") else "")
                for n in bad[:NAMES_IN_MESSAGE]
            )
            if len(bad) > NAMES_IN_MESSAGE:
                detail += f"; … and {len(bad) - NAMES_IN_MESSAGE} more node(s)"
            degraded = (True, reason, _bounded(detail))
        else:
            degraded = (False, "AsExpected", "all matched nodes are healthy")
    if problems and invalid is None:
        messages = [message for _, message in problems]
        detail = "; ".join([*messages, degraded[2]] if degraded[0] else messages)
        degraded = (True, problems[0][0], _bounded(detail))
    # Every state, zeros included: the status is written with a JSON merge patch, which keeps
    # a map's keys that the patch leaves out (a state no node is in any more would stay).
    counts = dict.fromkeys(NODE_STATES, 0)
    for n in nodes:
        counts[n["state"]] = counts.get(n["state"], 0) + 1
    ready = (ready[0], ready[1], _bounded(ready[2]))
    # This generation is observed once no node is still to take it up; until then the status
    # keeps the one it last confirmed (absent for a new preset), so kstatus, Argo CD and Flux
    # see the rollout in progress.
    observed: dict[str, Any] = {"observedGeneration": generation}
    if invalid is None and any(n["state"] in _TAKING_UP for n in nodes):
        confirmed = prev.get("observedGeneration")
        observed = {} if confirmed is None else {"observedGeneration": confirmed}
    return {
        **observed,
        "modelName": model_name,
        "matchedNodes": len(nodes),
        "loadedNodes": _count(nodes, "Loaded"),
        "nodeCounts": dict(sorted(counts.items())),
        "nodes": _shown(nodes),
        "conditions": [
            _condition("Ready", *ready, generation, prev_conds.get("Ready"), now),
            _condition("Degraded", *degraded, generation, prev_conds.get("Degraded"), now),
        ],
    }


def needs_write(old: Mapping[str, Any] | None, new: Mapping[str, Any]) -> bool:
    """Whether ``new`` differs from the stored status: nothing in it moves by itself (no
    per-node heartbeat), so an unchanged world is no PATCH at all."""
    return old is None or dict(old) != dict(new)


@dataclass(frozen=True)
class Transition:
    """A Kubernetes Event to post: only when a condition changes status."""

    type: str  # Normal | Warning
    reason: str
    message: str


def transitions(old: Mapping[str, Any] | None, new: Mapping[str, Any]) -> list[Transition]:
    before = {c.get("type"): c for c in (old or {}).get("conditions") or []}
    out: list[Transition] = []
    for cond in new.get("conditions") or []:
        was = before.get(cond["type"], {}).get("status")
        if was == cond["status"]:
            continue
        if cond["type"] == "Ready":
            if cond["status"] == "True":
                out.append(Transition("Normal", "Ready", cond["message"]))
            elif was == "True":
                message = f"{cond['reason']}: {cond['message']}"
                out.append(Transition("Warning", "NotReady", message))
        elif cond["type"] == "Degraded":
            if cond["status"] == "True":
                out.append(Transition("Warning", cond["reason"], cond["message"]))
            elif was == "True":
                out.append(Transition("Normal", "Recovered", cond["message"]))
    return out
