"""The scheduler's one entry point, ``handle(event, now) -> effects``: each case is a list of
events and the effects they must (and must only) produce, as llama-swap's scheduler tests do."""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import pytest

from node_agent.core.model_state import ModelState, Transition
from node_agent.core.scheduler import Scheduler
from node_agent.core.scheduler_events import (
    Catalog,
    ChildFault,
    Close,
    Drain,
    Effect,
    Event,
    Exited,
    Grant,
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
    Spawn,
    Spawned,
    SpawnFailed,
    Started,
    Stop,
    Tick,
    Unload,
)

_WAITERS = itertools.count(1000)


def handle(sched: Scheduler, event: Event, now: float) -> list[Effect]:
    """``sched.handle`` less the state changes it reports (tests of those say so)."""
    return [e for e in sched.handle(event, now) if not isinstance(e, Transition)]


def make(models_max: int = 2, slots: int = 1, **configs: ModelConfig) -> Scheduler:
    sched = Scheduler(models_max)
    models = configs or {"a": ModelConfig(slots=slots, stop_timeout=5.0)}
    assert handle(sched, Catalog(models), 0.0) == []
    return sched


def request(
    sched: Scheduler, model: str = "a", now: float = 0.0, **how: object
) -> tuple[int, list[Effect]]:
    waiter = next(_WAITERS)
    return waiter, handle(sched, Request(waiter, model, **how), now)  # type: ignore[arg-type]


def loaded(sched: Scheduler, model: str = "a", port: int = 7001, now: float = 0.0) -> None:
    """Bring ``model`` to LOADED through the events a real load sends."""
    waiter, effects = request(sched, model, now)
    assert effects == [Spawn(model), Queued(waiter, model, f"{model} is loading", slot=False)] or (
        Spawn(model) in effects
    ), effects
    assert handle(sched, Spawned(model, port), now) == []
    (grant,) = handle(sched, Ready(model), now)
    assert isinstance(grant, Grant) and grant.waiter == waiter
    assert handle(sched, Release(grant.lease), now) == []


def grants(effects: Sequence[Effect]) -> list[int]:
    return [e.waiter for e in effects if isinstance(e, Grant)]


def test_a_warm_request_is_granted_at_once_with_the_childs_address() -> None:
    sched = make(slots=4)
    loaded(sched)
    waiter, effects = request(sched, now=1.0)
    assert effects == [Grant(waiter, Lease("a", effects[0].lease.id, True, True, 7001))]  # type: ignore[union-attr]


def test_cold_requests_cause_one_spawn_and_are_granted_at_ready_up_to_the_slots() -> None:
    sched = make(slots=2)
    first, effects = request(sched)
    assert effects == [Spawn("a"), Queued(first, "a", "a is loading", slot=False)]
    others = [request(sched)[0] for _ in range(3)]
    assert handle(sched, Spawned("a", 7001), 0.1) == []
    effects = handle(sched, Ready("a"), 0.5)
    assert grants(effects) == [first, others[0]]  # two slots, in arrival order
    assert sched.view("a").queued == 2


def test_a_release_hands_the_slot_to_the_next_waiter_in_arrival_order() -> None:
    sched = make(slots=1)
    loaded(sched)
    _, effects = request(sched, now=1.0)
    (lease,) = [e.lease for e in effects if isinstance(e, Grant)]
    queued = [request(sched, now=1.0) for _ in range(3)]
    for waiter, effects in queued:
        assert effects == [Queued(waiter, "a", "all 1 slots of its server stayed busy", slot=True)]
    effects = handle(sched, Release(lease), 2.0)
    assert grants(effects) == [queued[0][0]]  # exactly one: no herd


def test_a_request_that_did_not_reach_the_child_when_its_model_stops_waits_for_the_reload() -> None:
    """Issue 27: the waiters at the slot gate hold no lease, so the drain ends with the one
    request in flight, the child is stopped without a cut, and the waiters load it again."""
    sched = make(slots=1)
    loaded(sched)
    _, effects = request(sched, now=1.0)
    (lease,) = [e.lease for e in effects if isinstance(e, Grant)]
    waiters = [request(sched, now=1.0)[0] for _ in range(3)]
    assert handle(sched, Unload("a", "manual"), 1.0) == [Drain("a", "manual", 6.0)]
    assert handle(sched, Release(lease), 1.5) == [Stop("a", cut=False)]
    assert handle(sched, Exited("a", 0), 1.6) == [Spawn("a")]
    assert handle(sched, Spawned("a", 7002), 1.7) == []
    effects = handle(sched, Ready("a"), 2.0)
    assert grants(effects) == waiters[:1]
    assert all(isinstance(e, Grant) for e in effects)
    assert effects[0].lease.port == 7002  # type: ignore[union-attr]


