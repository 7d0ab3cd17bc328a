"""``Scheduler.handle`` driven by random event sequences (hypothesis), with the owner's side
played faithfully: every effect is carried out as the registry would, and after each event
the invariants the agent's safety rests on are checked.

* A child never has more slot-taking requests than its slots, and never more children run
  than ``--models-max`` allows.
* Every request is answered at most once, and a request still waiting is in the queue.
* No lease is granted for a model that is not usable, and nothing is spawned once closing.
* A stopped child is told to stop once, and only after it was drained.
* Every event has the effects it has on a scheduler that looks at every waiter on every event
  (:class:`FullScan`): the one that looks at a few of them answers the same waiters alike.
* A model that waited its patience for room has a child on its way out or making room for
  it (the order across models).
"""

from __future__ import annotations

import itertools

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from node_agent.core.model_state import USABLE, ModelState, Transition
from node_agent.core.scheduler import Scheduler, _Entry
from node_agent.core.scheduler_events import (
    Catalog,
    Close,
    Drain,
    Effect,
    Event,
    Exited,
    Grant,
    Lease,
    Leave,
    ModelConfig,
    Queued,
    Ready,
    Refuse,
    Release,
    Removed,
    Request,
    Spawn,
    Spawned,
    Started,
    Stop,
    Tick,
    Unload,
)

MODELS = ("a", "b", "c")
MODELS_MAX = 2
SLOTS = {"a": 1, "b": 2, "c": 1}


class FullScan(Scheduler):
    """The reference: every waiter of an entry is looked at, in arrival order, on every event
    (as the scheduler did before it learnt to look at a few)."""

    def _answer_entry(self, entry: _Entry, now: float, out: list[Effect]) -> None:
        for waiter, info in list(entry.waiters.items()):
            if entry.model not in self._queue:
                break
            self._answered(waiter, info, entry, now, out)


def _alike(effects: list[Effect]) -> list[str]:
    """Effects compared across two schedulers: in any order, a lease by its waiter and model
    (lease numbers follow the order leases were taken in)."""
    shown = []
    for effect in effects:
        if isinstance(effect, Grant):
            shown.append(f"Grant({effect.waiter}, {effect.lease.model}, {effect.lease.slot})")
        else:
            shown.append(repr(effect))
    return sorted(shown)


class SchedulerMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.sched = Scheduler(MODELS_MAX, max_queue=20)
        self.reference = FullScan(MODELS_MAX, max_queue=20)
        self.reference_leases: dict[int, Lease] = {}  # waiter -> the reference's lease
        self.now = 0.0
        self.ids = itertools.count(1)
        self.waiting: dict[int, str] = {}  # waiter -> model, not answered yet
        self.answered: set[int] = set()
        self.leases: list[Lease] = []
        self.spawning: set[str] = set()  # Spawn effects not yet reported as Spawned
        self.children: dict[str, int] = {}  # model -> port, a process exists
        self.stop_told: set[str] = set()
        self.drained: set[str] = set()
        self.closing = False
        self.steps = 0
        configs = {m: ModelConfig(slots=SLOTS[m], stop_timeout=3.0) for m in MODELS}
        self.send(Catalog(configs))

    def send(self, event: Event, reference: Event | None = None) -> None:
        """``event`` to both schedulers (``reference``: its form for the reference, where it
        names a lease, which each has numbered its own way)."""
        effects = self.sched.handle(event, self.now)
        expected = self.reference.handle(reference or event, self.now)
        assert _alike(effects) == _alike(expected), (event, effects, expected)
        for effect in expected:
            if isinstance(effect, Grant):
                self.reference_leases[effect.waiter] = effect.lease
        for effect in effects:
            self.carry_out(effect)

    def carry_out(self, effect: Effect) -> None:
        match effect:
            case Grant(waiter=waiter, lease=lease):
                self.answer(waiter)
                view = self.sched.view(lease.model)
                assert view.state in (ModelState.LOADED, ModelState.SLEEPING)
                assert not view.stopping
                assert lease.port == self.children[lease.model]
                self.leases.append((waiter, lease))
            case Started(waiter=waiter) | Refuse(waiter=waiter):
                self.answer(waiter)
            case Spawn(model=name):
                assert not self.closing
                assert name not in self.spawning and name not in self.children
                self.spawning.add(name)
            case Drain(model=name):
                self.drained.add(name)
            case Stop(model=name):
                assert name in self.drained and name not in self.stop_told
                self.stop_told.add(name)
            case Queued() | Removed() | Transition():
                pass

    def answer(self, waiter: int) -> None:
        assert waiter in self.waiting, f"waiter {waiter} answered twice or never asked"
        del self.waiting[waiter]
        self.answered.add(waiter)

    # -- what happens --------------------------------------------------------------------------

    # Mostly plain requests: a direct load, a slot-less lease, one that may not load and one
    # without a deadline are one in five each; deadlines of different lengths.
    @rule(
        model=st.sampled_from(MODELS),
        slot=st.sampled_from((True, True, True, True, False)),
        direct=st.sampled_from((False, False, False, False, True)),
        may_load=st.sampled_from((True, True, True, True, False)),
        timeout=st.sampled_from((5.0, 5.0, 2.0, 8.0, None)),
    )
    def request(
        self, model: str, slot: bool, direct: bool, may_load: bool, timeout: float | None
    ) -> None:
        self.steps += 1
        waiter = next(self.ids)
        self.waiting[waiter] = model
        deadline = None if timeout is None else self.now + timeout
        self.send(Request(waiter, model, slot=slot, may_load=may_load, direct=direct,
                          deadline=deadline))  # fmt: skip

    @precondition(lambda self: self.waiting)
    @rule(data=st.data())
    def leave(self, data: st.DataObject) -> None:
        waiter = data.draw(st.sampled_from(sorted(self.waiting)))
        del self.waiting[waiter]
        self.send(Leave(waiter))

    @precondition(lambda self: self.leases)
    @rule(data=st.data())
    def release(self, data: st.DataObject) -> None:
        waiter, lease = data.draw(st.sampled_from(self.leases))
        self.leases.remove((waiter, lease))
        self.send(Release(lease), Release(self.reference_leases.pop(waiter)))

    @precondition(lambda self: self.spawning)
    @rule(data=st.data())
    def spawned(self, data: st.DataObject) -> None:
        name = data.draw(st.sampled_from(sorted(self.spawning)))
        self.spawning.discard(name)
        self.children[name] = next(self.ids)
        self.send(Spawned(name, self.children[name]))

    @precondition(lambda self: any(self.loading()))
    @rule(data=st.data())
    def ready(self, data: st.DataObject) -> None:
        name = data.draw(st.sampled_from(sorted(self.loading())))
        self.send(Ready(name, self.children[name]))

    @precondition(lambda self: self.children)
    @rule(data=st.data(), crash=st.booleans())
    def exited(self, data: st.DataObject, crash: bool) -> None:
        """A child told to stop exits; any child may crash."""
        candidates = sorted(self.children if crash else self.stop_told & set(self.children))
        if not candidates:
            return
        name = data.draw(st.sampled_from(candidates))
        del self.children[name]
        self.stop_told.discard(name)
        self.drained.discard(name)
        self.leases = [(w, lease) for w, lease in self.leases if lease.model != name]
        self.send(Exited(name, 1 if crash else 0))

    @rule(model=st.sampled_from(MODELS))
    def unload(self, model: str) -> None:
        self.send(Unload(model, "manual"))

    @rule(seconds=st.floats(0.1, 4.0))
    def tick(self, seconds: float) -> None:
        self.now += seconds
        self.send(Tick())

    @precondition(lambda self: not self.closing and self.steps >= 25)  # late: it ends all
    @rule()
    def close(self) -> None:
        self.closing = True
        self.send(Close(self.now + 2.0))

    def loading(self) -> list[str]:
        return [m for m in self.children if self.sched.view(m).state is ModelState.LOADING]

    # -- invariants ----------------------------------------------------------------------------

    @invariant()
    def slots_and_instances_hold(self) -> None:
        for model in MODELS:
            busy = sum(1 for _, lease in self.leases if lease.model == model and lease.slot)
            assert busy <= SLOTS[model], (model, busy)
        running = len(self.children) + len(self.spawning)
        assert running <= MODELS_MAX, (self.children, self.spawning)

    @invariant()
    def every_waiter_is_queued_or_answered(self) -> None:
        queued = sum(view for _, view in self.sched.statistics().queue)
        assert queued == len(self.waiting), (self.sched.statistics().queue, self.waiting)

    @invariant()
    def a_long_wait_for_room_has_room_on_its_way(self) -> None:
        """The order across models (issue 48): once the head has waited its patience for
        room, some child is on its way out or makes room for it, unless none could."""
        sched = self.sched
        head = sched._head()
        if head is None or sched.closing or self.now < head.since + sched.patience:
            return
        running, stopping, claimed, needed = sched._counts()
        if MODELS_MAX - running + stopping - claimed >= needed:
            return  # the room is there: the head claims it on the next event
        models = [sched._models[name] for name in sched._running]
        usable = [m for m in models if m.state in USABLE and not m.stopping]
        assert not usable or any(m.stopping or m.yields_to for m in models), (
            head.model,
            [(m.name, m.state, m.in_flight, m.yields_to) for m in models],
        )

    @invariant()
    def closing_answers_everyone(self) -> None:
        if self.closing:
            assert not self.waiting


# The profile's examples (tests/conftest.py), each a long run of events.
SchedulerMachine.TestCase.settings = settings(stateful_step_count=60)
test_scheduler_machine = SchedulerMachine.TestCase
