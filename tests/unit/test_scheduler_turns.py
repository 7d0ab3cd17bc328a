"""Turns: models whose children compute on the CPU with a thread per core compute one at a
time (``ModelConfig.turns``, the agent's ``--cpu-turns``), each turn ending with its requests
in flight, none holding the others back longer than ``Scheduler.turn``."""

from __future__ import annotations

import itertools

from hypothesis import settings
from hypothesis.stateful import invariant

from node_agent.core.scheduler import Scheduler
from node_agent.core.scheduler_events import (
    Catalog,
    Effect,
    Grant,
    Lease,
    ModelConfig,
    Queued,
    Ready,
    Release,
    Request,
    Spawned,
    Tick,
    Unload,
)
from tests.unit import test_scheduler_machine as base
from tests.unit.test_scheduler_effects import grants, handle

TURN = 1.0
_WAITERS = itertools.count(1)


def make(*names: str, slots: int = 1, turns: bool = True, turn: float = TURN) -> Scheduler:
    """Models ``names`` loaded (ports 7001…), none computing, at t=0."""
    sched = Scheduler(0, turn=turn)
    config = ModelConfig(slots=slots, turns=turns)
    assert handle(sched, Catalog(dict.fromkeys(names, config)), 0.0) == []
    for port, name in enumerate(names, 7001):
        waiter = next(_WAITERS)
        handle(sched, Request(waiter, name), 0.0)
        handle(sched, Spawned(name, port), 0.0)
        (grant,) = handle(sched, Ready(name), 0.0)
        assert isinstance(grant, Grant)
        assert handle(sched, Release(grant.lease), 0.0) == []
    return sched


def ask(sched: Scheduler, model: str, now: float, **how: object) -> tuple[int, list[Effect]]:
    waiter = next(_WAITERS)
    return waiter, handle(sched, Request(waiter, model, **how), now)  # type: ignore[arg-type]


def lease(sched: Scheduler, model: str, now: float) -> Lease:
    """A request for ``model`` that must be granted at once."""
    _, effects = ask(sched, model, now)
    (grant,) = effects
    assert isinstance(grant, Grant), effects
    return grant.lease


def test_a_request_waits_while_another_model_computes_and_goes_when_it_ends() -> None:
    sched = make("a", "b")
    running = lease(sched, "a", 1.0)
    waiter, effects = ask(sched, "b", 1.1)
    assert effects == [
        Queued(waiter, "b", "it takes turns on the CPU with a, computing", slot=True)
    ]
    assert sched.wakeup == 1.0 + TURN  # when b may compute beside a, if a has not ended
    assert grants(handle(sched, Release(running), 1.5)) == [waiter]


def test_a_computing_model_takes_no_new_request_while_another_waits() -> None:
    sched = make("a", "b", slots=4)
    first = lease(sched, "a", 1.0)
    lease(sched, "a", 1.0)  # nobody waits: a takes more (its threads compute them together)
    b_waiter, _ = ask(sched, "b", 1.1)
    a_waiter, effects = ask(sched, "a", 1.2)
    assert grants(effects) == []  # a hands its turn over: it ends with its requests in flight
    assert grants(handle(sched, Release(first), 1.3)) == []
    (rest,) = [lease for lease in sched._leases.values() if lease.model == "a"]
    assert grants(handle(sched, Release(rest), 1.4)) == [b_waiter]
    assert grants(handle(sched, Tick(), 1.5)) == []  # now b computes, and a waits
    (b_lease,) = [lease for lease in sched._leases.values() if lease.model == "b"]
    assert grants(handle(sched, Release(b_lease), 1.6)) == [a_waiter]


def test_every_waiter_of_the_model_whose_turn_comes_goes_at_once_up_to_its_slots() -> None:
    sched = make("a", "b", slots=2)
    running = lease(sched, "a", 1.0)
    waiters = [ask(sched, "b", 1.1)[0] for _ in range(3)]
    assert grants(handle(sched, Release(running), 1.2)) == waiters[:2]


def b_goes_before_a(sched: Scheduler, now: float) -> None:
    """While c computes, a and then b ask: b, which computed less recently, goes first."""
    running = lease(sched, "c", now)
    a_waiter, _ = ask(sched, "a", now + 0.1)  # a's entry comes first in the queue
    b_waiter, _ = ask(sched, "b", now + 0.2)
    assert grants(handle(sched, Release(running), now + 0.3)) == [b_waiter]
    (b_lease,) = [lease for lease in sched._leases.values() if lease.model == "b"]
    assert grants(handle(sched, Release(b_lease), now + 0.4)) == [a_waiter]


def test_the_turn_goes_to_the_model_that_computed_least_recently() -> None:
    sched = make("a", "b", "c")
    handle(sched, Release(lease(sched, "b", 1.0)), 1.1)  # b computed at 1.0
    handle(sched, Release(lease(sched, "a", 2.0)), 2.1)  # a at 2.0
    b_goes_before_a(sched, 3.0)


