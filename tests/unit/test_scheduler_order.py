"""The order across models (issue 48): a model that waited its patience for room is served
before later requests of the busy model that makes room for it.

Before, a request for a model that was not running waited for as long as requests kept every
running model busy: a later request for a busy model went ahead of it each time (under a
soak of 64 clients, a request that waited over 4 s saw a median 57 later requests for other
models answered first). Now the best busy model (the victim order) takes no new request once
the waiting one has waited ``patience`` seconds, and is evicted when its requests end. Nothing
in flight is cut, and nothing changes while an idle model can make room."""

from __future__ import annotations

import math

from node_agent.core.scheduler import Scheduler
from node_agent.core.scheduler_events import (
    Catalog,
    Close,
    Drain,
    Effect,
    Exited,
    Grant,
    Lease,
    Leave,
    ModelConfig,
    Queued,
    Ready,
    Release,
    Spawn,
    Spawned,
    Stop,
    Tick,
)
from tests.unit.test_scheduler_effects import handle, loaded, request

CONFIG = ModelConfig(slots=4, stop_timeout=5.0)


def make(models_max: int, *names: str, patience: float = 2.0, **configs: ModelConfig) -> Scheduler:
    sched = Scheduler(models_max, patience=patience)
    models = {name: configs.get(name, CONFIG) for name in names}
    assert handle(sched, Catalog(models), 0.0) == []
    return sched


def lease(effects: list[Effect]) -> Lease:
    (grant,) = [e for e in effects if isinstance(e, Grant)]
    return grant.lease


def queued(effects: list[Effect]) -> str:
    (wait,) = [e for e in effects if isinstance(e, Queued)]
    return wait.reason


def test_a_busy_model_makes_room_once_the_waiting_one_has_waited_its_patience() -> None:
    sched = make(1, "a", "b")
    loaded(sched, "a")
    first = lease(request(sched, "a", 0.0)[1])
    waiter_b, effects = request(sched, "b", 0.5)
    assert queued(effects) == "all 1 instances busy: a (1 in flight)"
    assert sched.wakeup == 2.5  # when its patience runs out
    # Within its patience a later request for a still goes ahead (a is busy anyway).
    second = lease(request(sched, "a", 1.0)[1])
    assert handle(sched, Tick(), 2.5) == []
    # From then on a takes no new request: its new ones queue behind b.
    waiter_a, effects = request(sched, "a", 2.6)
    assert queued(effects) == "a makes room for b, which waited longer (2 in flight)"
    assert sched.view("a").queued == 1 and not sched.view("a").stopping
    assert handle(sched, Release(first), 3.0) == []  # nothing in flight is cut
    # Its last request ends: it is evicted as an idle model would be, and b loads.
    assert handle(sched, Release(second), 3.5) == [
        Drain("a", "count", 8.5, "b"),
        Stop("a", cut=False),
    ]
    assert handle(sched, Exited("a", 0), 3.6) == [Spawn("b")]
    assert handle(sched, Spawned("b", 7002), 3.6) == []
    grant = handle(sched, Ready("b"), 3.7)
    assert [e.waiter for e in grant if isinstance(e, Grant)] == [waiter_b]
    # a's request waits in its turn now: b is busy with the one that came first.
    assert sched.view("a").queued == 1
    assert [name for name, _ in sched.statistics().queue] == ["a"]
    assert waiter_a not in [e.waiter for e in grant if isinstance(e, Grant)]


def test_the_model_serves_again_when_the_waiting_one_leaves() -> None:
    sched = make(1, "a", "b")
    loaded(sched, "a")
    in_flight = lease(request(sched, "a", 0.0)[1])
    waiter_b, _ = request(sched, "b", 0.0)
    handle(sched, Tick(), 2.0)
    waiter_a, effects = request(sched, "a", 2.1)
    assert queued(effects).startswith("a makes room for b")
    # The client waiting for b hangs up: a has no room to make, and takes its request.
    effects = handle(sched, Leave(waiter_b), 2.2)
    assert [e.waiter for e in effects if isinstance(e, Grant)] == [waiter_a]
    assert lease(request(sched, "a", 2.3)[1]).model == "a"
    assert not sched.view("a").stopping
    assert handle(sched, Release(in_flight), 2.4) == []


def test_an_idle_model_makes_room_first_and_the_busy_one_serves_on() -> None:
    sched = make(2, "a", "b", "c")
    loaded(sched, "a", 7001)
    loaded(sched, "b", 7002, now=1.0)  # b is idle; a serves a stream
    lease(request(sched, "a", 1.0)[1])
    _, effects = request(sched, "c", 5.0)
    assert effects[0] == Drain("b", "count", 10.0, "c")
    handle(sched, Tick(), 9.0)
    assert lease(request(sched, "a", 9.0)[1]).model == "a"


