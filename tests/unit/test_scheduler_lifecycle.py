"""The scheduler's closing, drains, state transitions and wait reasons (pure, synchronous)."""

from __future__ import annotations

import pytest

from node_agent.core.model_state import MODEL_TRANSITIONS, IllegalTransition, ModelState, Transition
from node_agent.core.scheduler import DecisionKind
from tests.unit.test_scheduler import load, make


def test_closing_refuses_every_waiter_and_every_lease() -> None:
    sched = make(2, "a", "b")
    load(sched, "a")
    waiter = sched.join("b")
    assert sched.close() == ["a"]  # the running model, now stopping
    assert sched.view("a").stopping
    assert sched.poll(waiter, 1.0).kind is DecisionKind.CLOSING
    assert sched.view("b").queued == 0  # it left the queue
    assert sched.try_lease("a", 1.0) is None
    late = sched.join("b")
    assert sched.poll(late, 1.0).kind is DecisionKind.CLOSING


def test_closing_stops_a_claimed_load_from_spawning() -> None:
    sched = make(2, "a")
    waiter = sched.join("a")
    assert sched.poll(waiter, 0.0).kind is DecisionKind.LOAD
    sched.close()
    sched.claim_done("a", spawned=False, reason="the agent is shutting down")
    decision = sched.poll(waiter, 0.0)
    assert (decision.kind, decision.reason) == (DecisionKind.FAILED, "the agent is shutting down")
    assert not sched.view("a").failed  # a withdrawn load is no failure of the model
    assert sched.view("a").state is ModelState.UNLOADED


def test_a_drain_is_over_when_nothing_is_in_flight_or_its_deadline_passed() -> None:
    sched = make(2, "a")
    load(sched, "a")
    lease = sched.try_lease("a", 0.0)
    assert lease is not None
    assert sched.request_stop("a")
    sched.begin_drain("a", 10.0)
    assert not sched.drain_over("a", 9.9)
    assert sched.drain_over("a", 10.0)  # the deadline: its streams are cut
    sched.release(lease, 5.0)
    assert sched.drain_over("a", 5.0)  # nothing in flight: stop at once


def test_the_earlier_drain_deadline_wins() -> None:
    sched = make(2, "a")
    load(sched, "a")
    assert sched.try_lease("a", 0.0) is not None
    sched.request_stop("a")
    sched.begin_drain("a", 10.0)  # its stop timeout
    sched.begin_drain("a", 4.0)  # the shutdown's bound
    sched.begin_drain("a", 30.0)  # a later one changes nothing
    assert not sched.drain_over("a", 3.9)
    assert sched.drain_over("a", 4.0)


def test_an_exit_clears_the_drain() -> None:
    sched = make(2, "a")
    load(sched, "a")
    sched.request_stop("a")
    sched.begin_drain("a", 10.0)
    sched.on_exited("a", 0, 1.0)
    load(sched, "a", 2.0)
    assert sched.try_lease("a", 2.0) is not None
    assert sched.request_stop("a")
    sched.begin_drain("a", 20.0)  # the old deadline (10) is gone with the old child
    assert not sched.drain_over("a", 15.0)


def test_every_transition_is_recorded_once_in_order() -> None:
    sched = make(2, "a")
    sched.take_transitions()
    load(sched, "a", 1.0)
    sched.on_sleeping("a")
    sched.on_woke("a")
    sched.request_stop("a")
    sched.on_exited("a", 0, 2.0)
    states = [(t.old, t.new) for t in sched.take_transitions()]
    U, L, R, S = ModelState.UNLOADED, ModelState.LOADING, ModelState.LOADED, ModelState.SLEEPING
    assert states == [(U, L), (L, R), (R, S), (S, R), (R, U)]
    assert sched.take_transitions() == []
    assert all(new in MODEL_TRANSITIONS[old] for old, new in states)


def test_an_illegal_transition_raises() -> None:
    sched = make(2, "a")
    with pytest.raises(IllegalTransition, match="unloaded -> loaded"):
        sched.on_ready("a", 0.0)


def test_sleep_and_wake_events_out_of_turn_change_nothing() -> None:
    sched = make(2, "a")
    sched.on_sleeping("a")  # not loaded: a late event of a child already gone
    sched.on_woke("a")
    assert sched.view("a").state is ModelState.UNLOADED
    assert sched.take_transitions() == []


def test_a_failed_spawn_fails_its_waiters_and_counts_for_the_backoff() -> None:
    sched = make(2, "a")
    waiters = [sched.join("a") for _ in range(2)]
    assert sched.poll(waiters[0], 0.0).kind is DecisionKind.LOAD
    sched.on_spawn_failed("a", 0.0, "cannot execute llama-server")
    for waiter in waiters:
        decision = sched.poll(waiter, 0.0)
        assert decision.kind is DecisionKind.FAILED
        assert decision.reason == "cannot execute llama-server"
    view = sched.view("a")
    assert view.failed and view.failures == 1 and view.state is ModelState.UNLOADED
    assert sched.take_transitions() == []  # it never was loading


def test_wait_reasons_name_the_busy_instances() -> None:
    sched = make(2, "a", "b", "c")
    load(sched, "a")
    load(sched, "b")
    assert sched.try_lease("a", 0.0) is not None
    assert sched.try_lease("b", 0.0) is not None
    waiter = sched.join("c")
    assert sched.poll(waiter, 0.0).kind is DecisionKind.WAIT
    assert sched.wait_reason("c") == "all 2 instances busy: a (1 in flight), b (1 in flight)"


def test_wait_reasons_for_a_load_a_stop_and_the_queue() -> None:
    sched = make(1, "a", "b", "c")
    waiter = sched.join("a")
    assert sched.poll(waiter, 0.0).kind is DecisionKind.LOAD
    sched.claim_done("a", spawned=True)
    assert sched.wait_reason("a") == "a is loading"
    sched.on_ready("a", 0.0)
    lease = sched.poll(waiter, 0.0).lease
    assert lease is not None
    b, c = sched.join("b"), sched.join("c")
    assert sched.poll(b, 0.0).kind is DecisionKind.WAIT
    assert sched.poll(c, 0.0).kind is DecisionKind.WAIT
    assert sched.wait_reason("c") == "queued behind b, which waits for room"
    sched.request_stop("a")
    assert sched.wait_reason("a") == "a is stopping (1 in flight)"


def test_transition_records_are_values() -> None:
    assert Transition("a", ModelState.UNLOADED, ModelState.LOADING) == Transition(
        "a", ModelState.UNLOADED, ModelState.LOADING
    )
