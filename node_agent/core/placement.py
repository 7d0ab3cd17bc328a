"""Automatic GPU placement: which GPU(s) a model that pins no device is started on.

Pure: no asyncio, no I/O, no clock. The caller (``runtime/memory_watch.py``) gives the room each GPU
has now (the ledger's ``available`` less the margin), what the model needs on each GPU when
placed there alone (the estimator's ``min``), a way to estimate a split, and the idle models
that could be evicted (best victim first, as the scheduler orders them). :func:`choose`
answers with one :class:`Placement`, in this order of preference (issue 19):

1. **fits**: the single GPU where the model fits now with the least waste (best fit: the
   big GPUs stay free for big models);
2. **evict**: else the single GPU where evicting the fewest, least valuable idle models makes
   room. Only models that hold memory on that GPU alone (and the host) count: evicting a
   model that also holds another GPU would evict on a GPU the new model does not use;
3. **split**: else a split over the fewest GPUs (largest rooms first), in proportion to
   the room of each (``--tensor-split``), where every part fits;
4. **short**: else the GPU with the most room, and the ledger's usual rule (wait for room,
   or load anyway when nothing else runs).

"Least valuable" is the candidates' order: the sum of their positions in it (the scheduler
puts the cheapest victim first: priority, then cost of reloading, then recency).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

MIB = 1 << 20
GIB = 1 << 30
# Subsets of victims are searched exhaustively among this many of the cheapest candidates on
# a GPU (2^12 subsets at most); past that the cheapest ones are the only ones considered.
MAX_SEARCH = 12

PlacementKind = Literal["fits", "evict", "split", "short"]
SplitNeed = Callable[[tuple[str, ...], tuple[float, ...]], Mapping[str, int]]
"""Bytes needed per device when the model is split over these GPUs with these fractions."""


@dataclass(frozen=True)
class Gpu:
    """A GPU as placement sees it: ``room`` = bytes a new load may use now, margin already
    deducted (may be negative); None: not constrained (never read, no limit)."""

    name: str
    room: int | None


@dataclass(frozen=True)
class Holder:
    """An idle model that could be evicted, and what it holds per device."""

    model: str
    held: Mapping[str, int]


@dataclass(frozen=True)
class Placement:
    kind: PlacementKind
    gpus: tuple[str, ...]
    split: tuple[float, ...]  # one fraction per GPU, summing to 1
    need: Mapping[str, int] = field(default_factory=dict)  # bytes per device, host included
    victims: tuple[str, ...] = ()  # to evict first (kind "evict"), cheapest first
    reason: str = ""

    def as_dict(self) -> dict[str, object]:
        """For ``GET /models`` and the status page."""
        return {
            "kind": self.kind,
            "devices": list(self.gpus),
            "split": [round(f, 4) for f in self.split],
            "victims": list(self.victims),
            "reason": self.reason,
        }


def _room(gpu: Gpu) -> float:
    return float("inf") if gpu.room is None else float(gpu.room)


def _size(n: float) -> str:
    return f"{n / GIB:.1f} GiB" if abs(n) >= GIB else f"{n / MIB:.0f} MiB"


def choose(
    gpus: Sequence[Gpu],
    single: Mapping[str, Mapping[str, int]],
    split_need: SplitNeed,
    candidates: Sequence[Holder] = (),
) -> Placement:
    """The placement for one model; see the module docstring. ``single[g]``: its need per
    device when placed on GPU ``g`` alone; GPUs missing from ``single`` are not considered."""
    usable = [g for g in gpus if g.name in single]
    if not usable:
        raise ValueError("no GPU to place on")
    return (
        _best_fit(usable, single)
        or _best_eviction(usable, single, candidates)
        or _split(usable, split_need)
        or _most_room(usable, single)
    )


def _best_fit(gpus: Sequence[Gpu], single: Mapping[str, Mapping[str, int]]) -> Placement | None:
    best: tuple[float, int, Gpu] | None = None
    for index, gpu in enumerate(gpus):
        need = single[gpu.name].get(gpu.name, 0)
        waste = _room(gpu) - need
        if waste >= 0 and (best is None or (waste, index) < best[:2]):
            best = (waste, index, gpu)
    if best is None:
        return None
    gpu = best[2]
    need = single[gpu.name].get(gpu.name, 0)
    room = "no limit" if gpu.room is None else f"{_size(gpu.room)} of room"
    return Placement(
        "fits",
        (gpu.name,),
        (1.0,),
        dict(single[gpu.name]),
        reason=f"{gpu.name}: fits with the least waste (needs {_size(need)}, {room})",
    )


def _best_eviction(
    gpus: Sequence[Gpu], single: Mapping[str, Mapping[str, int]], candidates: Sequence[Holder]
) -> Placement | None:
    gpu_names = {g.name for g in gpus}
    best: tuple[tuple[int, int, float, int], Gpu, tuple[Holder, ...]] | None = None
    for index, gpu in enumerate(gpus):
        if gpu.room is None:
            continue
        lack = single[gpu.name].get(gpu.name, 0) - gpu.room
        # Only models on this GPU alone: evicting one that holds another GPU too would evict
        # on a GPU the new model does not use.
        here = [
            (rank, h)
            for rank, h in enumerate(candidates)
            if h.held.get(gpu.name, 0) > 0
            and not any(h.held.get(o, 0) > 0 for o in gpu_names - {gpu.name})
        ][:MAX_SEARCH]
        found = _fewest(here, gpu.name, lack)
        if found is None:
            continue
        ranks, chosen = found
        freed = sum(h.held.get(gpu.name, 0) for h in chosen)
        key = (len(chosen), ranks, freed - lack, index)
        if best is None or key < best[0]:
            best = (key, gpu, chosen)
    if best is None:
        return None
    _, gpu, chosen = best
    names = tuple(h.model for h in chosen)
    freed = sum(h.held.get(gpu.name, 0) for h in chosen)
    return Placement(
        "evict",
        (gpu.name,),
        (1.0,),
        dict(single[gpu.name]),
        victims=names,
        reason=(
            f"{gpu.name}: no GPU has room; evicting {', '.join(names)} there frees "
            f"{_size(freed)} (the fewest, least valuable idle models that make room)"
        ),
    )


def _fewest(
    here: Sequence[tuple[int, Holder]], gpu: str, lack: float
) -> tuple[int, tuple[Holder, ...]] | None:
    """The smallest set of ``here`` that frees ``lack`` bytes on ``gpu``, then the one with
    the lowest rank sum; None when even all of them do not."""
    if sum(h.held.get(gpu, 0) for _, h in here) < lack:
        return None
    for size in range(1, len(here) + 1):
        best: tuple[int, tuple[Holder, ...]] | None = None
        for combo in itertools.combinations(here, size):
            if sum(h.held.get(gpu, 0) for _, h in combo) < lack:
                continue
            ranks = sum(rank for rank, _ in combo)
            if best is None or ranks < best[0]:
                best = (ranks, tuple(h for _, h in combo))
        if best is not None:
            return best
    return None


def _split(gpus: Sequence[Gpu], split_need: SplitNeed) -> Placement | None:
    roomy = sorted((g for g in gpus if _room(g) > 0), key=lambda g: -_room(g))
    for size in range(2, len(roomy) + 1):
        part = roomy[:size]
        if any(g.room is None for g in part):
            continue  # an unconstrained GPU would have fitted it alone
        total = sum(_room(g) for g in part)
        fractions = tuple(_room(g) / total for g in part)
        names = tuple(g.name for g in part)
        need = split_need(names, fractions)
        if all(need.get(g.name, 0) <= _room(g) for g in part):
            shares = " / ".join(f"{n} {f:.0%}" for n, f in zip(names, fractions, strict=True))
            return Placement(
                "split",
                names,
                fractions,
                dict(need),
                reason=f"split {shares}: no single GPU has room, even by evicting idle models",
            )
    return None


def _most_room(gpus: Sequence[Gpu], single: Mapping[str, Mapping[str, int]]) -> Placement:
    gpu = max(gpus, key=_room)  # the first of equals: max keeps the first maximum
    return Placement(
        "short",
        (gpu.name,),
        (1.0,),
        dict(single[gpu.name]),
        reason=f"{gpu.name}: it fits nowhere now, even split; the GPU with the most room",
    )