def test_a_drain_past_its_bound_stops_the_child_with_a_cut() -> None:
    sched = make(slots=1)
    loaded(sched)
    request(sched, now=1.0)
    assert handle(sched, Unload("a", "manual"), 1.0) == [Drain("a", "manual", 6.0)]
    assert sched.next_wakeup(1.0) == 6.0
    assert handle(sched, Tick(), 5.9) == []
    assert handle(sched, Tick(), 6.0) == [Stop("a", cut=True)]
    assert handle(sched, Tick(), 7.0) == []  # told once


def test_one_timeout_bounds_the_wait_for_a_slot_but_not_a_load_under_way() -> None:
    sched = make(slots=1)
    waiter, effects = request(sched, deadline=1.0)
    assert Spawn("a") in effects
    assert sched.next_wakeup(0.0) is None  # loading: no deadline applies
    assert handle(sched, Tick(), 5.0) == []
    handle(sched, Spawned("a", 7001), 5.0)
    (grant,) = handle(sched, Ready("a"), 6.0)
    assert grant == Grant(waiter, grant.lease)  # type: ignore[union-attr]
    slow, effects = request(sched, now=6.0, deadline=8.0)
    assert effects == [Queued(slow, "a", "all 1 slots of its server stayed busy", slot=True)]
    assert sched.next_wakeup(6.0) == 8.0
    assert handle(sched, Tick(), 8.0) == [
        Refuse(slow, Refusal.TIMEOUT, "all 1 slots of its server stayed busy")
    ]
    assert sched.view("a").queued == 0


def test_max_queue_refuses_beyond_the_bound_counting_slot_waiters() -> None:
    sched = Scheduler(2, max_queue=2)
    handle(sched, Catalog({"a": ModelConfig(slots=1)}), 0.0)
    loaded(sched)
    request(sched, now=1.0)  # takes the slot
    request(sched, now=1.0)
    request(sched, now=1.0)
    waiter, effects = request(sched, now=1.0)
    assert effects == [Refuse(waiter, Refusal.FULL, limit=2)]


def test_autoload_off_refuses_an_unloaded_model_and_never_spawns() -> None:
    sched = make()
    waiter, effects = request(sched, may_load=False)
    assert effects == [Refuse(waiter, Refusal.UNLOADED)]


def test_a_direct_load_is_answered_once_the_child_exists_and_refused_when_it_runs() -> None:
    sched = make()
    waiter, effects = request(sched, direct=True)
    assert effects[0] == Spawn("a")
    assert handle(sched, Spawned("a", 7001), 0.1) == [Started(waiter)]
    again, effects = request(sched, direct=True, now=0.2)
    assert effects == [Refuse(again, Refusal.RUNNING)]


def test_a_direct_load_that_only_busy_models_could_make_room_for_is_refused() -> None:
    sched = make(1, a=ModelConfig(slots=1), b=ModelConfig(slots=1))
    loaded(sched, "a")
    request(sched, "a", 1.0)  # a is busy: no victim
    waiter, effects = request(sched, "b", 1.0, direct=True)
    assert effects == [Refuse(waiter, Refusal.LIMIT)]


def granted(sched: Scheduler, now: float, **how: object) -> Lease:
    """The lease of a request for the loaded model "a"."""
    _, effects = request(sched, "a", now, **how)
    (grant,) = effects
    assert isinstance(grant, Grant), effects
    return grant.lease


def test_a_requests_keep_alive_governs_the_idle_time_after_that_request_only() -> None:
    sched = make(slots=1)  # the model's own idle time: never
    loaded(sched)
    lease = granted(sched, 1.0, keep_alive=30.0)
    assert lease.keep_alive == 30.0
    assert handle(sched, Release(lease), 2.0) == []
    assert sched.view("a").ttl == 30.0
    assert sched.next_wakeup(2.0) == 32.0
    assert handle(sched, Tick(), 31.0) == []
    # The next request gives none: the model's own (never) again, once it ends.
    lease = granted(sched, 3.0)
    assert handle(sched, Release(lease), 4.0) == []
    assert sched.view("a").ttl is None
    assert sched.next_wakeup(4.0) is None


