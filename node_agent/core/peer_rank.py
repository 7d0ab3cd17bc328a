"""Where a request for a model is served: here, or one hop away on the peer that has it.

Pure: the router layer's peer view (``api/peers.py``) gathers what every node says of the
model and asks :func:`choose`. The ranking, best first (issue 19 §2):

0. loaded and idle (nothing in flight or queued);
1. loaded and busy (ties by queue depth: in flight + queued);
2. sleeping (its child is up; waking reloads only the weights);
3. loading (its load is already paid for);
4. not loaded, but it fits there without an eviction: a free ``--models-max`` slot, and, where
   that node's memory ledger is on, its ``min`` within the node's free device memory;
5. not loaded, and loading it evicts another model.

Ties go by queue depth, then to this node (no hop), then to the peer given first. Two rules
come before the ranking: a request another agent forwarded is always served here (one hop,
never a loop), and a model loaded or loading here is served here (forwarding a request this
node can already answer only adds a hop).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import IntEnum

# The states ``GET /models`` reports (``models_schema.State``).
LOADED = "loaded"
LOADING = "loading"
SLEEPING = "sleeping"
DOWNLOADING = "downloading"
UNLOADED = "unloaded"
# A model in these states holds one of its node's ``--models-max`` slots.
RESIDENT = frozenset({LOADED, LOADING, SLEEPING, DOWNLOADING})


class Tier(IntEnum):
    LOADED_IDLE = 0
    LOADED_BUSY = 1
    SLEEPING = 2
    LOADING = 3
    FITS = 4
    EVICTS = 5


@dataclass(frozen=True, slots=True)
class Node:
    """What one node (this one: ``peer`` None) says of the requested model."""

    peer: str | None
    state: str  # one of the ``GET /models`` states
    queue: int  # requests in flight or waiting for the model there
    fits: bool  # it could be loaded there without evicting another model


@dataclass(frozen=True, slots=True)
class Choice:
    peer: str | None  # None: serve here
    why: str


def effective_state(state: str, queued: int) -> str:
    """A model not loaded but with requests queued for it is, in effect, loading: it takes its
    node's next slot. (Without this, a burst that arrives before any load has started sees
    every model fit everywhere, and every node loads every model.)"""
    return LOADING if state == UNLOADED and queued > 0 else state


def ranked_state(state: str, queued: int, *, downloading: bool) -> str:
    """A model's state as this node tells others, peers (``GET /peer-view``) and routers
    (``--routing-metrics-port``) alike: downloading while its file is on its way, else
    :func:`effective_state`."""
    return DOWNLOADING if downloading else effective_state(state, queued)


def tier(node: Node) -> Tier:
    if node.state == LOADED:
        return Tier.LOADED_IDLE if node.queue == 0 else Tier.LOADED_BUSY
    if node.state == SLEEPING:
        return Tier.SLEEPING
    if node.state in (LOADING, DOWNLOADING):
        return Tier.LOADING
    return Tier.FITS if node.fits else Tier.EVICTS


def fits(
    states: Sequence[str],
    models_max: int,
    need: Mapping[str, int] | None = None,
    free: Mapping[str, int | None] | None = None,
) -> bool:
    """A node with these model states and ``--models-max`` can load one more without an
    eviction (``models_max`` <= 0: no limit), and the model's ``need`` (its ``min``, bytes per
    device) is within the node's ``free`` bytes per device (what its ledger lets a new load
    use, margin deducted). Memory does not limit where either is unknown (that node's ledger
    is off), nor on a device ``free`` gives as None or does not list (no limit there), as the
    node's own ledger decides."""
    slot = models_max <= 0 or sum(s in RESIDENT for s in states) < models_max
    return slot and memory_fits(need, free)


def memory_fits(need: Mapping[str, int] | None, free: Mapping[str, int | None] | None) -> bool:
    if need is None or free is None:
        return True
    return all(
        bytes_ <= 0 or (room := free.get(device)) is None or bytes_ <= room
        for device, bytes_ in need.items()
    )


def choose(here: Node, peers: Sequence[Node], *, forwarded: bool) -> Choice:
    """Serve here, or forward to the best-ranked peer (``peers``: the reachable ones that list
    the model, in the order they were given)."""
    if forwarded:
        return Choice(None, "forwarded by a peer: served here (one hop)")
    if here.state in (LOADED, LOADING, DOWNLOADING):
        return Choice(None, f"{here.state} here")
    ranked = sorted(
        [(tier(here), here.queue, 0, 0, here)]
        + [(tier(p), p.queue, 1, i, p) for i, p in enumerate(peers)],
        key=lambda row: row[:4],
    )
    best = ranked[0][-1]
    if best.peer is None:
        return Choice(None, f"best here ({tier(here).name.lower()})")
    return Choice(best.peer, f"{tier(best).name.lower()} on {best.peer}, {best.queue} queued")