def test_least_recently_counts_from_when_a_model_stopped_computing_not_when_it_began() -> None:
    sched = make("a", "b", "c")
    long = lease(sched, "a", 1.0)  # a long generation: a computes from 1.0 to 5.0
    b_first, _ = ask(sched, "b", 1.1)
    assert grants(handle(sched, Tick(), 1.0 + TURN)) == [b_first]  # beside a: its turn ran out
    (b_lease,) = [lease for lease in sched._leases.values() if lease.model == "b"]
    handle(sched, Release(b_lease), 2.1)  # b computed last at 2.1
    handle(sched, Release(long), 5.0)  # a at 5.0
    b_goes_before_a(sched, 5.1)


def test_a_turn_that_lasts_its_time_lets_the_next_model_compute_beside_it() -> None:
    sched = make("a", "b", "c")
    lease(sched, "a", 1.0)  # a long generation
    b_waiter, _ = ask(sched, "b", 1.2)
    c_waiter, _ = ask(sched, "c", 1.3)
    assert grants(handle(sched, Tick(), 1.0 + TURN - 0.01)) == []
    assert grants(handle(sched, Tick(), 1.0 + TURN)) == [b_waiter]  # b came first, equal turns
    assert sched.wakeup == 1.0 + 2 * TURN  # c waits a turn of b's own
    assert grants(handle(sched, Tick(), 1.0 + 2 * TURN)) == [c_waiter]


def test_a_model_whose_turn_lasted_its_time_takes_its_own_requests_again() -> None:
    sched = make("a", "b", slots=2)
    lease(sched, "a", 1.0)  # a long generation
    b_first, b_second = ask(sched, "b", 1.1)[0], ask(sched, "b", 1.1)[0]
    a_waiter, effects = ask(sched, "a", 1.5)
    assert grants(effects) == []  # b waits: a hands its turn over
    # a's turn ran out: b computes beside it, and a, computing anyway, takes its request
    # (a request more adds no thread); a's slots are full then, so b's second goes too.
    assert grants(handle(sched, Tick(), 1.0 + TURN)) == [b_first, a_waiter, b_second]


def test_models_that_do_not_take_turns_compute_together() -> None:
    for sched in (make("a", "b", turns=False), make("a", "b", turn=0.0)):
        lease(sched, "a", 1.0)
        lease(sched, "b", 1.1)


def test_requests_that_take_no_slot_do_not_wait_for_a_turn() -> None:
    sched = make("a", "b")
    lease(sched, "a", 1.0)
    _, effects = ask(sched, "b", 1.1, slot=False)  # a conversation's replay: no compute
    assert len(grants(effects)) == 1


def test_a_stopping_model_computes_until_its_requests_end_and_the_others_wait() -> None:
    sched = make("a", "b")
    running = lease(sched, "a", 1.0)
    handle(sched, Unload("a", "manual"), 1.1)
    b_waiter, effects = ask(sched, "b", 1.2)
    assert grants(effects) == []
    assert b_waiter in grants(handle(sched, Release(running), 1.3))


class TurnsMachine(base.SchedulerMachine):
    """The random machine with every model taking turns (two of them loaded at a time): the
    scheduler is still held to the full scan, and the turns to their two rules."""

    def __init__(self) -> None:
        self.began: dict[str, float] = {}  # model -> when its slot leases went from none
        super().__init__()
        self.sched = Scheduler(base.MODELS_MAX, max_queue=20, turn=TURN)
        self.reference = base.FullScan(base.MODELS_MAX, max_queue=20, turn=TURN)
        configs = {m: ModelConfig(slots=base.SLOTS[m], stop_timeout=3.0, turns=True)
                   for m in base.MODELS}  # fmt: skip
        self.send(Catalog(configs))

    def computing(self) -> dict[str, float]:
        busy = {lease.model for _, lease in self.leases if lease.slot}
        self.began = {m: t for m, t in self.began.items() if m in busy}
        for model in busy - self.began.keys():
            self.began[model] = self.now
        return self.began

    @invariant()
    def a_model_computes_beside_another_only_once_its_turn_ran_out(self) -> None:
        starts = sorted(self.computing().values())
        for earlier, later in itertools.pairwise(starts):
            assert later >= earlier + TURN, starts

    @invariant()
    def a_model_waits_for_its_turn_only_while_another_turn_runs(self) -> None:
        sched = self.sched
        if self.closing:
            return
        waiting = [m for m in sched._turn_takers() if sched._waits_for_turn(m)]
        if waiting:
            ends = [t + TURN for t in self.computing().values()]
            assert any(end > self.now for end in ends), (waiting, self.began, self.now)

    @invariant()
    def no_model_waits_that_its_turn_lets_go(self) -> None:
        sched = self.sched
        for model in sched._turn_takers():
            if sched._waits_for_turn(model) and not self.closing:
                assert not sched._turn_allows(model, self.now), (model.name, self.now)


TurnsMachine.TestCase.settings = settings(stateful_step_count=60)
test_turns_machine = TurnsMachine.TestCase