def test_keep_alive_0_unloads_the_model_once_its_request_ends() -> None:
    sched = make(slots=1)
    loaded(sched)
    lease = granted(sched, 1.0, keep_alive=0.0)
    assert handle(sched, Release(lease), 2.0) == [Drain("a", "ttl", 7.0), Stop("a", cut=False)]
    assert handle(sched, Exited("a", 0), 2.5) == []
    # Loaded again by a request that gives none: it stays (the model's own idle time).
    waiter, effects = request(sched, "a", 3.0)
    assert Spawn("a") in effects
    handle(sched, Spawned("a", 7002), 3.1)
    (grant,) = handle(sched, Ready("a"), 3.2)
    assert isinstance(grant, Grant) and grant.waiter == waiter
    assert handle(sched, Release(grant.lease), 3.3) == []
    assert sched.view("a").ttl is None
    assert sched.next_wakeup(3.3) is None


def test_a_run_that_ends_takes_its_last_keep_alive_with_it() -> None:
    sched = make(a=ModelConfig(slots=1, ttl=60.0, stop_timeout=5.0))
    loaded(sched)
    assert handle(sched, Release(granted(sched, 1.0, keep_alive=None)), 2.0) == []
    assert sched.view("a").ttl is None  # forever, as its request said
    handle(sched, Unload("a", "manual"), 3.0)
    assert handle(sched, Exited("a", 0), 3.5) == []
    assert sched.view("a").ttl == 60.0  # its preset's, for whatever loads it next


def test_a_lease_that_is_no_use_leaves_the_keep_alive_as_it_was() -> None:
    sched = make(slots=1)
    loaded(sched)
    assert handle(sched, Release(granted(sched, 1.0, keep_alive=30.0)), 2.0) == []
    # GET /props?model=a, a conversation's replay: not a use of the model.
    assert handle(sched, Release(granted(sched, 3.0, inference=False, slot=False)), 3.5) == []
    assert sched.view("a").ttl == 30.0


def test_a_count_eviction_drains_the_idle_victim_for_the_head() -> None:
    sched = make(1, a=ModelConfig(slots=1), b=ModelConfig(slots=1))
    loaded(sched, "a")
    waiter, effects = request(sched, "b", 1.0)
    assert effects == [
        Drain("a", "count", 11.0, evicted_for="b"),
        Stop("a", cut=False),
        Queued(waiter, "b", "all 1 instances busy: a (stopping)", slot=False),
    ]
    assert handle(sched, Exited("a", 0), 1.1) == [Spawn("b")]


def test_closing_refuses_waiters_and_drains_everything_even_a_late_spawn() -> None:
    sched = make(2, a=ModelConfig(slots=1), b=ModelConfig(slots=1))
    loaded(sched, "a")
    request(sched, "a", 1.0)  # in flight
    waiter, _ = request(sched, "b", 1.0)  # spawning
    effects = handle(sched, Close(drain_until=3.0), 1.0)
    assert Drain("a", "shutdown", 3.0) in effects
    assert Refuse(waiter, Refusal.CLOSING) in effects
    late, effects = request(sched, "a", 1.1)
    assert effects == [Refuse(late, Refusal.CLOSING)]
    # Spawned as the agent closed: stopped at once, within the shutdown's bound.
    assert handle(sched, Spawned("b", 7002), 1.2) == [Drain("b", "shutdown", 3.0), Stop("b", False)]


def test_a_withdrawn_load_fails_its_waiters_without_counting_against_the_model() -> None:
    sched = make()
    waiter, _ = request(sched)
    effects = handle(sched, SpawnFailed("a", "the agent is shutting down", count=False), 0.1)
    assert effects == [Refuse(waiter, Refusal.FAILED, "the agent is shutting down")]
    assert sched.view("a").failures == 0


def test_a_crash_while_loading_fails_its_waiters_and_backs_off_after_the_second() -> None:
    sched = make()
    for attempt, now in ((1, 0.0), (2, 1.0)):
        waiter, effects = request(sched, now=now)
        assert Spawn("a") in effects
        handle(sched, Spawned("a", 7000 + attempt), now)
        effects = handle(sched, Exited("a", 1, "bad file"), now + 0.1)
        assert effects == [Refuse(waiter, Refusal.FAILED, "bad file")]
    waiter, effects = request(sched, now=1.2)
    (refuse,) = effects
    assert isinstance(refuse, Refuse) and refuse.kind is Refusal.BACKOFF
    assert refuse.retry_after > 0


