"""The agent's own Prometheus metrics: what they are, and how events and requests move them.

Three sources feed them:

* **snapshots** read at scrape time (:class:`SnapshotCollector`): each model's state, requests
  in flight and waiting, instance counts, and the memory ledger per device. Reading them
  fresh means they can never drift from what ``/models`` says;
* **registry events** (:class:`LifecycleTracker`, pure: ``now`` is an argument): loads, load
  seconds, evictions by reason and crashes, from the same messages as ``/models/sse``;
* **finished requests** (:meth:`Families.observe_request`): proxied requests by endpoint
  and status, queue wait, and the tokens the children reported.

Every family lives in a private ``CollectorRegistry`` per app, so two agents in one process
(tests) never share counters. Names follow Prometheus conventions (``_total``, ``_seconds``,
``_bytes``, base units).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Protocol

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from node_agent.api.request_record import Exchange
from node_agent.core.model_state import ModelState, ModelView, Statistics
from node_agent.redact import redact

LOAD_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600)
WAIT_BUCKETS = (0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)
DURATION_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)
RATE_BUCKETS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000)


@lru_cache(maxsize=4096)
def model_label(name: str) -> str:
    """A model's name as a label value: redacted (a name may be made from a URL), once per name
    rather than the whole scrape on the loop (issue 26, row 5). The names are the catalog's."""
    return redact(name)


class _Scheduler(Protocol):
    def view(self, name: str) -> ModelView: ...
    def statistics(self) -> Statistics: ...


class _Memory(Protocol):
    def statistics(self) -> dict[str, Any]: ...


class Snapshots(Protocol):
    """What the scrape reads from the registry (``runtime.registry.Registry`` is one)."""

    @property
    def scheduler(self) -> _Scheduler: ...
    @property
    def memory(self) -> _Memory | None: ...
    def specs(self) -> Mapping[str, object]: ...
    def warm_figures(self) -> Mapping[str, int] | None: ...


