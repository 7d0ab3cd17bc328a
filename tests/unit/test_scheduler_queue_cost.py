"""What an event costs the scheduler with a long queue: it looks at a few waiters, however many
wait. It looked at every waiter on every event once, so that N requests queued for a load cost
N² looks (5,000 waiters: 13.6 ms an event, on the loop that serves every client). What the
scheduler answers is held to the full scan by tests/unit/test_scheduler_machine.py."""

from __future__ import annotations

import pytest

from node_agent.core.scheduler import Scheduler, _Entry, _Waiter
from node_agent.core.scheduler_events import (
    Catalog,
    Effect,
    Exited,
    Grant,
    Leave,
    ModelConfig,
    Queued,
    Ready,
    Refusal,
    Refuse,
    Release,
    Request,
    Spawn,
    Spawned,
    Tick,
    Unload,
)

QUEUED = 2000
FEW = 12  # looks an event may take: a few per kind of waiter and entry


class Counted(Scheduler):
    """A scheduler that counts its looks at waiters."""

    looks = 0

    def _answer(self, waiter: int, info: _Waiter, entry: _Entry, now: float) -> Effect | None:
        self.looks += 1
        return super()._answer(waiter, info, entry, now)

    def looks_for(self, event: object, now: float) -> tuple[int, list[Effect]]:
        before = self.looks
        effects = self.handle(event, now)  # type: ignore[arg-type]
        return self.looks - before, effects


def _queue_behind_a_load(deadline: float | None) -> Counted:
    """Model a loads (the first request claimed it); QUEUED requests wait for it."""
    sched = Counted(1)
    sched.handle(Catalog({"a": ModelConfig(slots=1), "b": ModelConfig(slots=1)}), 0.0)
    for waiter in range(1, QUEUED + 1):
        sched.handle(Request(waiter, "a", deadline=deadline), 0.0)
    assert sched.statistics().queue == (("a", QUEUED),)
    return sched


@pytest.mark.parametrize("deadline", [None, 60.0])
def test_arrivals_and_departures_behind_a_load_look_at_a_few(deadline: float | None) -> None:
    sched = _queue_behind_a_load(deadline)
    looks, effects = sched.looks_for(Spawned("a", 8001), 0.1)
    assert looks <= FEW
    for waiter in range(QUEUED + 1, QUEUED + 50):
        looks, effects = sched.looks_for(Request(waiter, "a", deadline=deadline), 0.2)
        assert looks <= FEW, looks
        looks, effects = sched.looks_for(Leave(waiter), 0.2)
        assert looks <= FEW, looks
    # Another model's requests queue behind it: they cost no more.
    looks, effects = sched.looks_for(Request(9000, "b", deadline=deadline), 0.3)
    assert looks <= FEW and not any(isinstance(e, Spawn) for e in effects)


def test_a_free_slot_leases_one_waiter_and_looks_at_a_few() -> None:
    sched = _queue_behind_a_load(None)
    sched.handle(Spawned("a", 8001), 0.1)
    looks, effects = sched.looks_for(Ready("a", 8001), 0.2)
    grants = [e for e in effects if isinstance(e, Grant)]
    assert [g.waiter for g in grants] == [1] and looks <= FEW
    for n in range(2, 40):  # each release hands the slot to the next in arrival order
        looks, effects = sched.looks_for(Release(grants[-1].lease), 0.2 + n)
        grants = [e for e in effects if isinstance(e, Grant)]
        assert [g.waiter for g in grants] == [n] and looks <= FEW, looks


def test_deadlines_refuse_only_those_due_with_a_look_each() -> None:
    sched = Counted(1)
    sched.handle(Catalog({"a": ModelConfig(slots=1)}), 0.0)
    sched.handle(Request(1, "a"), 0.0)
    sched.handle(Spawned("a", 8001), 0.0)
    sched.handle(Ready("a", 8001), 0.0)  # waiter 1 holds the only slot from here on
    for waiter in range(2, QUEUED + 2):
        sched.handle(Request(waiter, "a", deadline=10.0 + waiter), 0.0)
    assert sched.wakeup == 12.0
    looks, effects = sched.looks_for(Tick(), 14.5)  # waiters 2, 3 and 4 are due
    assert [e.waiter for e in effects if isinstance(e, Refuse)] == [2, 3, 4]
    assert all(e.kind is Refusal.TIMEOUT for e in effects if isinstance(e, Refuse))
    assert looks <= FEW + 3 and sched.wakeup == 15.0


def test_a_load_under_way_holds_its_waiters_past_their_deadline() -> None:
    sched = _queue_behind_a_load(5.0)
    sched.handle(Spawned("a", 8001), 0.1)
    looks, effects = sched.looks_for(Tick(), 30.0)  # (the timeout does not bound a load)
    assert looks <= FEW and not any(isinstance(e, Refuse) for e in effects)
    looks, effects = sched.looks_for(Exited("a", 1), 31.0)  # it died loading: all fail
    assert sum(isinstance(e, Refuse) for e in effects) == QUEUED


def test_requests_that_may_not_load_are_refused_once_the_model_needs_a_load() -> None:
    sched = _queue_behind_a_load(None)
    sched.handle(Spawned("a", 8001), 0.1)
    first = next(e for e in sched.handle(Ready("a", 8001), 0.2) if isinstance(e, Grant))
    for waiter in range(QUEUED + 1, QUEUED + 4):  # it runs: they wait for its slot
        effects = sched.handle(Request(waiter, "a", may_load=False), 0.3)
        assert any(isinstance(e, Queued) for e in effects)
    sched.handle(Unload("a", "manual"), 0.4)  # it drains: they wait on
    looks, effects = sched.looks_for(Release(first.lease), 0.5)
    assert not any(isinstance(e, Refuse) for e in effects) and looks <= FEW
    looks, effects = sched.looks_for(Exited("a", 0), 0.6)
    refused = [e.waiter for e in effects if isinstance(e, Refuse) and e.kind is Refusal.UNLOADED]
    assert refused == [QUEUED + 1, QUEUED + 2, QUEUED + 3] and looks <= FEW + 3
    assert Spawn("a") in effects  # the others load it again
