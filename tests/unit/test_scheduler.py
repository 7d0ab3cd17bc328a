"""The pure admission scheduler, driven synchronously: no event loop, no sleeps."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from node_agent.core.model_state import ModelState
from node_agent.core.scheduler import DecisionKind, Scheduler
from node_agent.core.scheduler_events import Lease


def make(models_max: int, *names: str) -> Scheduler:
    sched = Scheduler(models_max)
    for name in names:
        sched.add_model(name)
    return sched


def tick(sched: Scheduler) -> list[str]:
    """The victims a tick chose, by name."""
    return [eviction.model for eviction in sched.tick()]


def load(sched: Scheduler, name: str, now: float = 0.0) -> None:
    """Bring a model to LOADED through the normal path (a waiter claims, spawns, ready)."""
    waiter = sched.join(name)
    assert sched.poll(waiter, now).kind is DecisionKind.LOAD
    sched.claim_done(name, spawned=True)
    sched.on_ready(name, now)
    decision = sched.poll(waiter, now)
    assert decision.kind is DecisionKind.LEASED and decision.lease is not None
    sched.release(decision.lease, now)


def test_n_cold_requests_for_one_model_cause_exactly_one_load() -> None:
    sched = make(2, "a")
    waiters = [sched.join("a") for _ in range(50)]
    decisions = [sched.poll(w, 0.0).kind for w in waiters]
    assert decisions.count(DecisionKind.LOAD) == 1
    assert decisions.count(DecisionKind.WAIT) == 49
    assert sched.statistics().queue == (("a", 50),)
    # Polling again while the load runs never grants a second load.
    assert all(sched.poll(w, 0.0).kind is DecisionKind.WAIT for w in waiters[1:])
    sched.claim_done("a", spawned=True)
    assert all(sched.poll(w, 0.0).kind is DecisionKind.WAIT for w in waiters)
    sched.on_ready("a", 1.0)
    leases = [sched.poll(w, 1.0) for w in waiters]
    assert all(d.kind is DecisionKind.LEASED for d in leases)
    assert sched.view("a").in_flight == 50
    assert sched.statistics().queue == ()


def test_fifo_order_across_models_is_by_first_arrival() -> None:
    sched = make(1, "a", "b", "c")
    wb = sched.join("b")
    wa = sched.join("a")
    wb2 = sched.join("b")  # joins b's entry: does not go behind a
    assert [m for m, _ in sched.statistics().queue] == ["b", "a"]
    assert sched.poll(wa, 0).kind is DecisionKind.WAIT  # a is not the head
    assert sched.poll(wb2, 0).kind is DecisionKind.LOAD
    assert sched.poll(wb, 0).kind is DecisionKind.WAIT  # one loader per model
    sched.claim_done("b", spawned=True)
    sched.on_ready("b", 1)
    lease_b = sched.poll(wb, 1).lease
    lease_b2 = sched.poll(wb2, 1).lease
    assert lease_b is not None and lease_b2 is not None
    # b is busy: a must wait (no preemption) even though it is now the head.
    assert tick(sched) == []
    assert sched.poll(wa, 1).kind is DecisionKind.WAIT
    sched.release(lease_b, 2)
    sched.release(lease_b2, 2)
    assert tick(sched) == ["b"]
    sched.on_exited("b", 0, 0.0)
    assert sched.poll(wa, 3).kind is DecisionKind.LOAD


def test_head_only_claim_even_when_capacity_allows_more() -> None:
    sched = make(3, "a", "b")
    wa, wb = sched.join("a"), sched.join("b")
    assert sched.poll(wb, 0).kind is DecisionKind.WAIT  # b is behind a
    assert sched.poll(wa, 0).kind is DecisionKind.LOAD
    # Once a's load is claimed, b is the head and may load in parallel (capacity 3).
    assert sched.poll(wb, 0).kind is DecisionKind.LOAD


def test_capacity_formula_counts_running_stopping_and_claimed() -> None:
    sched = make(2, "a", "b", "c", "d")
    load(sched, "a", 1)
    stats = sched.statistics()
    assert (stats.running, stats.stopping, stats.claimed, stats.free) == (1, 0, 0, 1)
    wb = sched.join("b")
    assert sched.poll(wb, 2).kind is DecisionKind.LOAD
    stats = sched.statistics()
    # claimed but not spawned: it already takes the last slot
    assert (stats.running, stats.claimed, stats.free) == (1, 1, 0)
    wc = sched.join("c")
    assert sched.poll(wc, 2).kind is DecisionKind.WAIT
    assert sched.statistics().needed == 1
    # free (0) < needed (1): a is idle and not wanted -> stopped; it now counts as stopping
    assert tick(sched) == ["a"]
    stats = sched.statistics()
    assert (stats.running, stats.stopping, stats.claimed, stats.free) == (1, 1, 1, 1)
    # A second tick does not stop another model: the stopping one already makes room.
    assert tick(sched) == []
    # ...but c still cannot claim until a has really exited.
    assert sched.poll(wc, 3).kind is DecisionKind.WAIT
    sched.claim_done("b", spawned=True)
    stats = sched.statistics()
    # a (stopping) is about to free its slot: free counts it, so no second victim...
    assert (stats.running, stats.stopping, stats.claimed, stats.free) == (2, 1, 0, 1)
    assert tick(sched) == []
    # ...but c spawns only once a has exited: never more than models_max children alive.
    assert sched.poll(wc, 3).kind is DecisionKind.WAIT
    sched.on_exited("a", 0, 0.0)
    assert sched.poll(wc, 4).kind is DecisionKind.LOAD
    stats = sched.statistics()
    assert (stats.running, stats.stopping, stats.claimed, stats.free) == (1, 0, 1, 0)


def test_unlimited_models_max_never_evicts_for_count() -> None:
    sched = make(0, *"abcdef")
    for name in "abcdef":
        load(sched, name)
    assert sched.statistics().free is None
    assert tick(sched) == []


@pytest.mark.parametrize(
    "rule",
    ["busy", "loading", "stopping", "queued", "pinned"],
)
def test_victim_rules(rule: str) -> None:
    sched = make(1, "old", "new")
    load(sched, "old", 1)
    if rule == "busy":
        assert sched.try_lease("old", 2) is not None
    elif rule == "loading":
        sched.on_exited("old", 0, 0.0)
        w = sched.join("old")
        assert sched.poll(w, 2).kind is DecisionKind.LOAD
        sched.claim_done("old", spawned=True)
        sched.leave(w)
        assert sched.view("old").state is ModelState.LOADING
    elif rule == "stopping":
        assert sched.request_stop("old")
    elif rule == "queued":
        sched.join("old")
        assert sched.request_stop("old")  # queued for a reload after the stop
        sched.on_exited("old", 0, 0.0)
        w = sched.join("old")
        sched.poll(w, 2)
        sched.claim_done("old", spawned=True)
        sched.on_ready("old", 2)
        # the waiter has not leased yet: its entry still wants "old"
    elif rule == "pinned":
        sched.add_model("old", pin=True)
    wn = sched.join("new")
    victims = tick(sched)
    assert victims == []
    assert sched.poll(wn, 3).kind is DecisionKind.WAIT
    assert sched.view("old").stopping is (rule == "stopping")


def test_victim_is_least_recently_used_by_inference_only() -> None:
    sched = make(2, "a", "b", "c")
    load(sched, "a", 1)
    load(sched, "b", 2)
    # A GET /props to b does not make it younger; a completion to a does.
    props = sched.try_lease("b", 10, inference=False)
    assert props is not None
    sched.release(props, 10)
    chat = sched.try_lease("a", 5)
    assert chat is not None
    sched.release(chat, 6)
    sched.join("c")
    assert tick(sched) == ["b"]


def test_priority_orders_victims_before_recency() -> None:
    sched = make(2, "a", "b", "c")
    load(sched, "a", 1)
    load(sched, "b", 2)
    sched.add_model("a", priority=5)  # a is more important, though older
    sched.join("c")
    assert tick(sched) == ["b"]


def test_disconnect_while_queued_leaves_the_queue() -> None:
    sched = make(1, "a", "b")
    load(sched, "a", 1)
    lease = sched.try_lease("a", 2)
    assert lease is not None
    wb = sched.join("b")
    assert sched.poll(wb, 2).kind is DecisionKind.WAIT
    sched.leave(wb)  # the client went away
    assert sched.statistics().queue == ()
    sched.release(lease, 3)
    assert tick(sched) == []  # nobody waits for b any more: a stays


def test_disconnect_of_the_loader_does_not_start_a_second_load() -> None:
    sched = make(2, "a")
    w1, w2 = sched.join("a"), sched.join("a")
    assert sched.poll(w1, 0).kind is DecisionKind.LOAD
    sched.leave(w1)  # the loader's client left; its load goes on
    assert sched.poll(w2, 0).kind is DecisionKind.WAIT
    sched.claim_done("a", spawned=True)
    sched.on_ready("a", 1)
    assert sched.poll(w2, 1).kind is DecisionKind.LEASED


def test_all_waiters_leave_during_a_load_which_goes_on() -> None:
    sched = make(2, "a")
    w = sched.join("a")
    assert sched.poll(w, 0).kind is DecisionKind.LOAD
    sched.leave(w)
    assert sched.statistics().claimed == 1  # the claim survives until the spawn
    sched.claim_done("a", spawned=True)
    assert sched.statistics().queue == ()
    sched.on_ready("a", 1)
    assert sched.view("a").state is ModelState.LOADED


def test_no_preemption_busy_model_is_never_stopped() -> None:
    sched = make(1, "a", "b")
    load(sched, "a", 1)
    stream = sched.try_lease("a", 2)
    assert stream is not None
    wb = sched.join("b")
    for t in range(3, 10):
        assert tick(sched) == []
        assert sched.poll(wb, t).kind is DecisionKind.WAIT
        assert sched.stuck("b")  # a direct /models/load would be told to retry later
    sched.release(stream, 10)
    assert not sched.stuck("b")
    assert tick(sched) == ["a"]


def test_lease_is_atomic_with_readiness_and_blocks_eviction() -> None:
    sched = make(1, "a", "b")
    wa = sched.join("a")
    assert sched.poll(wa, 0).kind is DecisionKind.LOAD
    sched.claim_done("a", spawned=True)
    sched.on_ready("a", 1)
    wb = sched.join("b")  # b arrives between "a is ready" and a's waiter sending
    decision = sched.poll(wa, 1)
    assert decision.kind is DecisionKind.LEASED
    # a is leased: the tick that would make room for b cannot choose it.
    assert tick(sched) == []
    assert sched.poll(wb, 1).kind is DecisionKind.WAIT


def test_stopping_model_takes_no_lease_and_new_requests_reload_it_after() -> None:
    sched = make(2, "a")
    load(sched, "a", 1)
    in_flight = sched.try_lease("a", 2)
    assert in_flight is not None
    assert sched.request_stop("a")  # a manual unload: drain
    assert sched.try_lease("a", 3) is None
    w = sched.join("a")
    assert sched.poll(w, 3).kind is DecisionKind.WAIT  # the old child must exit first
    sched.release(in_flight, 4)
    sched.on_exited("a", 0, 0.0)
    view = sched.view("a")
    assert view.state is ModelState.UNLOADED and not view.failed
    assert sched.poll(w, 5).kind is DecisionKind.LOAD  # never "failed to load"


def test_unload_while_loading_is_not_a_failure_for_waiters() -> None:
    sched = make(1, "a")
    w = sched.join("a")
    assert sched.poll(w, 0).kind is DecisionKind.LOAD
    sched.claim_done("a", spawned=True)
    assert sched.request_stop("a")
    sched.on_exited("a", -9, 0.0)
    assert sched.poll(w, 1).kind is DecisionKind.LOAD


def test_crash_while_loading_fails_its_waiters_and_a_later_request_retries() -> None:
    sched = make(1, "a")
    w1, w2 = sched.join("a"), sched.join("a")
    assert sched.poll(w1, 0).kind is DecisionKind.LOAD
    sched.claim_done("a", spawned=True)
    sched.on_exited("a", 1, 1.0, reason="error loading model")
    for w in (w1, w2):
        decision = sched.poll(w, 1)
        assert decision.kind is DecisionKind.FAILED
        assert decision.reason == "error loading model"
    view = sched.view("a")
    assert (view.state, view.failed, view.exit_code) == (ModelState.UNLOADED, True, 1)
    assert sched.statistics().queue == ()
    w3 = sched.join("a")
    assert sched.poll(w3, 2).kind is DecisionKind.LOAD


def test_spawn_failure_fails_waiters_and_frees_the_claim() -> None:
    sched = make(1, "a", "b")
    wa, wb = sched.join("a"), sched.join("b")
    assert sched.poll(wa, 0).kind is DecisionKind.LOAD
    sched.claim_done("a", spawned=False, reason="no such file")
    assert sched.poll(wa, 0).kind is DecisionKind.FAILED
    assert sched.statistics().claimed == 0
    assert sched.poll(wb, 0).kind is DecisionKind.LOAD


def test_crash_of_a_loaded_model_releases_everything() -> None:
    sched = make(1, "a", "b")
    load(sched, "a", 1)
    lease = sched.try_lease("a", 2)
    assert lease is not None
    sched.on_exited("a", 139, 0.0)
    view = sched.view("a")
    assert (view.state, view.failed, view.exit_code, view.in_flight) == (
        ModelState.UNLOADED,
        True,
        139,
        0,
    )
    sched.release(lease, 3)  # the proxy releases late: harmless
    assert sched.view("a").in_flight == 0
    wb = sched.join("b")
    assert sched.poll(wb, 3).kind is DecisionKind.LOAD


def test_sleeping_model_is_leased_and_may_be_a_victim() -> None:
    sched = make(1, "a", "b")
    load(sched, "a", 1)
    sched.on_sleeping("a")
    lease = sched.try_lease("a", 2)
    assert lease is not None
    sched.on_woke("a")
    sched.release(lease, 3)
    sched.on_sleeping("a")
    sched.join("b")
    assert tick(sched) == ["a"]


def test_model_removed_while_waiting() -> None:
    sched = make(1, "a", "b")
    load(sched, "a", 1)
    assert sched.try_lease("a", 1) is not None
    w = sched.join("b")
    sched.remove_model("b")
    assert sched.poll(w, 2).kind is DecisionKind.GONE
    with pytest.raises(ValueError, match="still running"):
        sched.remove_model("a")


class FakeRoom:
    """The ledger as the scheduler sees it: a fixed budget, sizes per model."""

    def __init__(self, budget: int, sizes: dict[str, int], running: set[str]) -> None:
        self.budget, self.sizes, self.running = budget, sizes, running
        self.asked: list[tuple[str, tuple[str, ...]]] = []

    def shortfall(self, model: str, candidates: Sequence[str]) -> bool:
        used = sum(self.sizes[m] for m in self.running)
        return self.sizes[model] > self.budget - used

    def pick_victim(self, model: str, candidates: Sequence[str]) -> str | None:
        self.asked.append((model, tuple(candidates)))
        return candidates[0] if candidates else None


def test_memory_shortfall_evicts_one_victim_at_a_time() -> None:
    room = FakeRoom(100, {"a": 40, "b": 40, "c": 70}, set())
    sched = Scheduler(0, room)  # unlimited instances: memory is the only limit
    for name in "abc":
        sched.add_model(name)
    for name, t in (("a", 1), ("b", 2)):
        load(sched, name, t)
        room.running.add(name)
    wc = sched.join("c")
    assert sched.poll(wc, 3).kind is DecisionKind.WAIT
    assert tick(sched) == ["a"]  # LRU first
    assert tick(sched) == []  # one at a time: wait for a to exit
    sched.on_exited("a", 0, 0.0)
    room.running.discard("a")
    # b still holds 40: 70 > 100 - 40, so b goes too
    assert sched.poll(wc, 4).kind is DecisionKind.WAIT
    assert tick(sched) == ["b"]
    sched.on_exited("b", 0, 0.0)
    room.running.discard("b")
    assert sched.poll(wc, 5).kind is DecisionKind.LOAD


def test_memory_busy_models_make_requests_wait() -> None:
    room = FakeRoom(100, {"a": 60, "c": 70}, {"a"})
    sched = Scheduler(0, room)
    sched.add_model("a")
    sched.add_model("c")
    load(sched, "a", 1)
    lease = sched.try_lease("a", 2)
    assert isinstance(lease, Lease)
    wc = sched.join("c")
    assert tick(sched) == []
    assert sched.poll(wc, 3).kind is DecisionKind.WAIT
    assert sched.stuck("c")
    sched.release(lease, 4)
    assert tick(sched) == ["a"]


def test_memory_load_anyway_when_nothing_else_runs() -> None:
    room = FakeRoom(100, {"huge": 500}, set())
    sched = Scheduler(0, room)
    sched.add_model("huge")
    w = sched.join("huge")
    assert sched.poll(w, 0).kind is DecisionKind.LOAD


def test_memory_a_granted_load_is_not_nothing_else() -> None:
    # small's load was granted (its memory reserved) but it has not spawned yet: huge must not
    # "load anyway as if alone" next to it (the soak saw 136 MiB held under a 120 MiB limit).
    room = FakeRoom(120, {"small": 16, "huge": 111}, set())
    sched = Scheduler(0, room)
    sched.add_model("small")
    sched.add_model("huge")
    ws = sched.join("small")
    assert sched.poll(ws, 0).kind is DecisionKind.LOAD  # granted: reserved, not yet running
    room.running.add("small")  # the ledger counts it from the grant on
    wh = sched.join("huge")
    assert sched.poll(wh, 0).kind is DecisionKind.WAIT
    sched.claim_done("small", spawned=True)
    sched.on_exited("small", 0, 1.0)
    room.running.discard("small")
    assert sched.poll(wh, 1).kind is DecisionKind.LOAD  # alone now: it goes ahead anyway


def test_memory_stuck_when_no_idle_victim_would_help() -> None:
    room = FakeRoom(100, {"a": 60, "b": 10, "c": 70}, {"a", "b"})

    class OnlyA(FakeRoom):
        def pick_victim(self, model: str, candidates: Sequence[str]) -> str | None:
            return "a" if "a" in candidates else None  # b holds too little to help

    only_a = OnlyA(room.budget, room.sizes, room.running)
    sched = Scheduler(0, only_a)
    for name in "abc":
        sched.add_model(name)
    load(sched, "a", 1)
    load(sched, "b", 2)
    lease = sched.try_lease("a", 3)
    assert lease is not None
    sched.join("c")
    assert tick(sched) == []  # b is idle but evicting it would not fit c
    assert sched.stuck("c")
    sched.release(lease, 4)
    assert not sched.stuck("c")
    assert tick(sched) == ["a"]


def crash_while_loading(sched: Scheduler, name: str, now: float) -> DecisionKind:
    w = sched.join(name)
    decision = sched.poll(w, now)
    if decision.kind is not DecisionKind.LOAD:
        return decision.kind
    sched.claim_done(name, spawned=True)
    sched.on_exited(name, 1, now, reason="error: bad tensor")
    assert sched.poll(w, now).kind is DecisionKind.FAILED
    return DecisionKind.LOAD


def test_crash_loop_backs_off_exponentially_and_says_why() -> None:
    sched = make(1, "a")
    assert crash_while_loading(sched, "a", 0.0) is DecisionKind.LOAD
    # One failure: an immediate retry is allowed.
    assert crash_while_loading(sched, "a", 0.0) is DecisionKind.LOAD
    view = sched.view("a")
    assert (view.failures, view.retry_at, view.error) == (2, 1.0, "error: bad tensor")
    w = sched.join("a")
    decision = sched.poll(w, 0.5)
    assert decision.kind is DecisionKind.BACKOFF
    assert decision.retry_after == 0.5 and decision.reason == "error: bad tensor"
    assert sched.statistics().queue == ()  # the refused waiter left the queue
    assert crash_while_loading(sched, "a", 1.0) is DecisionKind.LOAD
    assert sched.view("a").retry_at == 1.0 + 2.0
    assert crash_while_loading(sched, "a", 3.0) is DecisionKind.LOAD
    assert sched.view("a").retry_at == 3.0 + 4.0


def test_backoff_is_capped_and_resets_after_a_clean_stop() -> None:
    from node_agent.core.scheduler import BACKOFF_CAP, backoff_delay

    assert [backoff_delay(n) for n in (0, 1, 2, 3, 4)] == [0.0, 0.0, 1.0, 2.0, 4.0]
    assert backoff_delay(100) == BACKOFF_CAP
    sched = make(1, "a")
    crash_while_loading(sched, "a", 0.0)
    crash_while_loading(sched, "a", 0.0)
    load(sched, "a", 5.0)
    assert sched.request_stop("a")
    sched.on_exited("a", 0, 6.0)
    view = sched.view("a")
    assert (view.failures, view.retry_at, view.failed) == (0, 0.0, False)


def test_a_crash_after_a_stable_run_is_not_a_loop() -> None:
    from node_agent.core.scheduler import STABLE_SECONDS

    sched = make(1, "a")
    crash_while_loading(sched, "a", 0.0)
    load(sched, "a", 1.0)
    sched.on_exited("a", -11, 1.0 + STABLE_SECONDS)
    assert sched.view("a").failures == 1
    assert crash_while_loading(sched, "a", 1.0 + STABLE_SECONDS) is DecisionKind.LOAD


def test_ttl_counts_from_the_end_of_the_last_request() -> None:
    sched = make(4, "a", "b", "c")
    load(sched, "a", 0.0)
    load(sched, "b", 0.0)
    load(sched, "c", 0.0)
    sched.add_model("c", pin=True)
    lease = sched.try_lease("b", 1.0)
    assert lease is not None
    ttls = {"a": 10.0, "b": 10.0, "c": 10.0}
    assert sched.expired(9.9, ttls) == []
    # a is idle since 0; b is busy (never expires while in flight); c is pinned.
    assert sched.expired(10.0, ttls) == ["a"]
    assert sched.expired(50.0, ttls) == ["a"]
    sched.release(lease, 45.0)
    assert sched.expired(50.0, ttls) == ["a"]
    assert sched.expired(55.0, ttls) == ["a", "b"]
    assert sched.expired(55.0, {"b": 20.0}) == []  # no TTL for a: it stays


def test_evictions_say_which_limit_chose_them() -> None:
    sched = make(1, "a", "b")
    load(sched, "a", 1)
    sched.join("b")
    assert [(e.model, e.reason) for e in sched.tick()] == [("a", "count")]
    room = FakeRoom(100, {"a": 60, "b": 60}, {"a"})
    sched = Scheduler(0, room)
    sched.add_model("a")
    sched.add_model("b")
    load(sched, "a", 1)
    sched.join("b")
    assert [(e.model, e.reason) for e in sched.tick()] == [("a", "memory")]


def test_residents_are_the_running_models_not_stopping_in_start_order() -> None:
    """What a router outside the agent is told (api/routing_metrics.py)."""
    sched = make(0, "a", "b", "c", "d", "e")
    load(sched, "b", 1)
    load(sched, "a", 2)
    load(sched, "d", 3)
    sched.on_sleeping("d")
    waiter = sched.join("c")
    assert sched.poll(waiter, 4).kind is DecisionKind.LOAD
    sched.claim_done("c", spawned=True)  # spawned, not ready: loading
    assert sched.residents() == ["b", "a", "d", "c"]
    assert sched.request_stop("a")  # draining: no longer a place to send requests
    assert sched.residents() == ["b", "d", "c"]
    sched.on_exited("a", 0, 5.0)
    assert sched.residents() == ["b", "d", "c"]