class Families:
    """The counters and histograms, registered in ``self.registry``."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        # Each finished request's series, found by its labels here: prometheus_client's
        # ``labels()`` costs microseconds a call, seven a request (issue 30). As many as the
        # families' own label sets (prometheus_client keeps those for good too).
        self._served: dict[tuple[str, str, int], tuple[Counter, Histogram]] = {}
        self._series: dict[str, _ModelSeries] = {}
        r = self.registry
        self.loads = Counter(
            "corral_model_loads",
            "Loads of a model's child that ended: loaded, failed (it died before it was "
            "ready) or cancelled (stopped on purpose while loading).",
            ["model", "result"],
            registry=r,
        )
        self.load_seconds = Histogram(
            "corral_model_load_seconds",
            "Seconds from spawning a model's child until it was ready.",
            ["model"],
            buckets=LOAD_BUCKETS,
            registry=r,
        )
        self.evictions = Counter(
            "corral_evictions",
            "Models unloaded, by reason: count (--models-max), memory (the ledger), ttl "
            "(idle), manual (POST /models/unload), reload (its arguments changed), wedged (its "
            "child stalled a request or kept failing: killed, and loaded again when asked).",
            ["model", "reason"],
            registry=r,
        )
        self.crashes = Counter(
            "corral_model_crashes",
            "Loaded models whose child exited without being asked to.",
            ["model"],
            registry=r,
        )
        self.requests = Counter(
            "corral_requests",
            "Requests to proxied endpoints, by model (empty: none resolved), endpoint and "
            "the status the client got (499: the client went away first).",
            ["model", "endpoint", "status"],
            registry=r,
        )
        self.request_seconds = Histogram(
            "corral_request_duration_seconds",
            "Seconds from a proxied request's arrival to the end of its response.",
            ["model", "endpoint"],
            buckets=DURATION_BUCKETS,
            registry=r,
        )
        self.queue_wait = Histogram(
            "corral_queue_wait_seconds",
            "Seconds a request waited for its model (queue, eviction and load) until leased.",
            ["model"],
            buckets=WAIT_BUCKETS,
            registry=r,
        )
        self.prompt_tokens = Counter(
            "corral_prompt_tokens",
            "Prompt tokens of proxied requests, as the children reported them.",
            ["model"],
            registry=r,
        )
        self.generated_tokens = Counter(
            "corral_generated_tokens",
            "Tokens generated for proxied requests, as the children reported them.",
            ["model"],
            registry=r,
        )
        self.generation_seconds = Counter(
            "corral_generation_seconds",
            "Seconds the children spent generating (timings.predicted_ms): divide "
            "generated tokens by it for tokens per second.",
            ["model"],
            registry=r,
        )
        self.generation_rate = Histogram(
            "corral_generation_tokens_per_second",
            "Generation speed of each proxied request (timings.predicted_per_second).",
            ["model"],
            buckets=RATE_BUCKETS,
            registry=r,
        )

    def observe_request(self, endpoint: str, status: int, exchange: Exchange, now: float) -> None:
        """Count a finished request; ``endpoint``: its route's pattern, never its path (a label
        per path a client sends grows without bound)."""
        model = model_label(exchange.model or "")
        served = self._served.get((model, endpoint, status))
        if served is None:
            served = self._served[model, endpoint, status] = (
                self.requests.labels(model, endpoint, str(status)),
                self.request_seconds.labels(model, endpoint),
            )
        served[0].inc()
        served[1].observe(max(0.0, now - exchange.started))
        series = self._series.get(model)
        if series is None:
            series = self._series[model] = _ModelSeries(
                self.queue_wait.labels(model),
                self.prompt_tokens.labels(model),
                self.generated_tokens.labels(model),
                self.generation_seconds.labels(model),
                self.generation_rate.labels(model),
            )
        wait = exchange.wait_seconds
        if wait is not None:
            series.queue_wait.observe(max(0.0, wait))
        usage = exchange.usage
        if usage is None:
            return
        if usage.prompt_tokens is not None:
            series.prompt_tokens.inc(usage.prompt_tokens)
        if usage.generated_tokens is not None:
            series.generated_tokens.inc(usage.generated_tokens)
        seconds = usage.generation_seconds
        if seconds is not None:
            series.generation_seconds.inc(seconds)
            if seconds > 0 and usage.generated_tokens:
                series.generation_rate.observe(usage.generated_tokens / seconds)


@dataclass(frozen=True, slots=True)
class _ModelSeries:
    """One model's series of the per-request families."""

    queue_wait: Histogram
    prompt_tokens: Counter
    generated_tokens: Counter
    generation_seconds: Counter
    generation_rate: Histogram


@dataclass
class _Lifecycle:
    loading_since: float | None = None


class LifecycleTracker:
    """Turns the registry's ``/models/sse`` events into load and eviction metrics."""

    def __init__(self, families: Families) -> None:
        self._families = families
        self._models: dict[str, _Lifecycle] = {}

    def on_event(self, model: str, event: str, data: Mapping[str, Any] | None, now: float) -> None:
        status = data.get("status") if data is not None else None
        model = model_label(model)
        life = self._models.setdefault(model, _Lifecycle())
        if event == "model_status" and status == "loading":
            life.loading_since = now  # the child was spawned
        elif event == "status_change" and status == "loaded":
            # "loaded" also follows a wake from sleep: only a load in progress counts.
            if life.loading_since is not None:
                self._families.loads.labels(model, "loaded").inc()
                self._families.load_seconds.labels(model).observe(now - life.loading_since)
                life.loading_since = None
        elif event == "status_change" and status == "unloaded":
            assert data is not None
            self._unloaded(model, life, self._reason(data))

    def _reason(self, data: Mapping[str, Any]) -> str:
        extra = data.get("corral")
        reason = extra.get("reason") if isinstance(extra, Mapping) else None
        # count, memory (evictions by --models-max or by the ledger), manual, ttl, reload,
        # wedged, shutdown, crash
        return reason if isinstance(reason, str) else "unknown"

    def _unloaded(self, model: str, life: _Lifecycle, reason: str) -> None:
        was_loading = life.loading_since is not None
        life.loading_since = None
        if reason == "crash":
            if was_loading:
                self._families.loads.labels(model, "failed").inc()
            else:
                self._families.crashes.labels(model).inc()
            return
        if was_loading:
            self._families.loads.labels(model, "cancelled").inc()
        if reason != "shutdown":
            self._families.evictions.labels(model, reason).inc()


