"""The pure memory ledger: calibration, reservations, deficit, making room."""

from __future__ import annotations

from node_agent.core.ledger import (
    DeviceReading,
    MemoryLedger,
    freed_memory_visible,
)

GIB = 1 << 30
MIB = 1 << 20


def ledger_with(*models: tuple[str, int], margin: int = 0, **limits: int) -> MemoryLedger:
    ledger = MemoryLedger(margin, limits)
    for name, size in models:
        ledger.set_estimate(name, {"CUDA0": size})
    return ledger


def test_calibrate_subtracts_each_tracked_instance_once() -> None:
    ledger = ledger_with(("a", 2 * GIB), ("b", 3 * GIB), ("c", 1 * GIB))
    for name in ("a", "b", "c"):
        ledger.on_spawned(name)
    ledger.on_ready("a", {"CUDA0": 2 * GIB + 512 * MIB})  # measured above its min
    # The device: 24 GiB; our children really use 2.5 + 3 + 1; 4 GiB used by others.
    used = int(2.5 * GIB) + 3 * GIB + 1 * GIB + 4 * GIB
    ledger.calibrate([DeviceReading("CUDA0", 24 * GIB, 24 * GIB - used)])
    stats = ledger.statistics().devices[0]
    assert stats.external == 4 * GIB
    assert stats.available == 24 * GIB - 4 * GIB - used + 4 * GIB
    # Calibrating again with the same reading changes nothing: no double counting.
    ledger.calibrate([DeviceReading("CUDA0", 24 * GIB, 24 * GIB - used)])
    assert ledger.statistics().devices[0].external == 4 * GIB


def test_calibrate_prefers_a_fresh_measurement_over_the_held_figure() -> None:
    ledger = ledger_with(("a", 2 * GIB))
    ledger.on_spawned("a")  # holds min 2 GiB; the child really uses 3 GiB already
    ledger.calibrate(
        [DeviceReading("CUDA0", 10 * GIB, 10 * GIB - 3 * GIB - 1 * GIB)],
        usage={"a": {"CUDA0": 3 * GIB}},
    )
    assert ledger.statistics().devices[0].external == 1 * GIB


def test_external_never_negative() -> None:
    ledger = ledger_with(("a", 8 * GIB))
    ledger.on_spawned("a")  # held 8 GiB, but nothing allocated yet: free is still high
    ledger.calibrate([DeviceReading("CUDA0", 10 * GIB, 9 * GIB)])
    assert ledger.statistics().devices[0].external == 0
    assert ledger.available("CUDA0") == 2 * GIB


def test_reserve_and_release_on_every_transition() -> None:
    ledger = ledger_with(("a", 2 * GIB))
    ledger.calibrate([DeviceReading("CUDA0", 10 * GIB, 10 * GIB)])
    assert ledger.held("a") == {}
    ledger.on_spawned("a")
    assert ledger.held("a") == {"CUDA0": 2 * GIB}  # min while loading
    ledger.on_ready("a", {"CUDA0": 3 * GIB})
    assert ledger.held("a") == {"CUDA0": 3 * GIB}  # effective once measured
    assert ledger.available("CUDA0") == 7 * GIB
    ledger.on_sleeping("a")
    assert ledger.held("a") == {}
    assert ledger.available("CUDA0") == 10 * GIB
    ledger.on_ready("a")  # woke: the earlier measurement still holds
    assert ledger.held("a") == {"CUDA0": 3 * GIB}
    ledger.on_unloaded("a")  # exit or crash: nothing held, measurement forgotten
    assert ledger.held("a") == {}
    assert ledger.figures("a").effective is None
    ledger.on_spawned("a")
    ledger.on_ready("a")  # ready without a measurement: min again
    assert ledger.held("a") == {"CUDA0": 2 * GIB}


def test_deficit_includes_the_margin() -> None:
    ledger = ledger_with(("a", 6 * GIB), ("b", 3 * GIB), margin=1 * GIB)
    ledger.calibrate([DeviceReading("CUDA0", 10 * GIB, 10 * GIB)])
    ledger.on_spawned("a")
    ledger.on_ready("a")
    # available = 10 - 6 = 4; b needs 3 + 1 margin: fits exactly.
    assert ledger.deficit("b") == {}
    ledger.margin = 1 * GIB + 1 * MIB
    assert ledger.deficit("b") == {"CUDA0": 1 * MIB}


def test_deficit_ignores_its_own_reservation() -> None:
    ledger = ledger_with(("a", 6 * GIB))
    ledger.calibrate([DeviceReading("CUDA0", 10 * GIB, 10 * GIB)])
    ledger.on_spawned("a")
    assert ledger.deficit("a") == {}  # re-checked just before spawning: not short of itself


def test_limit_caps_available_and_external_still_counts() -> None:
    ledger = MemoryLedger(0, {"host": 8 * GIB})
    ledger.set_estimate("a", {"host": 5 * GIB})
    ledger.calibrate([DeviceReading("host", 64 * GIB, 60 * GIB)])
    assert ledger.available("host") == 8 * GIB
    ledger.on_spawned("a")
    assert ledger.available("host") == 3 * GIB
    # Others now use 57 GiB, "a" 5 GiB: 2 GiB free, and that is all a new load gets.
    ledger.calibrate([DeviceReading("host", 64 * GIB, 2 * GIB)])
    assert ledger.available("host") == 2 * GIB


def test_unread_device_with_limit_and_unknown_device() -> None:
    ledger = MemoryLedger(0, {"host": GIB})
    ledger.set_estimate("a", {"host": 2 * GIB, "CUDA3": 5 * GIB})
    assert ledger.available("CUDA3") is None  # never read, no limit: not constrained
    assert ledger.deficit("a") == {"host": GIB}


