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
* **Order across models.** A model that waits for room has waited :attr:`Scheduler.patience`
  seconds while every model that could make room is busy: the best of those (the victim
  order, below) takes no new request from then on, its new requests queue behind the
  waiting one, and once its requests in flight end it is evicted as an idle one would be.
  Without it a later request for a busy model went ahead of an earlier one for a model that
  waited for room, for as long as requests kept the busy ones busy (issue 48: under a soak
  of 64 clients, a request that waited more than 4 s saw a median 57 later requests for
  other models answered first). Nothing in flight is cut.
* **Leases.** A request takes its lease in the same step that sees the model ready, so a model
  can never be chosen as a victim between "ready" and "request sent" (a live race in
  llama.cpp's router). A stopping (draining) model takes no new lease: its new requests wait
  in the queue and load it again once it has exited.

* **Turns.** Children that compute on the CPU with a thread per core (``ModelConfig.turns``)
  compute one model at a time: two at once run twice as many threads as cores, and ggml's
  threads wait for each other by spinning, so each slows down many times over (measured on
  2 cores: a 4-token request 16 ms alone, 0.15-2.5 s beside another model). A request for
  one waits while another computes; a computing model takes no new request while another
  waits, so its turn ends with its requests in flight, and the next turn goes to the model
  that computed least recently. A turn holds the next model back at most :attr:`turn`
  seconds: then that one computes beside it, and the one after waits a turn of its own. So
  a long generation stalls no other model, it shares the cores with them as without turns:
  turns pay where requests are short beside a turn (bursts, embeddings, short answers).

* **Closing.** Once :meth:`Scheduler.close` was called (the agent got SIGTERM) no lease is
  taken, no load is claimed and no claimed load may spawn: every waiter is told to go away
  (503 with Retry-After) and the registry only drains and stops what runs.
* **Drains.** A stopping model's requests in flight may finish until its drain deadline; the
  scheduler says when the child may be asked to exit (:meth:`Scheduler.drain_over`).

Memory is a second limit: an optional :class:`RoomCheck` (the ledger) says whether the head's
model fits now, and which of the idle candidates to evict when it does not.

Every change of a model's state follows :data:`MODEL_TRANSITIONS` and is recorded once as a
:class:`Transition` (old -> new): an effect of the event that caused it, for the owner to log.

**One entry point.** The runtime's owner calls only :meth:`Scheduler.handle` (an event in,
a list of effects out: ``core.scheduler_events``); the other methods are the steps it is made
of, public for the tests that drive them one by one. ``handle`` also gates each child's
slots (a lease that takes a slot is granted only while the child has one free, in arrival
order), so a request waits in one queue, under one timeout, whether for a load or a slot,
and one that has not reached the child when its model stops simply waits for the reload.
An event looks at a few waiters however many wait (:meth:`Scheduler._answer_entry`): the
queue is the client's to make long, and the loop that runs the scheduler serves everyone.
"""

from __future__ import annotations

import enum
import heapq
import itertools
import math
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Final, Protocol

from node_agent.core.model_state import (
    MODEL_TRANSITIONS,
    USABLE,
    IllegalTransition,
    ModelState,
    ModelView,
    Statistics,
    Transition,
)
from node_agent.core.scheduler_events import (
    Catalog,
    ChildFault,
    Close,
    Drain,
    Effect,
    Event,
    Exited,
    Grant,
    Keep,
    KeepAliveValue,
    Lease,
    Leave,
    ModelConfig,
    Probe,
    Probed,
    Queued,
    Ready,
    Refusal,
    Refuse,
    Release,
    Removed,
    Request,
    Sleeping,
    Spawn,
    Spawned,
    SpawnFailed,
    Started,
    Stop,
    Tick,
    Unload,
    Woke,
)
from node_agent.core.victims import HOT_USES, keep_value, resident_until


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
    TIMEOUT = "timeout"  # its deadline passed while it waited for its turn or a slot


class RoomCheck(Protocol):
    """The memory ledger, seen from the scheduler: pure questions, asked as often as needed.

    ``shortfall`` is true while loading ``model`` now would leave some device short of its
    margin, with ``candidates`` (the idle models the scheduler would allow to be evicted,
    best victim first) still in place; ``pick_victim`` chooses which of them to evict to
    close it, or None when none would help. Neither logs nor changes anything: the owner
    explains an eviction when it carries out the Drain that commits it.
    """

    def shortfall(self, model: str, candidates: Sequence[str]) -> bool: ...

    def pick_victim(self, model: str, candidates: Sequence[str]) -> str | None: ...


@dataclass
class _Model:
    name: str
    config: ModelConfig = field(default_factory=ModelConfig)
    state: ModelState = ModelState.UNLOADED
    stopping: bool = False
    stop_sent: bool = False  # its drain is over and the child was told to exit
    gone: bool = False  # it left the catalog; forgotten once its child has exited
    # Why the child on its way stops once spawned (None: it does not): its arguments changed
    # ("reload": it runs the old ones; so did one that left the catalog and came back) or it
    # was removed ("remove") while its load was granted. Its waiters load it again.
    stop_spawned: str | None = None
    in_flight: int = 0
    busy: int = 0  # leases in flight that take one of its child's slots
    port: int | None = None  # where its child listens (from the spawn on)
    last_used: float = 0.0
    keep_alive: KeepAliveValue = Keep.DEFAULT  # that of the last use of its run to end
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
    errors: int = 0  # requests in a row its child failed with a 5xx of its own
    suspicion: str | None = None  # why its child is being probed (Scheduler._judge)
    wedged: str | None = None  # why its child is being killed as wedged
    # The waiting model it makes room for: it takes no new lease, and goes once idle (the
    # order across models, Scheduler._order_across_models); None: it serves as usual.
    yields_to: str | None = None
    turn_at: float = -math.inf  # when its child last began to compute (a slot lease from none)
    # When it last stopped computing (its slot leases went to none): who computed least
    # recently, where a turn's start would put a long generation's model first.
    done_at: float = -math.inf

    @property
    def pin(self) -> bool:
        return self.config.pin

    @property
    def priority(self) -> int:
        return self.config.priority

    def slot_free(self) -> bool:
        return self.config.slots <= 0 or self.busy < self.config.slots

    def ttl(self) -> float | None:
        return self.config.ttl if self.keep_alive is Keep.DEFAULT else self.keep_alive


# Seconds a model waits for room before a busy model makes room for it (the order across
# models, Scheduler._order_across_models).
PATIENCE = 2.0

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
class _Waiter:
    """One waiting request (see :class:`~node_agent.core.scheduler_events.Request`)."""

    inference: bool = True
    slot: bool = True
    may_load: bool = True
    direct: bool = False
    deadline: float | None = None
    keep_alive: KeepAliveValue = Keep.DEFAULT

    @property
    def kind(self) -> int:
        """Which of its entry's :attr:`_Entry.kinds` it waits in."""
        return _DIRECT if self.direct else _SLOT if self.slot else _SLOTLESS


