"""The memory ledger: who holds how much of each device, and what a load would leave.

Pure: no asyncio, no I/O, no clock. The registry feeds it device readings and child
transitions and asks it questions; the probes (``node_agent.memory.devices``) and the
estimator live elsewhere. Its rules follow the ledger described for llama.cpp's router
(``server_models_sched``: calibrate, reserve, available, deficit, make_room) with the gaps
that description leaves closed.

Figures, per model and device, in bytes:

* ``min``: the estimate at the smallest context the model may run with;
* ``max``: the estimate at the largest context that fits now (shown, never admitted on:
  admitting on ``max`` would refuse a model that runs fine at 4096 because it wants 128K);
* ``effective``: what its running child really holds (measured after ``ready``).

``held[model]`` is what the ledger counts for a running instance: ``effective`` when
measured, else ``min``. It is written on spawn (``min``: the child is about to allocate),
rewritten on ready and on each measurement, and dropped on sleep (the child frees its model
and context), on unload and on crash (a dead child must never leave a ghost reservation
that refuses every later load).

Devices, from readings of ``total`` and ``free``:

* ``external = max(0, total - free - Σ usage of tracked instances)``: what processes we
  do not track use. Each tracked instance is subtracted exactly once, by its fresh
  measurement when the caller has one, else by its held figure. Subtracting only "self"
  would count every other child again as external on each load, and the ledger would grow
  more conservative with every model loaded.
* ``available = min(total - external, limit) - Σ held``: ``--memory-limit`` caps what the
  models together may use; external use still counts against the real device.
  (Equivalent to capping ``total`` at the limit while ``free`` stays real.)
* ``deficit(model)[device] = min - (available - margin)`` where positive. A device never
  read and without a limit is not constrained.

Making room is the scheduler's, one step at a time (each eviction changes the readings): it
asks :meth:`MemoryLedger.shortfall` and :meth:`MemoryLedger.pick_victim` (the first of its
idle candidates that holds memory on a short device) as its ``RoomCheck``. The caller waits
for a victim's exit and for :func:`freed_memory_visible` (GPU drivers report freed memory
late, so a reading right after exit may still count the victim) within a bound of its
choosing, re-reads the devices, calibrates and asks again.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

MIB = 1 << 20


@dataclass(frozen=True)
class DeviceReading:
    """One probe reading: bytes in all and bytes free on a device."""

    name: str
    total: int
    free: int


@dataclass(frozen=True)
class ModelFigures:
    """A model's figures per device, for ``GET /models``."""

    min: Mapping[str, int] = field(default_factory=dict)
    max: Mapping[str, int] | None = None
    effective: Mapping[str, int] | None = None


@dataclass(frozen=True)
class DeviceStatistics:
    name: str
    total: int | None  # None: never read (only a limit is known)
    limit: int | None
    external: int
    held: Mapping[str, int]
    available: int | None
    margin: int

    @property
    def capacity(self) -> int | None:
        """What the models may use at most: the ``--memory-limit``, else the device."""
        return self.limit if self.limit is not None else self.total

    @property
    def other(self) -> int:
        """What keeps room from the models besides themselves, so that ``capacity = other +
        Σ held + available`` holds: under a limit, the part of the external use that reaches
        into it (a device of 24 GiB capped at 2 GiB loses nothing to 1.6 GiB of other
        processes); the CLI showed the raw external and the status page this, and they
        disagreed (issue 29)."""
        capacity = self.capacity
        if capacity is None or self.available is None:
            return self.external
        return max(0, capacity - sum(self.held.values()) - self.available)


@dataclass(frozen=True)
class LedgerStatistics:
    margin: int
    devices: tuple[DeviceStatistics, ...]

    def as_dict(self) -> dict[str, Any]:
        """The ``/ledger`` endpoint's body."""
        return {
            "margin": self.margin,
            "devices": [
                {
                    "name": d.name,
                    "total": d.total,
                    "limit": d.limit,
                    "external": d.external,
                    "capacity": d.capacity,
                    "other": d.other,
                    "held": dict(d.held),
                    "available": d.available,
                    "margin": d.margin,
                }
                for d in self.devices
            ],
        }


@dataclass
class _Device:
    total: int
    external: int = 0