def test_a_model_that_keeps_failing_loads_at_once_when_its_arguments_or_file_change() -> None:
    """A fixed preset, or a good file copied over a truncated one, waited out the backoff of
    the old one's failures (up to a minute of 503s); a change in place (a TTL) still waits."""
    sched = make()
    for attempt, now in ((1, 0.0), (2, 1.0), (3, 2.5)):
        waiter, effects = request(sched, now=now)
        assert Spawn("a") in effects
        handle(sched, Spawned("a", 7000 + attempt), now)
        effects = handle(sched, Exited("a", 1, "bad file"), now + 0.1)
        assert effects == [Refuse(waiter, Refusal.FAILED, "bad file")]
    assert handle(sched, Catalog({"a": ModelConfig(slots=1, ttl=60.0)}), 2.7) == []
    _, effects = request(sched, now=2.8)
    assert [e.kind for e in effects if isinstance(e, Refuse)] == [Refusal.BACKOFF]
    assert handle(sched, Catalog({"a": ModelConfig(slots=1)}, frozenset({"a"})), 2.9) == []
    assert Spawn("a") in request(sched, now=3.0)[1]
    assert sched.view("a").failures == 0  # a fresh start: a failure now is its first


def test_a_model_that_failed_is_no_longer_failed_once_its_arguments_or_file_change() -> None:
    """GET /models showed the new arguments as failed (exit code, the old file's error line)
    with no failure counted; a running model whose arguments change stops without one too."""
    sched = make()
    for attempt, now in ((1, 0.0), (2, 1.0)):
        request(sched, now=now)
        handle(sched, Spawned("a", 7000 + attempt), now)
        handle(sched, Exited("a", 1, "bad file"), now + 0.1)
    assert sched.view("a").failed and sched.view("a").failures == 2
    handle(sched, Catalog({"a": ModelConfig(slots=1)}, frozenset({"a"})), 2.0)
    view = sched.view("a")
    assert (view.failed, view.failures, view.retry_at) == (False, 0, 0.0), view


def test_the_catalog_removes_gone_models_once_stopped_and_reloads_changed_ones() -> None:
    sched = make(2, a=ModelConfig(slots=1), b=ModelConfig(slots=1), c=ModelConfig(slots=1))
    loaded(sched, "a")
    loaded(sched, "b")
    effects = handle(sched, Catalog({"b": ModelConfig(slots=2)}, frozenset({"b"})), 1.0)
    assert effects == [
        Drain("a", "reload", 11.0),
        Removed("c"),
        Drain("b", "reload", 11.0),
        Stop("a", cut=False),
        Stop("b", cut=False),
    ]
    waiter, effects = request(sched, "a", 1.0)
    assert effects == [Refuse(waiter, Refusal.GONE)]
    assert handle(sched, Exited("a", 0), 1.1) == [Removed("a")]
    assert handle(sched, Exited("b", 0), 1.1) == []
    assert "b" in sched and sched.view("b").state is ModelState.UNLOADED


def test_a_model_that_leaves_the_catalog_while_its_load_was_granted_goes_once_it_reports() -> None:
    """It was forgotten at once, and the load's report then raised KeyError in handle."""
    for spawned in (True, False):
        sched = make(2, a=ModelConfig(slots=1), c=ModelConfig(slots=1))
        waiter, effects = request(sched, "c")
        assert Spawn("c") in effects
        effects = handle(sched, Catalog({"a": ModelConfig(slots=1)}), 0.1)
        assert effects == [Refuse(waiter, Refusal.GONE)]
        if spawned:  # its child runs: it stops, and goes once it has exited
            assert handle(sched, Spawned("c", 7001), 0.2) == [
                Drain("c", "reload", 10.2),
                Stop("c", cut=False),
            ]
            assert handle(sched, Exited("c", 0), 0.3) == [Removed("c")]
        else:
            assert handle(sched, SpawnFailed("c", "no binary"), 0.2) == [Removed("c")]
        assert "c" not in sched and sched.statistics().queue == ()