# Waiters of one kind are answered alike (Scheduler._answer_entry): those that take one of the
# child's slots, those that take none, and direct loads (answered once the child exists).
_SLOT, _SLOTLESS, _DIRECT = range(3)
# A heap of deadlines is rebuilt from its waiters once it holds this many more than they are
# (the waiters that left before their deadline stay in it until then).
_STALE_DEADLINES = 64


@dataclass
class _Entry:
    """One queue entry: every request waiting for one model, in arrival order."""

    model: str
    since: float = 0.0  # when its first waiter came (how long it has waited for room)
    waiters: dict[int, _Waiter] = field(default_factory=dict)
    claimed: bool = False  # a waiter was told to load; the load is the registry's from then on
    spawned: bool = False  # the claimed load has a child process now
    # The same waiters by kind (each in arrival order), those that may not load, and their
    # deadlines (a heap of (deadline, waiter); a waiter that left stays until it is on top):
    # what lets an event look at a few waiters, not at all of them (Scheduler._answer_entry).
    # Ordered dicts: a kind's first waiter is found at once, where a dict's first live item
    # comes after every one removed before it (a release cost 32 us with 1,000 waiting and
    # 78 us with 50,000; now 30 us at both).
    kinds: tuple[OrderedDict[int, _Waiter], ...] = field(
        default_factory=lambda: (OrderedDict(), OrderedDict(), OrderedDict())
    )
    no_load: dict[int, None] = field(default_factory=dict)
    deadlines: list[tuple[float, int]] = field(default_factory=list)

    def add(self, waiter: int, info: _Waiter) -> None:
        self.waiters[waiter] = info
        self.kinds[info.kind][waiter] = info
        if not info.may_load:
            self.no_load[waiter] = None
        if info.deadline is None:
            return
        if len(self.deadlines) > 2 * len(self.waiters) + _STALE_DEADLINES:
            # Rebuilt from the waiters, this one among them.
            self.deadlines = [
                (w.deadline, n) for n, w in self.waiters.items() if w.deadline is not None
            ]
            heapq.heapify(self.deadlines)
        else:
            heapq.heappush(self.deadlines, (info.deadline, waiter))

    def remove(self, waiter: int) -> None:
        info = self.waiters.pop(waiter, None)
        if info is not None:
            del self.kinds[info.kind][waiter]
            self.no_load.pop(waiter, None)

    def next_deadline(self) -> tuple[float, int] | None:
        """The earliest deadline of a waiter still waiting, and that waiter."""
        while self.deadlines:
            deadline, waiter = self.deadlines[0]
            info = self.waiters.get(waiter)
            if info is not None and info.deadline == deadline:
                return deadline, waiter
            heapq.heappop(self.deadlines)
        return None


@dataclass(frozen=True)
class Eviction:
    """A victim chosen by :meth:`Scheduler.tick`, which limit chose it, and for whom."""

    model: str
    reason: str  # "count" (--models-max) or "memory" (the ledger)
    evicted_for: str | None = None


