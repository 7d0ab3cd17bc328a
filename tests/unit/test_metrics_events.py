"""Loads, evictions and crashes counted from registry events (LifecycleTracker, pure)."""

from __future__ import annotations

from typing import Any

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from node_agent.api.metrics_families import Families, LifecycleTracker


def samples(families: Families) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    text = generate_latest(families.registry).decode()
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for f in text_string_to_metric_families(text)
        for s in f.samples
    }


def value(families: Families, name: str, **labels: str) -> float:
    return samples(families).get((name, frozenset(labels.items())), 0.0)


def loading() -> tuple[str, dict[str, Any]]:
    return "model_status", {"status": "loading"}


def status(value: str, reason: str | None = None, **extra: Any) -> tuple[str, dict[str, Any]]:
    data = {"status": value, **extra}
    if reason is not None:
        data["corral"] = {"reason": reason}
    return "status_change", data


def feed(tracker: LifecycleTracker, model: str, *events: tuple[float, tuple[str, Any]]) -> None:
    for now, (event, data) in events:
        tracker.on_event(model, event, data, now)


def test_a_load_counts_once_with_its_seconds_and_a_wake_does_not() -> None:
    families = Families()
    tracker = LifecycleTracker(families)
    feed(
        tracker, "m",
        (1.0, loading()),
        (1.1, status("loading", progress={"value": 0.5})),
        (1.5, status("loaded")),
        (9.0, status("sleeping")),
        (9.5, status("loaded")),  # woke: no load
    )  # fmt: skip
    assert value(families, "corral_model_loads_total", model="m", result="loaded") == 1
    assert value(families, "corral_model_load_seconds_count", model="m") == 1
    assert value(families, "corral_model_load_seconds_sum", model="m") == 0.5


def test_evictions_by_reason() -> None:
    families = Families()
    tracker = LifecycleTracker(families)
    for reason in ("count", "memory", "manual", "ttl", "reload", "wedged", "shutdown"):
        feed(tracker, "m", (0, loading()), (1, status("loaded")))
        feed(tracker, "m", (2, status("unloaded", exit_code=0, reason=reason)))
    for reason in ("count", "memory", "manual", "ttl", "reload", "wedged"):
        assert value(families, "corral_evictions_total", model="m", reason=reason) == 1
    assert value(families, "corral_evictions_total", model="m", reason="shutdown") == 0
    assert value(families, "corral_model_loads_total", model="m", result="loaded") == 7


def test_crashes_and_failed_or_cancelled_loads() -> None:
    families = Families()
    tracker = LifecycleTracker(families)
    feed(tracker, "m", (0, loading()), (1, status("unloaded", exit_code=1, reason="crash")))
    feed(
        tracker, "m", (2, loading()), (3, status("loaded")), (4, status("unloaded", reason="crash"))
    )
    feed(tracker, "m", (5, loading()), (6, status("unloaded", exit_code=0, reason="manual")))
    assert value(families, "corral_model_loads_total", model="m", result="failed") == 1
    assert value(families, "corral_model_loads_total", model="m", result="loaded") == 1
    assert value(families, "corral_model_loads_total", model="m", result="cancelled") == 1
    assert value(families, "corral_model_crashes_total", model="m") == 1
    assert value(families, "corral_evictions_total", model="m", reason="manual") == 1
    assert value(families, "corral_model_load_seconds_count", model="m") == 1


def test_an_unload_without_a_reason_is_counted_as_unknown() -> None:
    families = Families()
    tracker = LifecycleTracker(families)
    feed(tracker, "m", (0, loading()), (1, status("loaded")), (2, status("unloaded", exit_code=0)))
    assert value(families, "corral_evictions_total", model="m", reason="unknown") == 1