@pytest.mark.parametrize(
    ("event", "reason"),
    [
        (Catalog({"a": ModelConfig(slots=2, stop_timeout=5.0)}, frozenset({"a"})), "reload"),
        (Unload("a", "remove"), "remove"),
    ],
)
def test_a_model_changed_or_removed_while_its_load_was_granted_stops_once_spawned(
    event: Event, reason: str
) -> None:
    """Its child ran the old arguments until next stopped, and a reload waited for that;
    ``DELETE /models`` (``Unload(remove)``) was ignored, and the route waited for that child
    to end (until its TTL; review of 12ca46d)."""
    sched = make(2, a=ModelConfig(slots=1, stop_timeout=5.0))
    waiter, effects = request(sched, "a")
    assert Spawn("a") in effects
    assert handle(sched, event, 0.1) == []  # nothing runs yet: nothing to stop
    assert handle(sched, Spawned("a", 7001), 0.2) == [
        Drain("a", reason, 5.2),
        Stop("a", cut=False),
    ]
    # The waiter loads it again (with the new arguments); a later spawn is not stopped.
    assert handle(sched, Exited("a", 0), 0.3) == [Spawn("a")]
    assert handle(sched, Spawned("a", 7002), 0.4) == []
    assert grants(handle(sched, Ready("a"), 0.5)) == [waiter]


def test_a_failed_spawn_of_a_changed_models_child_loads_the_new_arguments() -> None:
    """The spawn of the old arguments failed (count=True: a port, a download, the binary) and
    its waiters were refused with that failure, the model shown failed and backed off, though
    they had waited for the new arguments (stop 43's notes)."""
    sched = make(2, a=ModelConfig(slots=1, stop_timeout=5.0))
    waiter, effects = request(sched, "a")
    assert Spawn("a") in effects
    changed = Catalog({"a": ModelConfig(slots=2, stop_timeout=5.0)}, frozenset({"a"}))
    assert handle(sched, changed, 0.1) == []
    assert handle(sched, SpawnFailed("a", "old arguments failed"), 0.2) == [Spawn("a")]
    view = sched.view("a")
    assert (view.failed, view.failures, view.error) == (False, 0, None)
    # The new arguments' own failure is theirs: the waiter is refused with it.
    assert handle(sched, SpawnFailed("a", "new arguments failed"), 0.3) == [
        Refuse(waiter, Refusal.FAILED, "new arguments failed")
    ]
    assert sched.view("a").failed


def test_a_waiter_that_leaves_is_forgotten_and_its_load_goes_on() -> None:
    sched = make()
    waiter, effects = request(sched)
    assert Spawn("a") in effects
    assert handle(sched, Leave(waiter), 0.1) == []
    assert handle(sched, Spawned("a", 7001), 0.2) == []
    assert handle(sched, Ready("a"), 0.3) == []
    assert sched.view("a").state is ModelState.LOADED


def test_each_state_change_is_an_effect_ahead_of_what_it_causes() -> None:
    sched = make()
    waiter, _ = request(sched)
    effects = sched.handle(Spawned("a", 7001), 0.1)
    assert effects == [Transition("a", ModelState.UNLOADED, ModelState.LOADING)]
    effects = sched.handle(Ready("a", 7001), 0.2)
    assert effects[0] == Transition("a", ModelState.LOADING, ModelState.LOADED)
    assert grants(effects[1:]) == [waiter]


def test_a_stalled_request_kills_its_child_as_wedged_and_the_model_loads_again() -> None:
    """Issue 28: a child whose /health is fine but that stalls a request, and fails the
    agent's probe too, is replaced."""
    sched = make(slots=2)
    loaded(sched)
    _, effects = request(sched, now=1.0)
    (stalled,) = [e.lease for e in effects if isinstance(e, Grant)]
    _, effects = request(sched, now=1.0)
    (other,) = [e.lease for e in effects if isinstance(e, Grant)]  # in flight: it is cut
    effects = handle(sched, Release(stalled, ChildFault.STALLED), 5.0)
    why = "a request it accepted got no byte from it within --timeout"
    assert effects == [Probe("a", 7001, why)]
    broken = "its main loop answered no GET /slots within 600s"
    effects = handle(sched, Probed("a", 7001, broken), 6.0)
    assert effects == [Drain("a", "wedged", 6.0), Stop("a", cut=True)]
    waiter, effects = request(sched, now=6.1)  # takes no new request meanwhile
    assert not grants(effects)
    assert handle(sched, Exited("a", -9), 6.2) == [Spawn("a")]
    view = sched.view("a")
    assert view.failed and view.error == f"killed as wedged: {why}, and {broken}"
    handle(sched, Spawned("a", 7002), 6.3)
    assert grants(handle(sched, Ready("a", 7002), 6.4)) == [waiter]
    assert handle(sched, Release(other, ChildFault.STALLED), 6.5) == []  # the old child's


