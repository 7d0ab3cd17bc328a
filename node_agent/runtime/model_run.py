"""One model's child, from the granted load to its exit.

A :class:`ModelRun` owns one child: it spawns it, reports what the child does (spawned and
listening, ready, asleep, awake) to the runtime's owner as scheduler events, stops it when
told to, and records how it ended. It holds no scheduler and decides nothing (it imports
nothing of the core): whether it may spawn, when its drain is over and whether its exit was
a failure are the scheduler's calls, carried out by the owner (``runtime.registry``).
"""

from __future__ import annotations

import asyncio
import enum
import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from node_agent.child.logs import LogRing
from node_agent.child.process import EXIT_NOT_RUN
from node_agent.child.state import ChildEvent, EventKind
from node_agent.sources.spec import ModelSpec

log = logging.getLogger("corral.model_run")

FAKE_TIMING_SECONDS = 2.0
SHUTTING_DOWN = "the agent is shutting down"


class Child(Protocol):
    """One llama-server as a run drives it (``child.process.ChildProcess``; tests' fakes)."""

    @property
    def port(self) -> int | None: ...
    @property
    def pid(self) -> int | None: ...
    @property
    def meta(self) -> Mapping[str, Any] | None:
        """The child's ``ready`` payload (llama-server's model entry), None before."""

    @property
    def logs(self) -> LogRing | None:
        """The model's log ring (it outlives restarts), or None when the child keeps none."""

    async def start(self) -> None: ...
    async def stop(self, *, now: bool = False) -> int | None:
        """Stop the child; ``now``: kill it at once (its drain is over)."""

    async def wait_exited(self) -> int: ...
    def kill(self) -> None:
        """End the child now (SIGKILL), without waiting: a forced shutdown."""


ChildFactory = Callable[[ModelSpec, Callable[[ChildEvent], None]], Child]
"""Makes a model's child; the callback receives the child's events as they happen."""

Publish = Callable[[str, str, "dict[str, Any] | None"], None]


class RunEvent(enum.Enum):
    """What a run reports of its child (the owner turns each into a scheduler event)."""

    SPAWNED = "spawned"  # a process exists, listening on the port reported with it
    READY = "ready"  # it serves, on the port reported with it
    SLEEPING = "sleeping"
    WOKE = "woke"


Report = Callable[[RunEvent, "int | None"], None]
"""A run's report to its owner: what happened, and the child's port."""


@dataclass(frozen=True)
class Outcome:
    """How a run ended: its exit code, why (the child's own error line, or the failed
    start's), whether a process ever existed, and whether the load was withdrawn before it
    could start (the agent began to close)."""

    code: int
    reason: str
    spawned: bool
    withdrawn: bool = False


class ModelRun:
    """One model's child from the granted load to its exit."""

    def __init__(
        self,
        spec: ModelSpec,
        factory: ChildFactory,
        *,
        report: Report,
        publish: Publish,
        may_spawn: Callable[[], bool],
        fake_timing: bool = False,
        after_start: Callable[[Child], Awaitable[None]] | None = None,
    ) -> None:
        self.name = spec.name
        self.spec = spec
        self._report = report
        self._publish = publish
        self._may_spawn = may_spawn
        self._fake_timing = fake_timing
        # Work on the started child before it takes its first request (warm swaps' restore).
        self._after_start = after_start
        self.child = factory(spec, self._on_child_event)
        logs = self.child.logs
        self._log_seq = logs.statistics().appended if logs is not None else 0
        self.spawned = False  # a process exists (the scheduler was told: loading)

    # -- the child's events ----------------------------------------------------------------

    def _on_child_event(self, event: ChildEvent) -> None:
        if event.kind is EventKind.SPAWNED:
            if not self.spawned:  # a process now exists: ``loading`` from here, not before
                self.spawned = True
                self._report(RunEvent.SPAWNED, self.child.port)
                self._publish(self.name, "model_status", {"status": "loading"})
        elif event.kind is EventKind.LOADING and event.progress is not None:
            progress = dict(event.loading) if event.loading else {"value": event.progress}
            self._publish(self.name, "status_change", {"status": "loading", "progress": progress})
        elif event.kind is EventKind.SLEEPING:
            self._report(RunEvent.SLEEPING, self.child.port)
            self._publish(self.name, "status_change", {"status": "sleeping"})
        elif event.kind is EventKind.WOKE:
            self._report(RunEvent.WOKE, self.child.port)
            self._publish(self.name, "status_change", {"status": "loaded"})

    # -- the run ---------------------------------------------------------------------------

    async def run(self) -> Outcome:
        """Spawn, report ready; then wait for the exit and say how it went."""
        name = self.name
        if self._fake_timing:
            await asyncio.sleep(FAKE_TIMING_SECONDS)
        if not self._may_spawn():  # the agent began closing meanwhile
            return Outcome(EXIT_NOT_RUN, SHUTTING_DOWN, spawned=False, withdrawn=True)
        reason = ""
        try:
            await self.child.start()
            if self._after_start is not None:
                await self._after_start(self.child)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # a failed start is reported as the child's exit below
            reason = str(exc)
            log.warning("model=%s failed to load: %s", name, reason)
        else:
            self._report(RunEvent.READY, self.child.port)
            log.info("model=%s loaded (pid=%s port=%s)", name, self.child.pid, self.child.port)
            data: dict[str, Any] = {"status": "loaded"}
            if self.child.meta is not None:
                data["info"] = dict(self.child.meta)  # llama.cpp sends the ready payload
            self._publish(name, "status_change", data)
        code = await self.child.wait_exited()
        return Outcome(code, reason or self._last_error(), self.spawned)

    async def stop(self, *, cut: bool) -> None:
        """Ask the child to exit (``cut``: requests are still in flight, so kill it)."""
        if cut:
            log.info("model=%s: drain over with requests in flight; they are cut", self.name)
        await self.child.stop(now=cut)

    def _last_error(self) -> str:
        """The child's own last error line (of this run: the ring outlives restarts)."""
        logs = self.child.logs
        if logs is None:
            return ""
        return logs.failure_since(self._log_seq) or ""
