"""What a scenario produces: metrics per target, goals, resources, raw samples, errors.

Kept apart from the scenarios (which measure) and the report (which formats) so both can be
read and tested on their own. Everything here serialises to the JSON the run writes.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from bench.procs import CORRAL, DIRECT, PEER, CpuTimes, Server


def median(values: Sequence[float]) -> float | None:
    return statistics.median(values) if values else None


def p99(values: Sequence[float]) -> float | None:
    """Nearest-rank 99th percentile (with few samples, the maximum)."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[max(0, math.ceil(0.99 * len(ordered)) - 1)]


def scaled(value: float | None, factor: float) -> float | None:
    return None if value is None else value * factor


@dataclass(frozen=True)
class Goal:
    """One target from the issue: ``corral OP reference × value``.

    ``against``: "peer" or "direct" compares the ratio corral ÷ that target with ``value``;
    "abs" compares corral's own figure with ``value``.
    """

    against: Literal["peer", "direct", "abs"]
    op: Literal["<=", ">=", "<", "=="]
    value: float

    def text(self, unit: str) -> str:
        if self.against == "abs":
            return f"{self.op} {self.value:g} {unit}".strip()
        name = "router" if self.against == "peer" else "direct"
        return f"{self.op} {self.value:g}× {name}"

    def met(self, values: dict[str, float | None]) -> bool | None:
        corral = values.get(CORRAL)
        if corral is None:
            return None
        if self.against == "abs":
            figure = corral
        else:
            reference = values.get(PEER if self.against == "peer" else DIRECT)
            if reference is None or reference == 0:
                return None
            figure = corral / reference
        return {
            "<=": figure <= self.value,
            ">=": figure >= self.value,
            "<": figure < self.value,
            "==": figure == self.value,
        }[self.op]


@dataclass
class Metric:
    label: str
    unit: str
    values: dict[str, float | None]
    goals: tuple[Goal, ...] = ()

    def ratio(self, reference: str) -> float | None:
        corral, other = self.values.get(CORRAL), self.values.get(reference)
        if corral is None or other is None or other == 0:
            return None
        return corral / other

    def met(self) -> bool | None:
        results = [goal.met(self.values) for goal in self.goals]
        if not results or any(r is None for r in results):
            return None
        return all(results)

    def to_json(self) -> dict[str, Any]:
        return {
            **asdict(self),
            "goals": [goal.text(self.unit) for goal in self.goals],
            "ratio_corral_peer": self.ratio(PEER),
            "ratio_corral_direct": self.ratio(DIRECT),
            "met": self.met(),
        }


@dataclass(frozen=True)
class Resources:
    cpu_s: float
    children_cpu_s: float
    peak_rss_mib: float

    @classmethod
    def between(cls, server: Server, before: CpuTimes) -> Resources:
        spent = server.cpu() - before
        return cls(spent.own, spent.children, server.peak_rss_mib())

    @classmethod
    def combine(cls, runs: Sequence[Resources]) -> Resources:
        """Several processes for one target (S6's restarts): CPU summed, the highest peak."""
        return cls(
            sum(r.cpu_s for r in runs),
            sum(r.children_cpu_s for r in runs),
            max((r.peak_rss_mib for r in runs), default=0.0),
        )


@dataclass
class ScenarioResult:
    id: str
    title: str
    params: dict[str, Any]
    targets: tuple[str, ...]  # the targets this scenario applies to
    metrics: list[Metric] = field(default_factory=list)
    resources: dict[str, Resources] = field(default_factory=dict)
    samples: dict[str, dict[str, list[float]]] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)
    seconds: float = 0.0

    def add_samples(self, target: str, name: str, values: Sequence[float]) -> None:
        self.samples.setdefault(target, {})[name] = [round(v, 6) for v in values]

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "title": self.title,
            "params": self.params,
            "targets": list(self.targets),
            "metrics": [m.to_json() for m in self.metrics],
            "resources": {t: asdict(r) for t, r in self.resources.items()},
            "samples": self.samples,
            "errors": self.errors,
            "seconds": round(self.seconds, 3),
        }