def test_errors_in_a_row_make_a_suspect_and_a_success_resets_the_count() -> None:
    sched = Scheduler(2, child_errors=3)
    sched.handle(Catalog({"a": ModelConfig(slots=1, stop_timeout=5.0)}), 0.0)
    loaded(sched)

    def answered(fault: ChildFault | None, now: float) -> list[Effect]:
        _, effects = request(sched, now=now)
        (lease,) = [e.lease for e in effects if isinstance(e, Grant)]
        return handle(sched, Release(lease, fault), now)

    assert answered(ChildFault.SERVER_ERROR, 1.0) == []
    assert answered(ChildFault.SERVER_ERROR, 1.1) == []
    assert answered(None, 1.2) == []  # one good answer: not suspect
    assert answered(ChildFault.SERVER_ERROR, 1.3) == []
    assert answered(ChildFault.SERVER_ERROR, 1.4) == []
    why = "3 requests in a row failed with its own 5xx"
    assert answered(ChildFault.SERVER_ERROR, 1.5) == [Probe("a", 7001, why)]
    assert handle(sched, Probed("a", 7001, "a one-token completion answered 500"), 1.6) == [
        Drain("a", "wedged", 1.6),
        Stop("a", cut=False),
    ]
    assert sched.wedged_why("a") == f"{why}, and a one-token completion answered 500"


def test_a_clients_own_failures_never_cut_another_clients_request() -> None:
    """Issue 50 row 1: b11434 answers 500 to requests that are only their client's mistake
    (an image for a text model, an unknown token to detokenize). However many such requests
    come, and stalls of its own long answers, a child that answers the agent's probe is not
    wedged: the other client's request in flight runs on, and the child takes new ones."""
    sched = Scheduler(2, child_errors=3)
    sched.handle(Catalog({"a": ModelConfig(slots=4, stop_timeout=5.0)}), 0.0)
    loaded(sched)
    _, effects = request(sched, now=1.0)
    (victim,) = [e.lease for e in effects if isinstance(e, Grant)]
    probes = []
    for i in range(30):
        now = 1.0 + i / 10
        _, effects = request(sched, now=now)
        (lease,) = [e.lease for e in effects if isinstance(e, Grant)]
        fault = ChildFault.STALLED if i % 10 == 9 else ChildFault.SERVER_ERROR
        effects = handle(sched, Release(lease, fault), now)
        assert not [e for e in effects if isinstance(e, Drain | Stop)], effects
        probes += [e for e in effects if isinstance(e, Probe)]
        if probes and i % 4 == 3:  # the probe answers a while later: healthy
            assert handle(sched, Probed("a", 7001, None), now) == []
            probes.clear()
    view = sched.view("a")
    assert view.state is ModelState.LOADED and not view.stopping and view.in_flight == 1
    assert handle(sched, Release(victim), 5.0) == []  # the victim's request ended as it would
    assert sched.wedged_why("a") == ""


def test_one_probe_at_a_time_and_a_verdict_on_a_gone_child_says_nothing() -> None:
    sched = Scheduler(2, child_errors=1)
    sched.handle(Catalog({"a": ModelConfig(slots=4, stop_timeout=5.0)}), 0.0)
    loaded(sched)
    leases = []
    for _ in range(3):
        _, effects = request(sched, now=1.0)
        leases += [e.lease for e in effects if isinstance(e, Grant)]
    assert len(handle(sched, Release(leases[0], ChildFault.SERVER_ERROR), 1.1)) == 1  # a Probe
    assert handle(sched, Release(leases[1], ChildFault.STALLED), 1.2) == []  # probed already
    assert handle(sched, Probed("a", 9999, "broken"), 1.3) == []  # another child's
    handle(sched, Unload("a", "manual"), 1.4)
    handle(sched, Release(leases[2]), 1.5)
    handle(sched, Exited("a", 0), 1.6)
    assert handle(sched, Probed("a", 7001, "broken"), 1.7) == []  # that child has gone
    assert not sched.view("a").failed


