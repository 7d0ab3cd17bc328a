"""Admission scheduler: who may load, who must go, who may send a request.

A pure state machine (no asyncio, no I/O, no clock: ``now`` is an argument). The async
registry feeds it events (a request arrives, a child was spawned, became ready, exited) and
carries out what it decides (spawn this model, stop that one). Its rules follow llama.cpp's
router (``server_models_sched``) and close the races that router leaves open:

* **One queue entry per model.** Requests for a model that is not usable join that model's
  entry; order is by the model's first arrival, so a model's later requests never overtake
  another model's earlier ones, and N cold requests for one model cause exactly one load.
* **Head-only claim.** Only the first entry that still needs a load may claim the right to
  load, and only one of its waiters gets it; the others wait for the outcome.
* **Capacity.** ``free = models_max - running + stopping - claimed``: ``running`` counts
  loading, loaded and sleeping instances (stopping ones included), ``stopping`` are about to
  free their slot, ``claimed`` were granted a load but are not spawned yet. While ``free`` is
  short of the entries that need a load, the least recently used victim is stopped.
* **Victims.** Loaded or sleeping, no request in flight, not already stopping, wanted by no
  queue entry, not pinned; lowest ``priority`` first, then least recently *used* (only
  inference requests make a model younger). Nothing is preempted: when only busy models could
  make room, the queue waits.
* **Leases.** A request takes its lease in the same step that sees the model ready, so a model
  can never be chosen as a victim between "ready" and "request sent" (a live race in
  llama.cpp's router). A stopping (draining) model takes no new lease: its new requests wait
  in the queue and load it again once it has exited.

* **Closing.** Once :meth:`Scheduler.close` was called (the agent got SIGTERM) no lease is
  taken, no load is claimed and no claimed load may spawn: every waiter is told to go away
  (503 with Retry-After) and the registry only drains and stops what runs.
* **Drains.** A stopping model's requests in flight may finish until its drain deadline; the
  scheduler says when the child may be asked to exit (:meth:`Scheduler.drain_over`).

Memory is a second limit: an optional :class:`RoomCheck` (the ledger) says whether the head's
model fits now, and which of the idle candidates to evict when it does not.

Every change of a model's state follows :data:`MODEL_TRANSITIONS` and is recorded once as a
:class:`Transition` (old -> new) for the registry to log (:meth:`Scheduler.take_transitions`).
"""

from __future__ import annotations

import enum
import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Final, Protocol

from node_agent.core.victims import HOT_USES, keep_value, resident_until


class ModelState(enum.Enum):
    """What a model's child is doing (llama.cpp's ``server_model_status`` names)."""

    UNLOADED = "unloaded"
    LOADING = "loading"
    LOADED = "loaded"
    SLEEPING = "sleeping"

    @property
    def running(self) -> bool:
        """A child process exists (it holds an instance slot)."""
        return self is not ModelState.UNLOADED


# Which state may follow which (a model's life: spawned, ready, asleep and awake, gone).
MODEL_TRANSITIONS: Final[Mapping[ModelState, frozenset[ModelState]]] = {
    ModelState.UNLOADED: frozenset({ModelState.LOADING}),
    ModelState.LOADING: frozenset({ModelState.LOADED, ModelState.UNLOADED}),
    ModelState.LOADED: frozenset({ModelState.SLEEPING, ModelState.UNLOADED}),
    ModelState.SLEEPING: frozenset({ModelState.LOADED, ModelState.UNLOADED}),
}


class IllegalTransition(ValueError):
    """A state change :data:`MODEL_TRANSITIONS` does not allow (a bug in the caller)."""


@dataclass(frozen=True)
class Transition:
    """One model's state change, recorded once for the log."""

    model: str
    old: ModelState
    new: ModelState


@dataclass(frozen=True)
class Lease:
    """The right to send one request to a model's child; release it when the response ends."""

    model: str
    id: int
    inference: bool


@dataclass(frozen=True)
class Decision:
    """What a waiting request should do next (see :meth:`Scheduler.poll`)."""

    kind: DecisionKind
    lease: Lease | None = None
    reason: str = ""
    retry_after: float = 0.0


class DecisionKind(enum.Enum):
    LEASED = "leased"  # the model is usable: the lease is taken, send the request
    LOAD = "load"  # this waiter holds the claim: spawn the model's child now
    WAIT = "wait"  # nothing to do until the scheduler's state changes
    FAILED = "failed"  # the load this waiter waited for failed (``reason`` says why)
    GONE = "gone"  # the model left the catalog while the request waited
    BACKOFF = "backoff"  # the model keeps failing: no load before ``retry_after`` seconds
    UNLOADED = "unloaded"  # it would need a load, and this waiter may not start one
    CLOSING = "closing"  # the agent is shutting down: no lease, no load (503 + Retry-After)