def test_pick_victim_takes_the_first_candidate_that_frees_a_short_device() -> None:
    ledger = ledger_with(("a", 3 * GIB), ("b", 3 * GIB), ("c", 3 * GIB), ("new", 4 * GIB))
    ledger.set_estimate("host-only", {"host": GIB})
    ledger.calibrate([DeviceReading("CUDA0", 10 * GIB, 10 * GIB)])
    for name in ("a", "b", "c", "host-only"):
        ledger.on_spawned(name)
        ledger.on_ready(name)
    assert ledger.deficit("new") == {"CUDA0": 3 * GIB}
    assert ledger.deficit("new")
    # The scheduler's idle candidates, best victim first (c is busy: not offered).
    assert ledger.pick_victim("new", ["host-only", "b", "a"]) == "b"  # host-only frees no GPU
    ledger.on_unloaded("b")
    assert ledger.pick_victim("new", ["host-only", "a"]) is None  # fits now
    assert not ledger.deficit("new")


def test_no_victim_when_only_busy_models_hold_the_memory() -> None:
    ledger = ledger_with(("a", 6 * GIB), ("loading", 2 * GIB), ("new", 4 * GIB))
    ledger.calibrate([DeviceReading("CUDA0", 10 * GIB, 10 * GIB)])
    ledger.on_spawned("a")
    ledger.on_ready("a")
    ledger.on_spawned("loading")  # not offered as a candidate
    assert ledger.deficit("new")
    assert ledger.pick_victim("new", []) is None  # the scheduler's queue waits


def test_no_victim_when_nothing_else_is_loaded() -> None:
    ledger = ledger_with(("huge", 20 * GIB), margin=512 * MIB)
    ledger.calibrate([DeviceReading("CUDA0", 10 * GIB, 9 * GIB)])
    assert ledger.pick_victim("huge", []) is None  # the scheduler loads it anyway, alone
    assert ledger.deficit("huge") == {"CUDA0": 20 * GIB - 9 * GIB + 512 * MIB}


def test_no_victim_when_only_unrelated_devices_are_held() -> None:
    ledger = MemoryLedger(0)
    ledger.set_estimate("cpu", {"host": GIB})
    ledger.set_estimate("gpu", {"CUDA0": 20 * GIB})
    ledger.calibrate(
        [DeviceReading("CUDA0", 10 * GIB, 10 * GIB), DeviceReading("host", 64 * GIB, 60 * GIB)]
    )
    ledger.on_spawned("cpu")
    assert ledger.pick_victim("gpu", ["cpu"]) is None  # stopping "cpu" would not free CUDA0


def test_freed_memory_visible_waits_for_a_late_driver() -> None:
    expected = {"CUDA0": 4 * GIB, "host": 0}
    baseline = {"CUDA0": 2 * GIB}
    assert not freed_memory_visible(baseline, [DeviceReading("CUDA0", 10 * GIB, 2 * GIB)], expected)
    assert not freed_memory_visible(baseline, [DeviceReading("CUDA0", 10 * GIB, 4 * GIB)], expected)
    assert freed_memory_visible(
        baseline, [DeviceReading("CUDA0", 10 * GIB, 5 * GIB + GIB // 4)], expected
    )
    assert freed_memory_visible({}, [], expected)  # nothing to wait for


def test_statistics_snapshot() -> None:
    ledger = MemoryLedger(256 * MIB, {"host": 8 * GIB})
    ledger.set_estimate("a", {"host": GIB, "CUDA0": 2 * GIB}, max={"host": GIB, "CUDA0": 5 * GIB})
    ledger.calibrate([DeviceReading("CUDA0", 10 * GIB, 9 * GIB)])
    ledger.on_spawned("a")
    body = ledger.statistics().as_dict()
    assert body["margin"] == 256 * MIB
    host, gpu = body["devices"]
    assert host == {
        "name": "host",
        "total": None,
        "limit": 8 * GIB,
        "external": 0,
        "capacity": 8 * GIB,
        "other": 0,
        "held": {"a": GIB},
        "available": 7 * GIB,
        "margin": 256 * MIB,
    }
    assert gpu["name"] == "CUDA0"
    assert gpu["external"] == 1 * GIB
    assert gpu["held"] == {"a": 2 * GIB}
    assert gpu["available"] == 10 * GIB - GIB - 2 * GIB
    fig = ledger.figures("a")
    assert fig.min == {"host": GIB, "CUDA0": 2 * GIB}
    assert fig.max == {"host": GIB, "CUDA0": 5 * GIB}
    assert fig.effective is None
    ledger.forget("a")
    assert ledger.statistics().devices[1].held == {}


def test_capacity_is_other_plus_models_plus_available() -> None:
    """Issue 29: under --memory-limit host=2GiB on a 24 GiB machine, the CLI said OTHER 1.6
    GiB (the raw external use) and the status page "other processes 0 B"; 2.0 = 1.6 + 0.16 +
    1.8 did not add up. ``other`` is the part that reaches into the limit."""
    ledger = MemoryLedger(512 * MIB, {"host": 2 * GIB})
    ledger.set_estimate("m", {"host": 160 * MIB})
    ledger.on_spawned("m")
    total = 24 * GIB
    for used_by_others, other in ((1600 * MIB, 0), (23 * GIB, GIB)):
        ledger.calibrate([DeviceReading("host", total, total - used_by_others - 160 * MIB)])
        (host,) = ledger.statistics().devices
        assert host.external == used_by_others
        assert host.other == other
        assert host.capacity == host.other + sum(host.held.values()) + (host.available or 0)