class MemoryLedger:
    """Per-device accounting of tracked instances; see the module docstring."""

    def __init__(self, margin: int, limits: Mapping[str, int] | None = None) -> None:
        self.margin = margin
        self.limits = dict(limits or {})
        self._devices: dict[str, _Device] = {}
        self._figures: dict[str, ModelFigures] = {}
        self._held: dict[str, dict[str, int]] = {}

    # -- figures ---------------------------------------------------------------------------

    def set_estimate(
        self, model: str, min: Mapping[str, int], max: Mapping[str, int] | None = None
    ) -> None:
        """Record a model's estimated ``min`` (and ``max``); a held ``min`` follows it."""
        old = self._figures.get(model, ModelFigures())
        self._figures[model] = ModelFigures(dict(min), _copy(max), old.effective)
        if model in self._held and old.effective is None:
            self._held[model] = _positive(min)

    def figures(self, model: str) -> ModelFigures:
        # Not .get(model, ModelFigures()): that made a default on every call, 1,000 a listing.
        found = self._figures.get(model)
        return found if found is not None else ModelFigures()

    def forget(self, model: str) -> None:
        """The model left the catalog."""
        self._figures.pop(model, None)
        self._held.pop(model, None)

    # -- transitions -----------------------------------------------------------------------

    def on_spawned(self, model: str) -> None:
        """A child was started: reserve its ``min`` before it allocates anything."""
        self._held[model] = _positive(self.figures(model).min)

    def on_ready(self, model: str, effective: Mapping[str, int] | None = None) -> None:
        """Ready (first time or on wake): hold ``effective`` when known, else ``min``."""
        if effective is not None:
            self._set_effective(model, effective)
        self._reserve(model)

    def on_sleeping(self, model: str) -> None:
        """The child unloaded its model and context but lives on: it holds nothing now."""
        self._held.pop(model, None)

    def on_unloaded(self, model: str) -> None:
        """Exited, cleanly or not: release and forget what it held."""
        self._held.pop(model, None)
        if model in self._figures:
            fig = self._figures[model]
            self._figures[model] = ModelFigures(fig.min, fig.max, None)

    def held(self, model: str) -> Mapping[str, int]:
        return dict(self._held.get(model, {}))

    def _set_effective(self, model: str, effective: Mapping[str, int]) -> None:
        fig = self.figures(model)
        self._figures[model] = ModelFigures(fig.min, fig.max, dict(effective))

    def _reserve(self, model: str) -> None:
        fig = self.figures(model)
        self._held[model] = _positive(fig.effective if fig.effective is not None else fig.min)

    # -- devices ---------------------------------------------------------------------------

    def calibrate(
        self,
        readings: Iterable[DeviceReading],
        usage: Mapping[str, Mapping[str, int]] | None = None,
    ) -> None:
        """Take fresh readings; ``usage``: fresh per-instance measurements where known.

        Every tracked instance is subtracted once: by its measurement if in ``usage``, else
        by what it holds. An untracked (sleeping) child's memory is external, rightly: it is
        not ours to count until it wakes.
        """
        usage = usage or {}
        for reading in readings:
            tracked = 0
            for model, held in self._held.items():
                measured = usage.get(model)
                tracked += (measured if measured is not None else held).get(reading.name, 0)
            external = max(0, reading.total - reading.free - tracked)
            self._devices[reading.name] = _Device(reading.total, external)

    def available(self, device: str, *, without: str | None = None) -> int | None:
        """Bytes a new load may use on ``device`` (margin not deducted); None = unlimited."""
        dev = self._devices.get(device)
        limit = self.limits.get(device)
        if dev is None and limit is None:
            return None
        room = dev.total - dev.external if dev is not None else None
        if limit is not None:
            room = limit if room is None else min(room, limit)
        assert room is not None
        held = sum(h.get(device, 0) for m, h in self._held.items() if m != without)
        return room - held

    def deficit(self, model: str, need: Mapping[str, int] | None = None) -> dict[str, int]:
        """Bytes ``model``'s ``min`` (or ``need``: a placement not committed yet) lacks per
        device, margin included; empty when it fits."""
        short = {}
        wanted = need if need is not None else self.figures(model).min
        for device, need_bytes in wanted.items():
            avail = self.available(device, without=model)
            if need_bytes <= 0 or avail is None:
                continue
            lack = need_bytes - (avail - self.margin)
            if lack > 0:
                short[device] = lack
        return short

    # -- making room -----------------------------------------------------------------------

    def _helps(self, victim: str, short: Mapping[str, int]) -> bool:
        held = self._held.get(victim, {})
        return any(held.get(device, 0) > 0 for device in short)

    # The scheduler's RoomCheck protocol (node_agent.core.scheduler).

    def pick_victim(
        self, model: str, candidates: Sequence[str], *, need: Mapping[str, int] | None = None
    ) -> str | None:
        """The first of ``candidates`` (already ordered best victim first) that helps."""
        short = self.deficit(model, need)
        return next((c for c in candidates if c != model and self._helps(c, short)), None)

    # -- snapshot --------------------------------------------------------------------------

    def statistics(self) -> LedgerStatistics:
        names = sorted(set(self._devices) | set(self.limits), key=lambda n: (n != "host", n))
        devices = []
        for name in names:
            dev = self._devices.get(name)
            devices.append(
                DeviceStatistics(
                    name=name,
                    total=dev.total if dev is not None else None,
                    limit=self.limits.get(name),
                    external=dev.external if dev is not None else 0,
                    held={m: h[name] for m, h in sorted(self._held.items()) if h.get(name)},
                    available=self.available(name),
                    margin=self.margin,
                )
            )
        return LedgerStatistics(self.margin, tuple(devices))


def freed_memory_visible(
    baseline_free: Mapping[str, int],
    fresh: Iterable[DeviceReading],
    expected: Mapping[str, int],
    *,
    slack: float = 0.2,
) -> bool:
    """Whether a stopped victim's memory shows free again.

    ``baseline_free``: free bytes per device read just before the victim was stopped;
    ``expected``: what it held. True once every device's free memory rose by at least
    ``expected x (1 - slack)``; the slack absorbs estimates above the real use and small
    moves of other processes. Devices without a baseline are not waited for. How long to
    keep asking is the caller's bound (GPU drivers lag; the host frees at exit).
    """
    now = {r.name: r.free for r in fresh}
    for device, amount in expected.items():
        if amount <= 0 or device not in baseline_free or device not in now:
            continue
        if now[device] - baseline_free[device] < amount * (1 - slack):
            return False
    return True


def _positive(figures: Mapping[str, int]) -> dict[str, int]:
    return {device: size for device, size in figures.items() if size > 0}


def _copy(figures: Mapping[str, int] | None) -> dict[str, int] | None:
    return dict(figures) if figures is not None else None