class RoomCheck(Protocol):
    """The memory ledger, seen from the scheduler.

    ``shortfall`` is true while loading ``model`` now would leave some device short of its
    margin; ``pick_victim`` chooses which of ``candidates`` (already filtered by the
    scheduler's victim rules and ordered by priority then recency) to evict to close it, or
    None when none of them would help.
    """

    def shortfall(self, model: str) -> bool: ...

    def pick_victim(self, model: str, candidates: Sequence[str]) -> str | None: ...


@dataclass
class _Model:
    name: str
    state: ModelState = ModelState.UNLOADED
    stopping: bool = False
    in_flight: int = 0
    last_used: float = 0.0
    pin: bool = False
    priority: int = 0
    failed: bool = False
    exit_code: int | None = None
    error: str | None = None  # why the last child failed (the child's own error line)
    ready_at: float | None = None
    failures: int = 0  # failed loads or early crashes in a row
    retry_at: float = 0.0  # no new load before this time (crash-loop backoff)
    drain_until: float | None = None  # while stopping: requests in flight may run until then
    spawned_at: float | None = None  # when its child was spawned (for its load time)
    load_seconds: float | None = None  # the last measured load: spawn to ready
    swapped_in: bool = False  # its load evicted another model (anti-thrash, core.victims)
    uses: int = 0  # inference requests since it was last ready


_USABLE = frozenset({ModelState.LOADED, ModelState.SLEEPING})

# Crash-loop backoff: the first failure may be retried at once (a crash of a model that ran
# fine is worth one immediate reload); from the second failure in a row on, wait 1 s, 2 s,
# 4 s… up to a minute before loading again, instead of hammering a broken model.
BACKOFF_BASE = 1.0
BACKOFF_CAP = 60.0
# A child that ran this long before dying is not part of a crash loop: its count restarts.
STABLE_SECONDS = 30.0


def backoff_delay(failures: int) -> float:
    """Seconds to wait before loading a model that failed ``failures`` times in a row."""
    if failures < 2:
        return 0.0
    return float(min(BACKOFF_CAP, BACKOFF_BASE * 2 ** (failures - 2)))


@dataclass
class _Entry:
    """One queue entry: every request waiting for one model."""

    model: str
    waiters: set[int] = field(default_factory=set)
    claimed: bool = False  # a waiter was told to load; the load is the registry's from then on
    spawned: bool = False  # the claimed load has a child process now


@dataclass(frozen=True)
class Eviction:
    """A victim chosen by :meth:`Scheduler.tick`, and which limit chose it."""

    model: str
    reason: str  # "count" (--models-max) or "memory" (the ledger)


@dataclass(frozen=True)
class ModelView:
    """A frozen snapshot of one model's scheduling state."""

    name: str
    state: ModelState
    stopping: bool
    in_flight: int
    last_used: float
    queued: int
    failed: bool
    exit_code: int | None
    error: str | None
    failures: int
    retry_at: float
    claimed: bool = False  # a load was granted and its process does not exist yet


@dataclass(frozen=True)
class Statistics:
    models_max: int
    running: int
    stopping: int
    claimed: int
    needed: int
    free: int | None
    queue: tuple[tuple[str, int], ...]  # (model, waiters) in queue order