class Scheduler:
    """Queue, capacity and victim choice for one agent. Not thread-safe: one owner drives it."""

    def __init__(
        self,
        models_max: int,
        room: RoomCheck | None = None,
        *,
        residency_factor: float = 0.0,
        max_queue: int | None = None,
        child_errors: int = 0,
        turn: float = 0.0,
        patience: float = PATIENCE,
    ) -> None:
        # llama.cpp: --models-max <= 0 means unlimited instances.
        self.models_max = models_max
        self.room = room
        # Anti-thrash (core.victims): no eviction before factor x a model's load time.
        self.residency_factor = residency_factor
        self.max_queue = max_queue  # --max-queue: waiters per model beyond which one is refused
        # --max-child-errors: 5xx answers in a row after which a child is wedged (0: never)
        self.child_errors = child_errors
        # --cpu-turns: how long a model that takes turns (ModelConfig.turns) computes before
        # the next one waiting may compute beside it (0: they never wait for each other)
        self.turn = turn
        # How long a model waits for room before a busy model makes room for it (the order
        # across models; math.inf: never, a busy model serves for as long as it is asked).
        self.patience = patience
        self._models: dict[str, _Model] = {}
        # Models with a child (any state but unloaded), and those stopping: in the order they
        # came to be (dicts as ordered sets: views and wait reasons list them in that order).
        self._running: dict[str, None] = {}
        self._stopping: dict[str, None] = {}
        self._queue: dict[str, _Entry] = {}  # insertion order is queue order
        self._waiting: dict[int, str] = {}  # waiter -> model
        self._failures: dict[int, str] = {}  # waiter -> why the load it waited for failed
        self._leases: dict[int, Lease] = {}
        self._ids = itertools.count(1)
        self._transitions: list[Transition] = []
        # When the state changes next without an event (see next_wakeup), as of the last
        # event handled; a lease granted at once leaves it as it was (it moves no deadline
        # closer: a TTL only later, and the Tick then re-reads it).
        self.wakeup: float | None = None
        self.closing = False
        self._close_until: float | None = None  # the shutdown's drain bound, once closing

    # -- the one entry point ---------------------------------------------------------------

    def handle(self, event: Event, now: float) -> list[Effect]:
        """Apply ``event`` at ``now``; return what the owner must do, in order."""
        out: list[Effect] = []
        match event:
            case Request():
                if self._arrive(event, now, out):
                    return out  # granted or refused at once: nothing else changed
            case Leave(waiter=waiter):
                self.leave(waiter)
            case Release(lease=lease, fault=fault):
                self.release(lease, now)
                self._judge(lease, fault, now, out)
            case Spawned(model=name, port=port):
                self.claim_done(name, spawned=True, now=now, port=port)
                model = self._models[name]
                stop, model.stop_spawned = model.stop_spawned, None
                if self.closing:  # spawned as the agent began to close: it stops too
                    self._drain(name, "shutdown", now, out)
                elif model.gone:  # it left the catalog as it was spawned
                    self._drain(name, "reload", now, out)
                elif stop is not None:  # changed or removed as it was spawned
                    self._drain(name, stop, now, out)
            case SpawnFailed(model=name, reason=reason, count=count):
                model = self._models[name]
                outdated, model.stop_spawned = model.stop_spawned is not None, None
                if count and outdated and not model.gone:
                    # The arguments that failed are no longer the model's: as for a child
                    # stopped on purpose, its waiters load it again (with the new ones).
                    self._retry_load(name)
                elif count:
                    self.on_spawn_failed(name, now, reason)
                else:
                    self.claim_done(name, spawned=False, reason=reason)
                if self._models[name].gone:
                    self.remove_model(name)
                    out.append(Removed(name))
            case Ready(model=name, port=port):
                self.on_ready(name, now, port=port)
            case Sleeping(model=name):
                self.on_sleeping(name)
            case Woke(model=name):
                self.on_woke(name)
            case Exited(model=name, code=code, reason=reason):
                self.on_exited(name, code, now, reason=reason)
                if self._models[name].gone:
                    self.remove_model(name)
                    out.append(Removed(name))
            case Unload(model=name, reason=reason):
                self._drain(name, reason, now, out)
            case Catalog():
                self._apply_catalog(event, now, out)
            case Probed():
                self._probed(event, now, out)
            case Close(drain_until=until):
                self._close(until, now, out)
            case Tick():
                pass
        self._settle(now, out)
        self.wakeup = self.next_wakeup(now)
        # The state changes first: the owner logs a model's new state before it acts on it.
        return [*self.take_transitions(), *out]

    def _arrive(self, request: Request, now: float, out: list[Effect]) -> bool:
        """A request joins its model's queue; True when it was answered at once."""
        name, waiter = request.model, request.waiter
        if self.closing:
            out.append(Refuse(waiter, Refusal.CLOSING))
            return True
        model = self._models.get(name)
        if model is None or model.gone:
            out.append(Refuse(waiter, Refusal.GONE))
            return True
        entry = self._queue.get(name)
        if request.direct:
            # (A child that stops, or stops once spawned, is no load: it waits for the next.)
            if (model.state.running or (entry is not None and entry.claimed)) and not (
                model.stopping or model.stop_spawned is not None
            ):
                out.append(Refuse(waiter, Refusal.RUNNING))
                return True
        elif entry is None or not entry.waiters:
            # Nobody waits ahead of it: a usable model with a free slot takes it now.
            lease = self.try_lease(
                name,
                now,
                inference=request.inference,
                slot=request.slot,
                keep_alive=request.keep_alive,
            )
            if lease is not None:
                out.append(Grant(waiter, lease))
                return True
            if not request.may_load and not model.state.running:
                out.append(Refuse(waiter, Refusal.UNLOADED))
                return True
        if (
            self.max_queue is not None
            and entry is not None
            and len(entry.waiters) >= (self.max_queue)
        ):
            out.append(Refuse(waiter, Refusal.FULL, limit=self.max_queue))
            return True
        self.join(
            name,
            waiter=waiter,
            since=now,
            info=_Waiter(
                request.inference,
                request.slot,
                request.may_load,
                request.direct,
                request.deadline,
                request.keep_alive,
            ),
        )
        self._settle(now, out)
        if waiter in self._waiting:
            usable = model.state in USABLE and not model.stopping
            out.append(Queued(waiter, name, self.wait_reason(name), slot=usable))
        return False

    def _judge(self, lease: Lease, fault: ChildFault | None, now: float, out: list[Effect]) -> None:
        """A request's end, as evidence about its child. One it stalled, or ``child_errors``
        answered in a row with its own 5xx, make the child a suspect, nothing more: b11434
        answers 500 to some requests that are only their client's mistake (an image for a
        text model, an unknown token to detokenize), and a long answer that is not streamed
        sends no byte for as long as it computes. So the owner probes the child with what any
        healthy child answers (:class:`Probe`), and only a child that fails the probe too is
        wedged (:meth:`_probed`): a client's own requests never cost another client its
        request. A lease of an earlier child of the model says nothing of this one."""
        model = self._models.get(lease.model)
        if model is None or model.port is None or model.port != lease.port:
            return
        if fault is None:
            model.errors = 0
            return
        if fault is ChildFault.STALLED:
            why = "a request it accepted got no byte from it within --timeout"
        else:
            model.errors += 1
            if self.child_errors <= 0 or model.errors < self.child_errors:
                return
            why = f"{model.errors} requests in a row failed with its own 5xx"
        if model.wedged is not None or model.suspicion is not None:
            return  # one probe at a time: the faults meanwhile are the same evidence
        model.suspicion = why
        out.append(Probe(lease.model, lease.port, why))

    def _probed(self, probed: Probed, now: float, out: list[Effect]) -> None:
        """The probe's verdict on a suspect child: healthy, and its requests' failures were
        their own (the count starts again); broken, and it is wedged: it takes no new
        request, is killed at once (its requests in flight end with an error event) and
        loads again on the next request, with the backoff of a crash."""
        model = self._models.get(probed.model)
        if model is None or model.port != probed.port or model.suspicion is None:
            return  # a probe of a child that has gone meanwhile
        suspicion, model.suspicion = model.suspicion, None
        if probed.broken is None:
            model.errors = 0
            return
        model.wedged = f"{suspicion}, and {probed.broken}"
        if not self.request_stop(probed.model):
            self.begin_drain(probed.model, now)  # stopping already: cut it now
            return
        self.begin_drain(probed.model, now)
        out.append(Drain(probed.model, "wedged", now))

    def _apply_catalog(self, catalog: Catalog, now: float, out: list[Effect]) -> None:
        for name, config in catalog.models.items():
            known = self._models.get(name)
            if known is not None and known.gone and self._spawning(name):
                # Back before its child was spawned, maybe with other arguments: that child
                # (the old preset's) stops once spawned, as one that stayed away would.
                known.stop_spawned = "reload"
            self.add_model(name, config=config)
        for name in [n for n in self._models if n not in catalog.models]:
            model = self._models[name]
            model.gone = True
            if model.state.running:
                self._drain(name, "reload", now, out)
            elif not self._spawning(name):  # (a granted load reports back first: kept till then)
                self.remove_model(name)
                out.append(Removed(name))
        for name in catalog.changed:
            # Its failures were the old arguments' or file's: no backoff for the new ones, and
            # not shown as theirs (as a running one's stop for the change clears them).
            model = self._models[name]
            model.failed, model.failures, model.retry_at = False, 0, 0.0
            self._drain(name, "reload", now, out)

    def _drain(
        self, name: str, reason: str, now: float, out: list[Effect], evicted_for: str | None = None
    ) -> None:
        """Stop ``name`` if it runs: it drains until its stop timeout (or an earlier bound).
        One whose load was granted stops once its child is spawned (see ``Spawned``)."""
        model = self._models.get(name)
        if model is None:
            return
        if self.request_stop(name) or (reason == "shutdown" and name in self._stopping):
            self.begin_drain(name, now + model.config.stop_timeout)
            if self._close_until is not None:
                self.begin_drain(name, self._close_until)  # the shutdown's bound wins
            out.append(Drain(name, reason, model.drain_until or now, evicted_for))
        elif self._spawning(name) and model.stop_spawned is None:
            model.stop_spawned = reason

    def _close(self, until: float, now: float, out: list[Effect]) -> None:
        self._close_until = until
        for name in self.close():
            model = self._models[name]
            self.begin_drain(name, min(until, now + model.config.stop_timeout))
            out.append(Drain(name, "shutdown", model.drain_until or until))
        for name in self._stopping:
            self.begin_drain(name, until)  # the shutdown's bound wins over a later one

    def _settle(self, now: float, out: list[Effect]) -> None:
        """Everything the state now implies: TTL expiries, answers to waiters, evictions,
        claimed loads, and drains that are over."""
        for name in self.expired(now):
            self._drain(name, "ttl", now, out)
        self._order_across_models(now)
        self._answer_waiters(now, out)
        # Once more: a model that the answers made busy (it was loading) may have to make room.
        self._order_across_models(now)
        while True:
            for eviction in self.tick(now):
                model = self._models[eviction.model]
                self.begin_drain(eviction.model, now + model.config.stop_timeout)
                until = model.drain_until or now
                out.append(Drain(eviction.model, eviction.reason, until, eviction.evicted_for))
            head = self._head()
            if head is None or not head.waiters or not self._may_claim(head):
                break
            head.claimed = True
            out.append(Spawn(head.model))
            if self.room is not None:
                # The room counts a load from its Spawn on, which the owner carries out after
                # this event: a second claim now would be judged as if the first took nothing
                # (two loads into the memory of one). The next event claims the next one.
                break
        for name in sorted(self._stopping):
            model = self._models[name]
            if not model.stop_sent and self.drain_over(name, now):
                model.stop_sent = True
                out.append(Stop(name, cut=model.in_flight > 0))

    def _answer_waiters(self, now: float, out: list[Effect]) -> None:
        for waiter, reason in list(self._failures.items()):
            del self._failures[waiter]
            out.append(Refuse(waiter, Refusal.FAILED, reason))
        for entry in list(self._queue.values()):
            self._answer_entry(entry, now, out)
        if self.turn > 0:
            self._answer_turns(now, out)

    def _answer_entry(self, entry: _Entry, now: float, out: list[Effect]) -> None:
        """Answer the waiters of ``entry`` that can be answered now, looking at a few of them.

        Waiters of one kind whose deadline has not passed get the same answer (the entry's
        state decides it), but for leases, which go in arrival order while the child has
        slots: so each kind is looked at until one of its waiters waits, and a queue of
        thousands waiting for a load costs three looks an event, not thousands. Only a waiter
        that may not load is answered otherwise (once its model needs a load), and one whose
        deadline passed (the heap finds it).
        """
        model = self._models.get(entry.model)
        if entry.no_load and model is not None and not model.stopping and self._needs_load(entry):
            for waiter in list(entry.no_load):
                if not self._answered(waiter, entry.waiters[waiter], entry, now, out):
                    break
        for waiters in entry.kinds:
            while waiters and entry.model in self._queue:
                waiter, info = next(iter(waiters.items()))
                if not self._answered(waiter, info, entry, now, out):
                    break
        while entry.model in self._queue and (due := entry.next_deadline()) is not None:
            deadline, waiter = due
            if deadline > now or self._loading(entry):
                break  # (the queue timeout does not bound a load under way)
            if not self._answered(waiter, entry.waiters[waiter], entry, now, out):
                break

    def _answered(
        self, waiter: int, info: _Waiter, entry: _Entry, now: float, out: list[Effect]
    ) -> bool:
        """Answer one waiter if it can be answered now (it leaves the queue then)."""
        effect = self._answer(waiter, info, entry, now)
        if effect is None:
            return False
        out.append(effect)
        self.leave(waiter)
        return True

    def _answer(self, waiter: int, info: _Waiter, entry: _Entry, now: float) -> Effect | None:
        """The answer to one waiter now, or None while it waits."""
        decision = self._verdict(waiter, info, entry, now)
        kind = decision.kind
        if kind is DecisionKind.LEASED:
            assert decision.lease is not None
            return Grant(waiter, decision.lease)
        if kind is DecisionKind.WAIT:
            if info.direct:
                model = self._models[entry.model]
                if model.state.running and not model.stopping:
                    return Started(waiter)  # its child exists: a direct load is answered
                if self.stuck(entry.model):
                    return Refuse(waiter, Refusal.LIMIT)
            return None
        if kind is DecisionKind.TIMEOUT:
            return Refuse(waiter, Refusal.TIMEOUT, self.wait_reason(entry.model))
        refusal = _REFUSALS[kind]
        return Refuse(waiter, refusal, decision.reason, decision.retry_after)

    def next_wakeup(self, now: float) -> float | None:
        """When the state will change without an event (a waiter's deadline, a drain's end,
        a TTL, a minimum residency): the owner sends a Tick then. None: not before an
        event."""
        times: list[float] = []
        for entry in self._queue.values():
            due = entry.next_deadline()
            if due is not None and due[0] > now and not self._loading(entry):
                times.append(due[0])
        for name in self._stopping:
            model = self._models[name]
            if not model.stop_sent and model.drain_until is not None and model.in_flight:
                times.append(model.drain_until)
        times += self._turn_ends()
        head = self._head()
        if head is not None and self.models_max > 0 and self.patience < math.inf:
            times.append(head.since + self.patience)  # a busy model may have to make room
        for name in self._running:
            model = self._models[name]
            ttl = model.ttl()
            if ttl is not None and model.state in USABLE:
                times.append(model.last_used + ttl)
            if self._queue and model.swapped_in:
                until = resident_until(model.ready_at, model.load_seconds, self.residency_factor)
                if until > now:
                    times.append(until)
        future = [t for t in times if t > now]
        return min(future) if future else None

    # -- catalog ---------------------------------------------------------------------------

    def add_model(
        self,
        name: str,
        *,
        pin: bool = False,
        priority: int = 0,
        config: ModelConfig | None = None,
    ) -> None:
        config = config or ModelConfig(pin=pin, priority=priority)
        model = self._models.get(name)
        if model is None:
            self._models[name] = _Model(name, config)
        else:
            model.config, model.gone = config, False

    def remove_model(self, name: str) -> None:
        """Forget a model that left the catalog. Its child must already be gone."""
        model = self._models.get(name)
        if model is not None and model.state.running:
            raise ValueError(f"model {name!r} is still running")
        self._models.pop(name, None)

    def outgoing(self, name: str) -> bool:
        """``name``'s child, running or on its way, is to stop: it is stopping, it left the
        catalog, or it stops once spawned (changed or removed while its load was granted)."""
        model = self._models.get(name)
        return model is not None and (
            model.stopping or model.gone or model.stop_spawned is not None
        )

    def __contains__(self, name: object) -> bool:
        return name in self._models

    def names(self) -> list[str]:
        return list(self._models)

    def wedged_why(self, name: str) -> str:
        """Why ``name``'s child is being killed as wedged ("" when it is not)."""
        model = self._models.get(name)
        if model is None or model.wedged is None:
            return ""
        return model.wedged

    def needs_room(self) -> bool:
        """Some queued model waits for a load (the owner reads the devices only then)."""
        return self._head() is not None

    # -- requests ----------------------------------------------------------------------------

    def try_lease(
        self,
        name: str,
        now: float,
        *,
        inference: bool = True,
        slot: bool = True,
        keep_alive: KeepAliveValue = Keep.DEFAULT,
    ) -> Lease | None:
        """Take a lease when the model is usable right now (loaded or sleeping, not stopping)
        and, for a request that takes a slot, its child has one free.

        A sleeping child wakes itself on the request, as in llama.cpp. Inference requests make
        the model younger; GET ``/props`` or ``/metrics`` do not.
        """
        model = self._models[name]
        if self.closing or model.stopping or model.state not in USABLE:
            return None
        if model.yields_to is not None:
            return None
        if slot and not (model.slot_free() and self._turn_allows(model, now)):
            return None
        model.in_flight += 1
        if slot:
            if not model.busy:
                model.turn_at = now
            model.busy += 1
        if inference:
            model.last_used = now
            model.uses += 1
        lease = Lease(name, next(self._ids), inference, slot, model.port, keep_alive)
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
        if lease.slot:
            model.busy -= 1
            if not model.busy:
                model.done_at = now
        if lease.inference:
            # Counting use from the end of a request keeps a long stream's model young.
            model.last_used = now
            # Its keep_alive governs what follows it (KeepAliveValue): none, the default.
            model.keep_alive = lease.keep_alive

    def join(
        self,
        name: str,
        *,
        waiter: int | None = None,
        info: _Waiter | None = None,
        since: float = 0.0,
    ) -> int:
        """A request waits for ``name``; returns its waiter id (one entry per model, which
        counts its wait from ``since``, when its first waiter came)."""
        if name not in self._models:
            raise KeyError(name)
        entry = self._queue.get(name)
        if entry is None:
            entry = self._queue[name] = _Entry(name, since)
        if waiter is None:
            waiter = next(self._ids)
        entry.add(waiter, info or _Waiter())
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
        entry.remove(waiter)
        self._drop_if_done(entry)

    def _drop_if_done(self, entry: _Entry) -> None:
        if not entry.waiters and (not entry.claimed or entry.spawned):
            del self._queue[entry.model]

    def poll(
        self, waiter: int, now: float, *, inference: bool = True, may_load: bool = True
    ) -> Decision:
        """What one waiter should do now, as :meth:`handle` decides it for each (the tests'
        step-by-step view): leasing and leaving the queue happen in one step, and a waiter
        at the head that may load claims the load (LOAD)."""
        name = self._waiting.get(waiter)
        entry = self._queue.get(name) if name is not None else None
        if entry is None or waiter not in entry.waiters:
            reason = self._failures.pop(waiter, None)
            return Decision(DecisionKind.FAILED, reason=reason or "load failed")
        info = entry.waiters[waiter]
        info.inference, info.may_load = inference, may_load
        if may_load:
            entry.no_load.pop(waiter, None)
        else:
            entry.no_load[waiter] = None
        decision = self._verdict(waiter, info, entry, now)
        if decision.kind is not DecisionKind.WAIT:
            self.leave(waiter)
            return decision
        if self._head() is entry and self._may_claim(entry):
            entry.claimed = True
            return Decision(DecisionKind.LOAD)
        return decision

    def _verdict(self, waiter: int, info: _Waiter, entry: _Entry, now: float) -> Decision:
        reason = self._failures.pop(waiter, None)
        if reason is not None:
            return Decision(DecisionKind.FAILED, reason=reason)
        if self.closing:
            return Decision(DecisionKind.CLOSING)
        model = self._models.get(entry.model)
        if model is None or model.gone:
            return Decision(DecisionKind.GONE)
        if not info.direct:
            lease = self.try_lease(
                entry.model,
                now,
                inference=info.inference,
                slot=info.slot,
                keep_alive=info.keep_alive,
            )
            if lease is not None:
                return Decision(DecisionKind.LEASED, lease=lease)
        needs = self._needs_load(entry)
        if not info.may_load and needs and not model.stopping:
            return Decision(DecisionKind.UNLOADED)
        if needs and model.retry_at > now:
            return Decision(
                DecisionKind.BACKOFF, reason=model.error or "", retry_after=model.retry_at - now
            )
        if info.deadline is not None and now >= info.deadline and not self._loading(entry):
            return Decision(DecisionKind.TIMEOUT)
        return Decision(DecisionKind.WAIT)

    def _loading(self, entry: _Entry) -> bool:
        """The queue timeout bounds the wait for a turn or a slot, not a load under way: a
        big model that takes longer to load than the timeout must still be servable."""
        model = self._models.get(entry.model)
        if model is None or model.stopping:
            return False
        return model.state is ModelState.LOADING or (entry.claimed and not entry.spawned)

    def _spawning(self, name: str) -> bool:
        """A load of ``name`` was granted and its child is not spawned yet."""
        entry = self._queue.get(name)
        return entry is not None and entry.claimed and not entry.spawned

    def _may_claim(self, entry: _Entry) -> bool:
        if self.closing or self._head() is not entry or self._models[entry.model].state.running:
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
            self.room is not None
            and self._any_holding()
            and self.room.shortfall(entry.model, self.victim_candidates())
        )

    def _any_holding(self) -> bool:
        """Some model holds memory: a child runs, or a granted load has not spawned yet (the
        ledger reserves its memory from the grant on; it is not "nothing else")."""
        return bool(self._running) or any(e.claimed and not e.spawned for e in self._queue.values())

    # -- child lifecycle -----------------------------------------------------------------------

    def _set_state(self, model: _Model, new: ModelState) -> None:
        old = model.state
        if new is old:
            return
        if new not in MODEL_TRANSITIONS[old]:
            raise IllegalTransition(f"model {model.name!r}: {old.value} -> {new.value}")
        model.state = new
        if new.running:
            self._running[model.name] = None
        else:
            self._running.pop(model.name, None)
        self._transitions.append(Transition(model.name, old, new))

    def take_transitions(self) -> list[Transition]:
        """The state changes since the last call, oldest first (each is reported once)."""
        taken, self._transitions = self._transitions, []
        return taken

    def claim_done(
        self,
        name: str,
        *,
        spawned: bool,
        reason: str = "",
        now: float | None = None,
        port: int | None = None,
    ) -> None:
        """The claimed load spawned a child (now LOADING, listening on ``port``), or was
        withdrawn before it could (its waiters fail with ``reason``; no failure is held
        against the model). ``now``: the spawn's time, from which the load time counts."""
        entry = self._queue.get(name)
        if spawned:
            model = self._models[name]
            self._set_state(model, ModelState.LOADING)
            model.spawned_at, model.port = now, port
            model.failed, model.exit_code = False, None
            if entry is not None:
                entry.spawned = True
                self._drop_if_done(entry)
        elif entry is not None:
            self._fail_entry(entry, reason)

    def _retry_load(self, name: str) -> None:
        """The claimed load of ``name`` ended without a child: its waiters claim it again."""
        entry = self._queue.get(name)
        if entry is not None:
            entry.claimed = entry.spawned = False
            self._drop_if_done(entry)

    def on_spawn_failed(self, name: str, now: float, reason: str) -> None:
        """The claimed load failed before any process existed (the binary cannot run, the
        download failed): a failed load, as if its child had died while loading."""
        model = self._models[name]
        self._record_failure(model, now, reason)
        model.exit_code = None
        entry = self._queue.get(name)
        if entry is not None:
            self._fail_entry(entry, reason)

    def on_ready(self, name: str, now: float, *, port: int | None = None) -> None:
        model = self._models[name]
        self._set_state(model, ModelState.LOADED)
        if port is not None:
            model.port = port
        model.last_used = model.ready_at = now
        model.uses = 0
        if model.spawned_at is not None:
            model.load_seconds = max(0.0, now - model.spawned_at)
        entry = self._queue.get(name)
        if entry is not None:
            # The load is done: its waiters lease on their next look and leave.
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
        if model.wedged is not None:
            self._record_failure(model, now, f"killed as wedged: {model.wedged}")
            model.wedged = None
        elif model.stopping:
            model.failed = False
            model.failures, model.retry_at = 0, 0.0
        else:
            self._record_failure(model, now, reason or f"exit code {exit_code}")
        self._set_state(model, ModelState.UNLOADED)
        self._stopping.pop(name, None)
        model.stopping, model.stop_sent, model.ready_at, model.drain_until = (
            False,
            False,
            None,
            None,
        )
        model.swapped_in = False
        model.keep_alive = Keep.DEFAULT  # the next run starts from its own idle time
        model.exit_code = exit_code
        if model.busy:
            model.done_at = now  # it computed until it died
        model.in_flight = model.busy = model.errors = 0
        model.suspicion = None
        model.port = None
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
        # Its waiters collect the failure on their next look; a request that arrives later
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
        model.yields_to = None
        self._stopping[name] = None
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

    def close(self) -> list[str]:
        """The agent is shutting down: refuse every waiter from now on and return the models
        to stop (every running one that is not stopping yet, now marked stopping)."""
        self.closing = True
        return [name for name in list(self._models) if self.request_stop(name)]

    # -- turns -----------------------------------------------------------------------------

    def _turn_allows(self, model: _Model, now: float) -> bool:
        """Whether a request that takes one of ``model``'s slots may go now, as far as turns
        go (see the module's docstring); ``model`` is usable and has a slot free."""
        if self.turn <= 0 or not model.config.turns:
            return True
        others = [m for m in self._turn_takers() if m is not model]
        waiting = [m for m in others if self._waits_for_turn(m)]
        if model.busy:
            # More of its requests add no threads: it takes them while nobody else waits,
            # and once its turn has lasted its time (the others compute beside it by then).
            return not waiting or now >= model.turn_at + self.turn
        computing = [m.turn_at for m in others if m.busy]
        if computing and now < max(computing) + self.turn:
            return False
        # A waiting model that computes (its turn ran out) takes its requests anyway.
        return all(model.done_at <= m.done_at for m in waiting if not m.busy)

    def _answer_turns(self, now: float, out: list[Effect]) -> None:
        """Answer again the models waiting for a turn, while that answers one: a model that
        fills its slots (or whose last waiter was refused) stops waiting, and so may let one
        looked at before it go. Each round answers a waiter or ends the loop."""
        answered = True
        while answered:
            answered = False
            for model in self._turn_takers():
                entry = self._queue.get(model.name)
                if entry is not None and self._waits_for_turn(model):
                    before = len(out)
                    self._answer_entry(entry, now, out)
                    answered = answered or len(out) > before

    def _turn_takers(self) -> list[_Model]:
        models = (self._models[name] for name in self._running)
        return [m for m in models if m.config.turns]

    def _waits_for_turn(self, model: _Model) -> bool:
        """``model`` could take a request that waits for it but for the turns."""
        if model.stopping or model.state not in USABLE or not model.slot_free():
            return False
        entry = self._queue.get(model.name)
        return entry is not None and bool(entry.kinds[_SLOT])

    def _turn_ends(self) -> list[float]:
        """When computing models' turns run out, while another model waits for one."""
        if self.turn <= 0:
            return []
        takers = self._turn_takers()
        if not any(self._waits_for_turn(m) for m in takers):
            return []
        return [m.turn_at + self.turn for m in takers if m.busy]

    # -- order across models ------------------------------------------------------------------

    def _order_across_models(self, now: float) -> None:
        """Which models make room for the queue's head (see the module's docstring): as many
        as the slots still missing beyond the other idle victims, once the head has waited
        its patience. A model that makes room keeps doing so while it is still needed (its
        requests ending make it younger: that must not hand the part to another), and serves
        again once it is not."""
        wanted = 0
        head = self._head()
        if head is not None and self.models_max > 0 and now >= head.since + self.patience:
            free = self._free() or 0
            needed = self._counts()[3]
            idle = [n for n in self.victim_candidates(now) if self._models[n].yields_to is None]
            wanted = max(0, needed - free - len(idle))
        for n, model in enumerate(self._room_makers(now)):
            model.yields_to = head.model if n < wanted and head is not None else None

    def _room_makers(self, now: float) -> list[_Model]:
        """The models that could make room for the head, best first: those that make room
        already (the idle ones first: they go now), then the busy ones in the victim order
        (pins and a minimum residency kept, as for an idle victim)."""
        factor = self.residency_factor
        makers = [
            m
            for m in (self._models[n] for n in self._running)
            if m.state in USABLE
            and (m.in_flight > 0 or m.yields_to is not None)
            and not m.stopping
            and not m.pin
            and not (
                m.swapped_in
                and m.uses >= HOT_USES
                and now < resident_until(m.ready_at, m.load_seconds, factor)
            )
        ]
        makers.sort(
            key=lambda m: (
                m.yields_to is None,
                m.in_flight > 0,
                m.priority,
                keep_value(m.load_seconds, m.last_used, now),
                m.last_used,
                m.name,
            )
        )
        return makers

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
        running = len(self._running)
        stopping = len(self._stopping)
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
            for m in (self._models[n] for n in self._running)
            if m.state in USABLE
            and m.in_flight == 0
            and not m.stopping
            and not m.pin
            and (m.name not in self._queue or m.yields_to is not None)
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

    def expired(self, now: float, ttls: Mapping[str, float] | None = None) -> list[str]:
        """Models idle for longer than their TTL (``ttls``: seconds by model, absent = none;
        by default each model's own: its last use's keep_alive, else its preset's).

        Idle is counted from the end of the last inference request; a model with a request in
        flight, a queue entry, a pin or already stopping never expires.
        """
        if ttls is None:
            ttls = {
                name: ttl for name in self._running if (ttl := self._models[name].ttl()) is not None
            }
        if not ttls:
            return []
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
        if head is None:
            return victims
        free = self._free()
        if free is not None:
            needed = self._counts()[3]
            while free < needed:
                candidates = self.victim_candidates(now)
                if not candidates:
                    break  # only busy (or still resident) models could make room: wait
                self.request_stop(candidates[0])
                victims.append(Eviction(candidates[0], "count", head.model))
                free += 1
        if self.room is not None and not self._stopping:
            candidates = self.victim_candidates(now)
            if self.room.shortfall(head.model, candidates):
                victim = self.room.pick_victim(head.model, candidates)
                if victim is not None:
                    self.request_stop(victim)
                    victims.append(Eviction(victim, "memory", head.model))
        if victims:
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
        if self._stopping:
            return False
        candidates = self.victim_candidates()
        if self.room is not None and self.room.shortfall(name, candidates):
            return self.room.pick_victim(name, candidates) is None
        return not candidates

    def wait_reason(self, name: str) -> str:
        """Why a request for ``name`` cannot go ahead now, in words (for the log line when it
        starts waiting and for the 503 of ``--queue-timeout``)."""
        model = self._models[name]
        if model.stopping:
            return f"{name} is stopping ({model.in_flight} in flight)"
        entry = self._queue.get(name)
        if model.state is ModelState.LOADING or (entry is not None and entry.claimed):
            return f"{name} is loading"
        if model.yields_to is not None:
            return (
                f"{name} makes room for {model.yields_to}, which waited longer "
                f"({model.in_flight} in flight)"
            )
        if model.state in USABLE and not model.slot_free():
            return f"all {model.config.slots} slots of its server stayed busy"
        if model.state in USABLE and model.config.turns and self.turn > 0:
            computing = [m.name for m in self._turn_takers() if m.busy and m is not model]
            if computing:
                return f"it takes turns on the CPU with {', '.join(computing)}, computing"
        head = self._head()
        if entry is not None and head is not None and head is not entry:
            return f"queued behind {head.model}, which waits for room"
        if self.models_max > 0:
            running = [self._models[n] for n in self._running]
            if len(running) >= self.models_max:
                busy = ", ".join(f"{m.name} ({self._busy_with(m)})" for m in running)
                return f"all {self.models_max} instances busy: {busy}"
        if (
            self.room is not None
            and self._any_holding()
            and self.room.shortfall(name, self.victim_candidates())
        ):
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
            ttl=m.ttl(),
            pin=m.pin,
        )

    def residents(self) -> list[str]:
        """The models whose child runs (loading, loaded or asleep) and is not stopping, in the
        order they started. Walks only the running models (a routing scrape asks many times a
        second, whatever the catalog's size)."""
        return [name for name in self._running if not self._models[name].stopping]

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


_REFUSALS: Final[Mapping[DecisionKind, Refusal]] = {
    DecisionKind.FAILED: Refusal.FAILED,
    DecisionKind.GONE: Refusal.GONE,
    DecisionKind.BACKOFF: Refusal.BACKOFF,
    DecisionKind.UNLOADED: Refusal.UNLOADED,
    DecisionKind.CLOSING: Refusal.CLOSING,
}