class HeldRoom:
    """A room as the ledger is one: a model holds memory from its Spawn (the owner tells it)
    until its exit; ``budget`` bytes in all."""

    def __init__(self, budget: int, sizes: dict[str, int]) -> None:
        self.budget, self.sizes, self.held = budget, sizes, set[str]()

    def shortfall(self, model: str, candidates: Sequence[str]) -> bool:
        return self.sizes[model] + sum(self.sizes[m] for m in self.held) > self.budget

    def pick_victim(self, model: str, candidates: Sequence[str]) -> str | None:
        return candidates[0] if candidates else None


def test_two_loads_freed_by_one_exit_are_not_both_claimed_into_one_models_memory() -> None:
    """Found by the soak: two loads claimed in one event, the room judging the second as if
    the first held nothing (the owner tells the ledger of a load only at its Spawn): 150 MiB
    held under a 120 MiB limit."""
    room = HeldRoom(100, {"x": 60, "a": 60, "b": 60})
    sched = Scheduler(3, room)
    configs = {m: ModelConfig(slots=1, stop_timeout=5.0) for m in ("x", "a", "b")}
    sched.handle(Catalog(configs), 0.0)

    def send(event: Event, now: float) -> list[Effect]:
        effects = handle(sched, event, now)
        room.held |= {e.model for e in effects if isinstance(e, Spawn)}  # as the owner does
        return effects

    send(Request(1, "x"), 0.0)
    send(Spawned("x", 7001), 0.0)
    (grant,) = [e for e in send(Ready("x", 7001), 0.0) if isinstance(e, Grant)]
    why = "not enough free memory for it, and no idle model to evict"  # x is busy
    assert send(Request(2, "a"), 0.1) == [Queued(2, "a", why, slot=False)]
    send(Request(3, "b"), 0.1)
    send(Unload("x", "manual"), 0.2)
    send(Release(grant.lease), 0.2)
    room.held.discard("x")
    effects = send(Exited("x", 0), 0.3)
    assert [e for e in effects if isinstance(e, Spawn)] == [Spawn("a")]  # not b as well
    effects = send(Spawned("a", 7002), 0.4)
    assert not [e for e in effects if isinstance(e, Spawn)]  # b does not fit beside a


def test_a_model_gone_and_back_while_its_load_was_granted_reloads_once_spawned() -> None:
    """Review of 12ca46d: coming back cleared ``gone``, so the child on its way (the old
    preset's arguments) was never stopped, and the reload that dropped it waited for it."""
    sched = make(2, a=ModelConfig(slots=1, stop_timeout=5.0))
    waiter, effects = request(sched, "a")
    assert Spawn("a") in effects
    assert handle(sched, Catalog({}), 0.1) == [Refuse(waiter, Refusal.GONE)]
    assert handle(sched, Catalog({"a": ModelConfig(slots=2, stop_timeout=5.0)}), 0.2) == []
    assert handle(sched, Spawned("a", 7001), 0.3) == [
        Drain("a", "reload", 5.3),
        Stop("a", cut=False),
    ]
    assert handle(sched, Exited("a", 0), 0.4) == []
    assert "a" in sched and sched.view("a").state is ModelState.UNLOADED


def test_a_direct_load_while_a_changed_models_child_is_on_its_way_waits_for_the_next() -> None:
    """Review of 12ca46d: ``POST /models/load`` (or a load-on-startup) of a model changed while
    its load was granted was refused "already running" for a child about to stop."""
    sched = make(2, a=ModelConfig(slots=1, stop_timeout=5.0))
    _, effects = request(sched, "a")
    assert Spawn("a") in effects
    changed = Catalog({"a": ModelConfig(slots=2, stop_timeout=5.0)}, frozenset({"a"}))
    assert handle(sched, changed, 0.1) == []
    direct, effects = request(sched, "a", 0.1, direct=True)
    assert Refuse(direct, Refusal.RUNNING) not in effects, effects
    handle(sched, Spawned("a", 7001), 0.2)  # it stops for the reload
    assert handle(sched, Exited("a", 0), 0.3) == [Spawn("a")]
    assert Started(direct) in handle(sched, Spawned("a", 7002), 0.4)