def test_one_model_makes_room_for_one_waiting_and_keeps_the_part() -> None:
    """Two busy, one waiting: the least recently used makes room; the other's requests
    ending and starting again (which makes it younger or older) never move the part."""
    sched = make(2, "a", "b", "c")
    loaded(sched, "a", 7001)
    loaded(sched, "b", 7002, now=1.0)
    a_lease = lease(request(sched, "a", 1.0)[1])
    b_lease = lease(request(sched, "b", 1.5)[1])
    request(sched, "c", 2.0)
    handle(sched, Tick(), 4.0)
    assert queued(request(sched, "a", 4.1)[1]).startswith("a makes room for c")
    for now in (4.2, 4.4, 4.6):  # b's requests overlap: it is never idle
        newer = lease(request(sched, "b", now)[1])
        handle(sched, Release(b_lease), now + 0.1)
        b_lease = newer
        assert sched.wait_reason("a").startswith("a makes room for c")
    effects = handle(sched, Release(a_lease), 5.0)
    assert Drain("a", "count", 10.0, "c") in effects
    assert not sched.view("b").stopping


def test_a_model_that_turns_idle_makes_room_at_once_in_the_place_of_a_busy_one() -> None:
    sched = make(2, "a", "b", "c")
    loaded(sched, "a", 7001)
    loaded(sched, "b", 7002, now=1.0)
    lease(request(sched, "a", 1.0)[1])
    b_lease = lease(request(sched, "b", 1.5)[1])
    request(sched, "c", 2.0)
    handle(sched, Tick(), 4.0)
    waiter_a, effects = request(sched, "a", 4.1)
    assert queued(effects).startswith("a makes room for c")
    effects = handle(sched, Release(b_lease), 4.2)  # b is idle first: it goes, a serves again
    assert Drain("b", "count", 9.2, "c") in effects
    assert waiter_a in [e.waiter for e in effects if isinstance(e, Grant)]


def test_two_waiting_models_get_room_from_two_busy_ones() -> None:
    sched = make(2, "a", "b", "c", "d")
    loaded(sched, "a", 7001)
    loaded(sched, "b", 7002)
    a_lease = lease(request(sched, "a", 0.0)[1])
    b_lease = lease(request(sched, "b", 0.0)[1])
    request(sched, "c", 0.5)
    request(sched, "d", 0.6)
    handle(sched, Tick(), 2.5)
    assert sched.wait_reason("a").startswith("a makes room for c")
    assert sched.wait_reason("b").startswith("b makes room for c")
    assert Drain("a", "count", 8.0, "c") in handle(sched, Release(a_lease), 3.0)
    assert Drain("b", "count", 8.0, "c") in handle(sched, Release(b_lease), 3.0)


def test_a_pinned_model_never_makes_room() -> None:
    sched = make(1, "a", "b", a=ModelConfig(slots=4, pin=True))
    loaded(sched, "a")
    lease(request(sched, "a", 0.0)[1])
    request(sched, "b", 0.0)
    handle(sched, Tick(), 10.0)
    assert lease(request(sched, "a", 10.0)[1]).model == "a"


def test_a_hot_model_that_came_in_by_a_swap_makes_room_only_after_its_residency() -> None:
    """The anti-thrash rule of idle victims (core.victims) holds for busy ones too."""
    sched = Scheduler(1, residency_factor=2.0, patience=1.0)
    handle(sched, Catalog({name: CONFIG for name in "abc"}), 0.0)
    loaded(sched, "c")
    effects = request(sched, "a", 1.0)[1]
    assert effects[0] == Drain("c", "count", 6.0, "a")
    assert handle(sched, Exited("c", 0), 1.0) == [Spawn("a")]
    handle(sched, Spawned("a", 7002), 1.0)
    handle(sched, Release(lease(handle(sched, Ready("a"), 3.0))), 3.0)  # loaded in 2 s
    lease(request(sched, "a", 3.1)[1])  # its second use: hot, resident until 3 + 2 x 2
    request(sched, "b", 3.2)
    handle(sched, Tick(), 4.5)
    assert lease(request(sched, "a", 4.6)[1]).model == "a"
    handle(sched, Tick(), 7.0)
    assert queued(request(sched, "a", 7.1)[1]).startswith("a makes room for b")


def test_an_endless_patience_is_the_old_order() -> None:
    sched = make(1, "a", "b", patience=math.inf)
    loaded(sched, "a")
    lease(request(sched, "a", 0.0)[1])
    request(sched, "b", 0.0)
    assert sched.wakeup is None
    handle(sched, Tick(), 100.0)
    assert lease(request(sched, "a", 100.0)[1]).model == "a"


def test_closing_ends_the_part() -> None:
    sched = make(1, "a", "b")
    loaded(sched, "a")
    in_flight = lease(request(sched, "a", 0.0)[1])
    request(sched, "b", 0.0)
    handle(sched, Tick(), 2.0)
    assert sched.wait_reason("a").startswith("a makes room for b")
    handle(sched, Close(10.0), 2.1)
    assert sched.view("a").stopping
    assert Stop("a", cut=False) in handle(sched, Release(in_flight), 2.2)