class Scheduler:
    """Queue, capacity and victim choice for one agent. Not thread-safe: one owner drives it."""

    def __init__(
        self, models_max: int, room: RoomCheck | None = None, *, residency_factor: float = 0.0
    ) -> None:
        # llama.cpp: --models-max <= 0 means unlimited instances.
        self.models_max = models_max
        self.room = room
        # Anti-thrash (core.victims): no eviction before factor x a model's load time.
        self.residency_factor = residency_factor
        self._models: dict[str, _Model] = {}
        self._queue: dict[str, _Entry] = {}  # insertion order is queue order
        self._waiting: dict[int, str] = {}  # waiter -> model
        self._failures: dict[int, str] = {}  # waiter -> why the load it waited for failed
        self._leases: dict[int, Lease] = {}
        self._ids = itertools.count(1)
        self._transitions: list[Transition] = []
        self.closing = False

    # -- catalog ---------------------------------------------------------------------------

    def add_model(self, name: str, *, pin: bool = False, priority: int = 0) -> None:
        model = self._models.get(name)
        if model is None:
            self._models[name] = _Model(name, pin=pin, priority=priority)
        else:
            model.pin, model.priority = pin, priority

    def remove_model(self, name: str) -> None:
        """Forget a model that left the catalog. Its child must already be gone."""
        model = self._models.get(name)
        if model is not None and model.state.running:
            raise ValueError(f"model {name!r} is still running")
        self._models.pop(name, None)

    def __contains__(self, name: object) -> bool:
        return name in self._models

    def names(self) -> list[str]:
        return list(self._models)

    # -- requests ----------------------------------------------------------------------------

    def try_lease(self, name: str, now: float, *, inference: bool = True) -> Lease | None:
        """Take a lease when the model is usable right now (loaded or sleeping, not stopping).

        A sleeping child wakes itself on the request, as in llama.cpp. Inference requests make
        the model younger; GET ``/props`` or ``/metrics`` do not.
        """
        model = self._models[name]
        if self.closing or model.stopping or model.state not in _USABLE:
            return None
        model.in_flight += 1
        if inference:
            model.last_used = now
            model.uses += 1
        lease = Lease(name, next(self._ids), inference)
        self._leases[lease.id] = lease
        return lease

    def release(self, lease: Lease, now: float) -> None:
        """The request's response ended (or failed). Idempotent."""
        if self._leases.pop(lease.id, None) is None:
            return
        model = self._models.get(lease.model)
        if model is None:
            return
        model.in_flight -= 1
        if lease.inference:
            # Counting use from the end of a request keeps a long stream's model young.
            model.last_used = now

    def join(self, name: str) -> int:
        """A request waits for ``name``; returns its waiter id (one entry per model)."""
        if name not in self._models:
            raise KeyError(name)
        entry = self._queue.get(name)
        if entry is None:
            entry = self._queue[name] = _Entry(name)
        waiter = next(self._ids)
        entry.waiters.add(waiter)
        self._waiting[waiter] = name
        return waiter

    def leave(self, waiter: int) -> None:
        """A waiter is done (leased, failed) or its client went away. Idempotent.

        A load it claimed goes on (as in llama.cpp): the entry keeps the claim until the
        child is spawned, so no second load of the model starts meanwhile.
        """
        self._failures.pop(waiter, None)
        name = self._waiting.pop(waiter, None)
        entry = self._queue.get(name) if name is not None else None
        if entry is None:
            return
        entry.waiters.discard(waiter)
        self._drop_if_done(entry)

    def _drop_if_done(self, entry: _Entry) -> None:
        if not entry.waiters and (not entry.claimed or entry.spawned):
            del self._queue[entry.model]

    def poll(
        self, waiter: int, now: float, *, inference: bool = True, may_load: bool = True
    ) -> Decision:
        """What a waiter should do now. Leasing and leaving the queue happen in one step.

        ``may_load`` False (autoload off): a waiter may wait for a load or a stop under way,
        but never claims one.
        """
        reason = self._failures.pop(waiter, None)
        if reason is not None:
            return Decision(DecisionKind.FAILED, reason=reason)
        if self.closing:
            self.leave(waiter)
            return Decision(DecisionKind.CLOSING)
        name = self._waiting[waiter]
        if name not in self._models:
            self.leave(waiter)
            return Decision(DecisionKind.GONE)
        lease = self.try_lease(name, now, inference=inference)
        if lease is not None:
            self.leave(waiter)
            return Decision(DecisionKind.LEASED, lease=lease)
        entry = self._queue[name]
        model = self._models[name]
        if not may_load and self._needs_load(entry) and not model.stopping:
            self.leave(waiter)
            return Decision(DecisionKind.UNLOADED)
        if self._needs_load(entry) and model.retry_at > now:
            self.leave(waiter)
            return Decision(
                DecisionKind.BACKOFF, reason=model.error or "", retry_after=model.retry_at - now
            )
        if self._may_claim(entry):
            entry.claimed = True
            return Decision(DecisionKind.LOAD)
        return Decision(DecisionKind.WAIT)

    def _may_claim(self, entry: _Entry) -> bool:
        if self._head() is not entry or self._models[entry.model].state.running:
            return False  # not its turn, or its stopping child has not exited yet
        if self.models_max > 0:
            # Spawning needs a slot that is really free now: a stopping child still counts
            # (it lives until it exits), or more than models_max children would be alive.
            running, _, claimed, _ = self._counts()
            if self.models_max - running - claimed < 1:
                return False
        # With nothing else running, a load that does not fit goes ahead anyway (the ledger
        # warns): llama.cpp's rule, since the estimate is conservative and the child may fit.
        return not (
            self.room is not None and self._any_holding() and self.room.shortfall(entry.model)
        )

    def _any_holding(self) -> bool:
        """Some model holds memory: a child runs, or a granted load has not spawned yet (the
        ledger reserves its memory from the grant on; it is not "nothing else")."""
        return any(m.state.running for m in self._models.values()) or any(
            e.claimed and not e.spawned for e in self._queue.values()
        )

    # -- child lifecycle -----------------------------------------------------------------------

    def _set_state(self, model: _Model, new: ModelState) -> None:
        old = model.state
        if new is old:
            return
        if new not in MODEL_TRANSITIONS[old]:
            raise IllegalTransition(f"model {model.name!r}: {old.value} -> {new.value}")
        model.state = new
        self._transitions.append(Transition(model.name, old, new))

    def take_transitions(self) -> list[Transition]:
        """The state changes since the last call, oldest first (each is reported once)."""
        taken, self._transitions = self._transitions, []
        return taken

    def may_spawn(self, name: str) -> bool:
        """Whether the claimed load of ``name`` may create its process now (not once the
        agent is closing: nothing is spawned after the signal)."""
        return not self.closing and name in self._models

    def claim_done(
        self, name: str, *, spawned: bool, reason: str = "", now: float | None = None
    ) -> None:
        """The claimed load spawned a child (now LOADING), or was withdrawn before it could
        (its waiters fail with ``reason``; no failure is held against the model). ``now``:
        the spawn's time, from which the model's load time is measured."""
        entry = self._queue.get(name)
        if spawned:
            model = self._models[name]
            self._set_state(model, ModelState.LOADING)
            model.spawned_at = now
            model.failed, model.exit_code = False, None
            if entry is not None:
                entry.spawned = True
                self._drop_if_done(entry)
        elif entry is not None:
            self._fail_entry(entry, reason)

    def on_spawn_failed(self, name: str, now: float, reason: str) -> None:
        """The claimed load failed before any process existed (the binary cannot run, the
        download failed): a failed load, as if its child had died while loading."""
        model = self._models[name]
        self._record_failure(model, now, reason)
        model.exit_code = None
        entry = self._queue.get(name)
        if entry is not None:
            self._fail_entry(entry, reason)

    def on_ready(self, name: str, now: float) -> None:
        model = self._models[name]
        self._set_state(model, ModelState.LOADED)
        model.last_used = model.ready_at = now
        model.uses = 0
        if model.spawned_at is not None:
            model.load_seconds = max(0.0, now - model.spawned_at)
        entry = self._queue.get(name)
        if entry is not None:
            # The load is done: its waiters lease on their next poll and leave.
            entry.claimed = entry.spawned = False

    def on_sleeping(self, name: str) -> None:
        model = self._models[name]
        if model.state is ModelState.LOADED:  # a child that sleeps before it said ready: no
            self._set_state(model, ModelState.SLEEPING)

    def on_woke(self, name: str) -> None:
        model = self._models[name]
        if model.state is ModelState.SLEEPING:
            self._set_state(model, ModelState.LOADED)

    def _record_failure(self, model: _Model, now: float, reason: str) -> None:
        model.failed = True
        model.error = reason
        stable = model.ready_at is not None and now - model.ready_at >= STABLE_SECONDS
        model.failures = 1 if stable else model.failures + 1
        model.retry_at = now + backoff_delay(model.failures)

    def on_exited(self, name: str, exit_code: int | None, now: float, *, reason: str = "") -> None:
        """The child is gone. An unexpected exit marks the model failed, with its exit code.

        A child stopped on purpose is no failure, even while loading: its waiters stay queued
        and load it again ("never a 'failed to load' for a model that was only unloaded").
        A child that died while loading fails the waiters of that load.
        """
        model = self._models[name]
        died_loading = model.state is ModelState.LOADING and not model.stopping
        if model.stopping:
            model.failed = False
            model.failures, model.retry_at = 0, 0.0
        else:
            self._record_failure(model, now, reason or f"exit code {exit_code}")
        self._set_state(model, ModelState.UNLOADED)
        model.stopping, model.ready_at, model.drain_until = False, None, None
        model.swapped_in = False
        model.exit_code = exit_code
        model.in_flight = 0
        for lease_id in [i for i, lease in self._leases.items() if lease.model == name]:
            del self._leases[lease_id]
        entry = self._queue.get(name)
        if entry is None:
            return
        if died_loading and entry.spawned:
            self._fail_entry(entry, reason or f"exit code {exit_code}")
        else:
            entry.claimed = entry.spawned = False

    def _fail_entry(self, entry: _Entry, reason: str) -> None:
        # Its waiters collect the failure on their next poll; a request that arrives later
        # starts a fresh entry, and so a fresh load attempt.
        for waiter in entry.waiters:
            self._failures[waiter] = reason or "load failed"
            del self._waiting[waiter]
        del self._queue[entry.model]

    def request_stop(self, name: str) -> bool:
        """Mark a running model as stopping (unload, eviction, TTL). False if it was not.

        From here it takes no new lease; requests in flight finish (until the drain deadline
        :meth:`begin_drain` sets) and requests that arrive meanwhile queue to load it again.
        """
        model = self._models.get(name)
        if model is None or not model.state.running or model.stopping:
            return False
        model.stopping = True
        return True

    def begin_drain(self, name: str, deadline: float) -> None:
        """A stopping model's requests in flight may run until ``deadline`` (an earlier
        deadline, as the shutdown's, wins over a later one)."""
        model = self._models[name]
        if model.drain_until is None or deadline < model.drain_until:
            model.drain_until = deadline

    def drain_over(self, name: str, now: float) -> bool:
        """Whether a stopping model's child may be asked to exit now: nothing is in flight any
        more, or the drain deadline has passed (its streams then end with an error event)."""
        model = self._models.get(name)
        if model is None or model.in_flight == 0:
            return True
        return model.drain_until is not None and now >= model.drain_until

    def drain_left(self, name: str, now: float) -> float | None:
        """Seconds until the drain deadline of ``name`` (None: no deadline set)."""
        model = self._models.get(name)
        if model is None or model.drain_until is None:
            return None
        return max(0.0, model.drain_until - now)

    def close(self) -> list[str]:
        """The agent is shutting down: refuse every waiter from now on and return the models
        to stop (every running one that is not stopping yet, now marked stopping)."""
        self.closing = True
        return [name for name in list(self._models) if self.request_stop(name)]

    # -- capacity and victims ----------------------------------------------------------------

    def _needs_load(self, entry: _Entry) -> bool:
        model = self._models.get(entry.model)
        if model is None or entry.claimed:
            return False
        return not model.state.running or model.stopping

    def _head(self) -> _Entry | None:
        """The first entry that still needs a load; entries behind it wait their turn."""
        return next((e for e in self._queue.values() if self._needs_load(e)), None)

    def _counts(self) -> tuple[int, int, int, int]:
        running = sum(1 for m in self._models.values() if m.state.running)
        stopping = sum(1 for m in self._models.values() if m.stopping)
        claimed = sum(1 for e in self._queue.values() if e.claimed and not e.spawned)
        needed = sum(1 for e in self._queue.values() if self._needs_load(e))
        return running, stopping, claimed, needed

    def _free(self) -> int | None:
        if self.models_max <= 0:
            return None
        running, stopping, claimed, _ = self._counts()
        return self.models_max - running + stopping - claimed

    def victim_candidates(self, now: float | None = None) -> list[str]:
        """Models that may be stopped to make room, best victim first.

        Without ``now``: lowest priority, then least recently used. With ``now`` (evictions
        to make room): models still within their minimum residency are left out, and among
        equal priorities the cheapest to lose goes first (:func:`core.victims.keep_value`).
        """
        candidates = [
            m
            for m in self._models.values()
            if m.state in (ModelState.LOADED, ModelState.SLEEPING)
            and m.in_flight == 0
            and not m.stopping
            and not m.pin
            and m.name not in self._queue
        ]
        if now is None:
            candidates.sort(key=lambda m: (m.priority, m.last_used, m.name))
        else:
            factor = self.residency_factor
            candidates = [
                m
                for m in candidates
                if not (m.swapped_in and m.uses >= HOT_USES)
                or now >= resident_until(m.ready_at, m.load_seconds, factor)
            ]
            candidates.sort(
                key=lambda m: (
                    m.priority,
                    keep_value(m.load_seconds, m.last_used, now),
                    m.last_used,
                    m.name,
                )
            )
        return [m.name for m in candidates]

    def expired(self, now: float, ttls: Mapping[str, float]) -> list[str]:
        """Models idle for longer than their TTL (``ttls``: seconds by model; absent = none).

        Idle is counted from the end of the last inference request; a model with a request in
        flight, a queue entry, a pin or already stopping never expires.
        """
        return [
            name
            for name in self.victim_candidates()
            if name in ttls and now - self._models[name].last_used >= ttls[name]
        ]

    def tick(self, now: float | None = None) -> list[Eviction]:
        """Choose the victims to stop now; each is already marked stopping when returned.

        Instances: while ``free`` is short of the entries that need a load, stop the best
        victim. Memory: while the head's model does not fit, stop one victim at a time (the
        caller waits for it to exit and its memory to show free before ticking again).
        ``now``: order victims by cost and honour the minimum residency (see
        :meth:`victim_candidates`).
        """
        victims: list[Eviction] = []
        head = self._head()
        free = self._free()
        if free is not None:
            needed = self._counts()[3]
            while free < needed:
                candidates = self.victim_candidates(now)
                if not candidates:
                    break  # only busy (or still resident) models could make room: wait
                self.request_stop(candidates[0])
                victims.append(Eviction(candidates[0], "count"))
                free += 1
        if (
            self.room is not None
            and head is not None
            and not any(m.stopping for m in self._models.values())
            and self.room.shortfall(head.model)
        ):
            victim = self.room.pick_victim(head.model, self.victim_candidates(now))
            if victim is not None:
                self.request_stop(victim)
                victims.append(Eviction(victim, "memory"))
        if victims and head is not None:
            self._models[head.model].swapped_in = True  # it comes in by a swap
        return victims

    def stuck(self, name: str) -> bool:
        """Nothing can make room for ``name`` now: it cannot claim, no victim would help and
        none is stopping (so no change is on its way).

        A direct ``POST /models/load`` answers llama.cpp's "model limit reached" then, where
        a request would wait for a busy model to finish.
        """
        entry = self._queue.get(name)
        if entry is None or entry.claimed or self._may_claim(entry):
            return False
        if any(m.stopping for m in self._models.values()):
            return False
        candidates = self.victim_candidates()
        if self.room is not None and self.room.shortfall(name):
            return self.room.pick_victim(name, candidates) is None
        return not candidates

    def wait_reason(self, name: str) -> str:
        """Why a request for ``name`` cannot go ahead now, in words (for the log line when it
        starts waiting and for the 503 of ``--queue-timeout``)."""
        model = self._models[name]
        if model.stopping:
            return f"{name} is stopping ({model.in_flight} in flight)"
        if model.state is ModelState.LOADING:
            return f"{name} is loading"
        entry = self._queue.get(name)
        head = self._head()
        if entry is not None and head is not None and head is not entry:
            return f"queued behind {head.model}, which waits for room"
        if self.models_max > 0:
            running = [m for m in self._models.values() if m.state.running]
            if len(running) >= self.models_max:
                busy = ", ".join(f"{m.name} ({self._busy_with(m)})" for m in running)
                return f"all {self.models_max} instances busy: {busy}"
        if self.room is not None and self._any_holding() and self.room.shortfall(name):
            return "not enough free memory for it, and no idle model to evict"
        return "waiting for its turn"

    def _busy_with(self, model: _Model) -> str:
        if model.stopping:
            return "stopping"
        if model.state is ModelState.LOADING:
            return "loading"
        if model.in_flight:
            return f"{model.in_flight} in flight"
        if model.pin:
            return "pinned"
        if model.name in self._queue:
            return "requested"
        return "idle"

    # -- snapshots ---------------------------------------------------------------------------

    def view(self, name: str) -> ModelView:
        m = self._models[name]
        entry = self._queue.get(name)
        return ModelView(
            name=m.name,
            state=m.state,
            stopping=m.stopping,
            in_flight=m.in_flight,
            last_used=m.last_used,
            queued=len(entry.waiters) if entry is not None else 0,
            failed=m.failed,
            exit_code=m.exit_code,
            error=m.error,
            failures=m.failures,
            retry_at=m.retry_at,
            claimed=entry is not None and entry.claimed and not entry.spawned,
        )

    def statistics(self) -> Statistics:
        running, stopping, claimed, needed = self._counts()
        return Statistics(
            models_max=self.models_max,
            running=running,
            stopping=stopping,
            claimed=claimed,
            needed=needed,
            free=self._free(),
            queue=tuple((e.model, len(e.waiters)) for e in self._queue.values()),
        )
