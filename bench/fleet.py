"""The shared set-up of a benchmark run: sizes, models, and the fleet of targets of a scenario.

A :class:`Fleet` owns the servers of one scenario: it starts them, drops a target that fails
(recording why, so the other targets still get measured), measures their CPU and memory, and
stops every one of them on the way out, whatever happened.
"""

from __future__ import annotations

import asyncio
import os
import shutil
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

from bench.procs import DIRECT, ROUTERS, CpuTimes, Launcher, Server
from bench.results_model import Resources, ScenarioResult
from node_agent.real_model import MODEL_NAME, real_model_path

TINY, SMALL, MEDIUM, TINY_B = "demo-tiny", "demo-small", "demo-medium", "demo-tiny-b"
REAL = MODEL_NAME  # SmolLM2-135M-Instruct, where its wheel is installed


@dataclass(frozen=True)
class Sizes:
    """How much each scenario does. ``FULL`` is the issue's; ``SMOKE`` only proves it runs."""

    s1_requests: int = 300
    # Each stream's first token is a sample: on 2 cores they spread over ~8-25 ms, so a median
    # of 20 moved by ~10% from run to run, as much as the 1.1x it is held to.
    s2_streams: int = 60
    s2_tokens: int = 256
    s2r_streams: int = 8
    s2r_tokens: int = 128
    s3_loads: int = 10
    s4_requests: int = 60
    s4_reps: int = 3
    s5_clients: int = 64
    s5_requests: int = 600
    s5_reps: int = 2
    s5_deadline_s: float = 120.0
    s6_models: int = 1000
    s6_starts: int = 3
    s6_lists: int = 10
    s7_requests: int = 600
    s7_depth: int = 256
    s8_streams: int = 64
    s8_tokens: int = 256
    s9_runs: int = 3
    s9_sentences: int = 125  # the first turn: about 2,000 tokens


FULL = Sizes()
SMOKE = Sizes(
    s1_requests=20,
    s2_streams=2,
    s2_tokens=16,
    s2r_streams=1,
    s2r_tokens=8,
    s3_loads=1,
    s4_requests=6,
    s4_reps=1,
    s5_clients=8,
    s5_requests=24,
    s5_reps=1,
    s5_deadline_s=10.0,
    s6_models=50,
    s6_starts=1,
    s6_lists=3,
    s7_requests=40,
    s7_depth=16,
    s8_streams=4,
    s8_tokens=16,
    s9_runs=1,
    s9_sentences=8,
)


def _link(source: Path, target: Path) -> None:
    """A hard link (free, and what the issue allows); a copy where links cannot cross."""
    if target.exists():
        return
    try:
        os.link(source, target)
    except OSError:
        shutil.copyfile(source, target)


@dataclass(frozen=True)
class Models:
    """The models folder of S1–S5 (four models, two of them the same tiny file)."""

    dir: Path

    def path(self, name: str) -> Path:
        return self.dir / f"{name}.gguf"

    @classmethod
    def build(cls, demo: Path, where: Path) -> Models:
        where.mkdir(parents=True, exist_ok=True)
        for name in (TINY, SMALL, MEDIUM):
            _link(demo / f"{name}.gguf", where / f"{name}.gguf")
        # S5 needs four models; a second name for the tiny file is a model of its own.
        _link(demo / f"{TINY}.gguf", where / f"{TINY_B}.gguf")
        real = real_model_path()
        if real is not None:
            _link(real, where / f"{REAL}.gguf")
        return cls(where)


def scale_dir(demo: Path, where: Path, count: int) -> Path:
    """S6's folder: ``count`` hard links of demo-tiny, one model each."""
    where.mkdir(parents=True, exist_ok=True)
    for i in range(count):
        _link(demo / f"{TINY}.gguf", where / f"scale-{i:04d}.gguf")
    return where


def warm_page_cache(path: Path) -> None:
    """Read a file once so that S3 measures loading, not the disk."""
    with path.open("rb") as f:
        while f.read(1 << 20):
            pass


def rotation(items: Sequence[str], i: int) -> list[str]:
    """Round ``i``'s order: each target goes first in turn, so drift hits every one alike."""
    if not items:
        return []
    k = i % len(items)
    return [*items[k:], *items[:k]]


@dataclass(frozen=True)
class Bench:
    launcher: Launcher
    models: Models
    demo: Path
    targets: tuple[str, ...]  # the targets chosen on the command line
    sizes: Sizes

    def routers(self) -> list[str]:
        return [t for t in ROUTERS if t in self.targets]


class Fleet:
    """The live servers of one scenario, by target name."""

    def __init__(self, result: ScenarioResult) -> None:
        self.result = result
        self.servers: dict[str, Server] = {}
        self._before: dict[str, CpuTimes] = {}

    def __enter__(self) -> Fleet:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    @property
    def names(self) -> list[str]:
        return list(self.servers)

    def fail(self, target: str, error: BaseException | str) -> None:
        """Drop a target from this scenario, keeping the reason and its log's tail."""
        server = self.servers.pop(target, None)
        message = error if isinstance(error, str) else f"{type(error).__name__}: {error}"
        if server is not None:
            message += "\n--- log tail ---\n" + server.log_tail(1500)
            server.stop()
        self.result.errors.setdefault(target, message)

    async def start(self, servers: dict[str, Server], limit_s: float = 60.0) -> dict[str, float]:
        """Adopt servers already spawned, wait for all to be healthy together.

        Returns the seconds from each spawn to its first ``/health`` 200 (S6 reports them).
        """
        self.servers.update(servers)
        names = list(servers)
        waits = [servers[n].wait_healthy(limit_s) for n in names]
        ready: dict[str, float] = {}
        for name, outcome in zip(
            names, await asyncio.gather(*waits, return_exceptions=True), strict=True
        ):
            if isinstance(outcome, Exception):
                self.fail(name, outcome)
            elif isinstance(outcome, BaseException):
                raise outcome  # cancellation (Ctrl-C) must propagate, not count as a failure
            else:
                ready[name] = outcome
        return ready

    async def start_routers(
        self,
        bench: Bench,
        label: str,
        models_dir: Path,
        models_max: int,
        extra: Sequence[str] = (),
        corral_extra: Sequence[str] = (),
    ) -> None:
        spawned = {
            kind: bench.launcher.router(kind, label, models_dir, models_max, extra, corral_extra)
            for kind in bench.routers()
        }
        await self.start(spawned)

    async def start_direct(
        self, bench: Bench, label: str, model: str, extra: Sequence[str] = ()
    ) -> None:
        if DIRECT in bench.targets:
            server = bench.launcher.direct(label, bench.models.path(model), model, extra)
            await self.start({DIRECT: server})

    def mark(self) -> None:
        """Start of the measured phase: CPU counters from here on are the scenario's."""
        self._before = {name: server.cpu() for name, server in self.servers.items()}

    def measure(self) -> None:
        """End of the measured phase: CPU spent since :meth:`mark`, and the peak RSS."""
        for name, server in self.servers.items():
            if name in self._before:
                self.result.resources[name] = Resources.between(server, self._before[name])

    def close(self) -> None:
        for server in self.servers.values():
            server.stop()
        self.servers.clear()