class SnapshotCollector(Collector):
    """Gauges read fresh from the registry at every scrape."""

    def __init__(self, snapshots: Snapshots) -> None:
        self._snapshots = snapshots

    def describe(self) -> Iterator[Metric]:
        """Nothing to check at registration: without this, prometheus_client collects once
        to learn the names, which walks every model (74 of 89 ms of start-up with 1000)."""
        return iter(())

    def collect(self) -> Iterator[Metric]:
        snapshots = self._snapshots
        state = GaugeMetricFamily(
            "corral_model_state",
            "1 for the state each model is in now, 0 for the others.",
            labels=["model", "state"],
        )
        stopping = GaugeMetricFamily(
            "corral_model_stopping", "1 while a model drains and stops.", labels=["model"]
        )
        in_flight = GaugeMetricFamily(
            "corral_model_in_flight_requests",
            "Requests a model's child is serving now.",
            labels=["model"],
        )
        queued = GaugeMetricFamily(
            "corral_queue_depth", "Requests waiting for a model now.", labels=["model"]
        )
        for model in snapshots.specs():
            view = snapshots.scheduler.view(model)
            name = model_label(model)
            for value in ModelState:
                state.add_metric([name, value.value], 1.0 if view.state is value else 0.0)
            stopping.add_metric([name], 1.0 if view.stopping else 0.0)
            in_flight.add_metric([name], view.in_flight)
            queued.add_metric([name], view.queued)
        yield from (state, stopping, in_flight, queued)
        yield from _instances(snapshots.scheduler.statistics())
        if snapshots.memory is not None:
            yield from _ledger(snapshots.memory.statistics())
        warm = snapshots.warm_figures()
        if warm is not None:
            yield from _warm(warm)


_WARM_COUNTERS = (
    ("saved", "Slots whose prompt cache was saved at a model's stop (warm swaps)."),
    ("restored", "Slots restored from a saved cache when their model loaded again (hits)."),
    ("missed", "Loads of a model with warm swaps and no saved cache (misses)."),
    ("dropped", "Saved caches that failed to restore and were deleted."),
)


def _warm(figures: Mapping[str, int]) -> Iterator[Metric]:
    for key, text in _WARM_COUNTERS:
        yield CounterMetricFamily(f"corral_warm_{key}", text, value=figures.get(key, 0))
    yield GaugeMetricFamily(
        "corral_warm_cache_bytes",
        "Bytes of saved prompt caches in the warm folder (bounded by --warm-cache-size).",
        value=figures.get("bytes", 0),
    )


def _instances(stats: Statistics) -> Iterator[Metric]:
    yield GaugeMetricFamily(
        "corral_models_running",
        "Model children that hold an instance slot (loading, loaded, sleeping).",
        value=stats.running,
    )
    if stats.models_max > 0:
        yield GaugeMetricFamily(
            "corral_models_max", "The --models-max instance limit.", value=stats.models_max
        )


_DEVICE_FIGURES = (
    ("total", "Device memory in total, as last read."),
    ("limit", "The --memory-limit on the device."),
    ("external", "Device memory held by processes the agent did not start."),
    ("available", "Device memory models may still take: total - external - held."),
    ("margin", "Device memory kept free (--models-memory-margin)."),
)


def _ledger(statistics: Mapping[str, Any]) -> Iterator[Metric]:
    """The ``/ledger`` body as gauges per device (bytes)."""
    devices = [d for d in statistics.get("devices", ()) if isinstance(d, dict)]
    for key, text in _DEVICE_FIGURES:
        family = GaugeMetricFamily(f"corral_memory_{key}_bytes", text, labels=["device"])
        for device in devices:
            value = device.get(key)
            if isinstance(value, (int, float)):
                family.add_metric([str(device["name"])], value)
        yield family
    held = GaugeMetricFamily(
        "corral_memory_held_bytes",
        "Device memory the ledger counts for each model (effective, else its estimated min).",
        labels=["device", "model"],
    )
    for device in devices:
        for model, value in (device.get("held") or {}).items():
            held.add_metric([str(device["name"]), model_label(model)], value)
    yield held
