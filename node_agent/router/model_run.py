"""One model's life, from the granted load to the child's exit: its one owner.

The registry makes a :class:`ModelRun` when the scheduler grants a load, and from then on the
run is the only code that changes that model's runtime state: it spawns the child, reports
``loading`` (only once a process exists), ``loaded``, ``sleeping``, drains and stops the child
when told to, and reports the exit. (A file the agent downloads is in the cache before the
load is granted: ``router.downloads``.) Every decision it needs (may I
spawn? is the drain over?) is the scheduler's; the run only carries it out and feeds the
scheduler the child's events.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from node_agent.aio import Changed
from node_agent.child.logs import LogRing, failure_line
from node_agent.child.process import EXIT_NOT_RUN
from node_agent.child.state import ChildEvent, EventKind
from node_agent.core.scheduler import Scheduler
from node_agent.router.events import Event, EventHub
from node_agent.sources.spec import ModelSpec

if TYPE_CHECKING:
    from node_agent.router.memory import MemoryWatch

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


@dataclass(frozen=True)
class RunContext:
    """What every run shares with the registry: the scheduler it reports to, the ledger, the
    clock, the event hub, and the registry's "something changed" signal."""

    sched: Scheduler
    memory: MemoryWatch | None
    clock: Callable[[], float]
    hub: EventHub
    changed: Changed
    wake: Callable[[], None]  # the registry's: logs the state changes, then notifies
    stop: Callable[[str, str], object]  # the registry's: drain and stop a model (a reason)
    fake_timing: bool

    def publish(self, model: str, event: str, data: dict[str, Any] | None) -> None:
        self.hub.publish(Event(model, event, data))


class ModelRun:
    """One model's child from the granted load to its reported exit."""

    def __init__(
        self,
        ctx: RunContext,
        spec: ModelSpec,
        factory: ChildFactory,
    ) -> None:
        self.ctx = ctx
        self.name = spec.name
        self.spec = spec
        self.child = factory(spec, self._on_child_event)
        logs = self.child.logs
        self.log_seq = logs.statistics().appended if logs is not None else 0
        self.stop_reason: str | None = None  # manual, evict, ttl, reload, shutdown; None: crash
        # Free memory per device just before the stop, and what the model held: after the
        # exit the run waits until that memory shows free again (GPUs report it late).
        self.freed_check: tuple[dict[str, int], dict[str, int]] | None = None
        self.loading = False  # the scheduler shows the model loading (a process exists)
        self.started = False  # child.start() was called
        self.task: asyncio.Task[None] | None = None
        self.stop_task: asyncio.Task[None] | None = None
        if ctx.memory is not None:
            # The ledger counts a granted load from the grant on (at its estimate), so that
            # no second load is granted into the same memory before this one has spawned.
            ctx.memory.warn_if_short(self.name)
            ctx.memory.spawned(self.name)

    # -- the child's events ----------------------------------------------------------------

    def _on_child_event(self, event: ChildEvent) -> None:
        if event.kind is EventKind.SPAWNED:
            self._begin_loading()
        elif event.kind is EventKind.LOADING and event.progress is not None:
            progress = dict(event.loading) if event.loading else {"value": event.progress}
            self.ctx.publish(
                self.name, "status_change", {"status": "loading", "progress": progress}
            )
        elif event.kind is EventKind.SLEEPING:
            self.ctx.sched.on_sleeping(self.name)
            if self.ctx.memory is not None:
                self.ctx.memory.sleeping(self.name)
            self.ctx.publish(self.name, "status_change", {"status": "sleeping"})
            self.ctx.wake()
        elif event.kind is EventKind.WOKE:
            self.ctx.sched.on_woke(self.name)
            if self.ctx.memory is not None:
                self.ctx.memory.ready(self.name, self.child.pid)
            self.ctx.publish(self.name, "status_change", {"status": "loaded"})
            self.ctx.wake()

    def _begin_loading(self) -> None:
        """A process now exists for this load: the model is ``loading`` from here, and not a
        moment before."""
        if self.loading:
            return
        self.loading = True
        self.ctx.sched.claim_done(self.name, spawned=True, now=self.ctx.clock())
        self.ctx.publish(self.name, "model_status", {"status": "loading"})
        self.ctx.wake()
        if self.ctx.sched.closing:  # spawned as the agent began to close: stop it too
            self.ctx.stop(self.name, "shutdown")

    # -- the owner -------------------------------------------------------------------------

    async def run(self) -> None:
        """Spawn, report ready; then wait for the exit and report that."""
        ctx, name = self.ctx, self.name
        if ctx.fake_timing:
            await asyncio.sleep(FAKE_TIMING_SECONDS)
        if not ctx.sched.may_spawn(name):  # the agent began closing meanwhile
            if ctx.memory is not None:
                ctx.memory.unloaded(name)
            ctx.sched.claim_done(name, spawned=False, reason=SHUTTING_DOWN)
            ctx.wake()
            return
        reason = ""
        try:
            self.started = True
            await self.child.start()
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # a failed start is reported as the child's exit below
            reason = str(exc)
            log.warning("model=%s failed to load: %s", name, reason)
        else:
            ctx.sched.on_ready(name, ctx.clock())
            if ctx.memory is not None:
                ctx.memory.ready(name, self.child.pid)
            log.info("model=%s loaded (pid=%s port=%s)", name, self.child.pid, self.child.port)
            data: dict[str, Any] = {"status": "loaded"}
            if self.child.meta is not None:
                data["info"] = dict(self.child.meta)  # llama.cpp sends the ready payload
            ctx.publish(name, "status_change", data)
            ctx.wake()
        code = await self.child.wait_exited() if self.started else EXIT_NOT_RUN
        await self._report_exit(code, reason or self._last_error())

    async def _report_exit(self, code: int, reason: str) -> None:
        ctx, name = self.ctx, self.name
        if ctx.memory is not None:
            # Still "stopping" to the scheduler meanwhile: nobody loads into memory that does
            # not show free yet.
            check = self.freed_check
            if check is not None and not await ctx.memory.wait_freed(*check):
                log.warning("model=%s: its memory did not show free in time", name)
            ctx.memory.unloaded(name)
        if not self.loading:  # nothing ever ran (the binary could not be started)
            ctx.sched.on_spawn_failed(name, ctx.clock(), reason or f"exit code {code}")
        else:
            failed = not ctx.sched.view(name).stopping
            ctx.sched.on_exited(name, code, ctx.clock(), reason=reason)
            if failed:
                log.warning("model=%s exited unexpectedly with code %s", name, code)
        data = {
            "status": "unloaded",
            "exit_code": code,
            # Corral's extra (llama.cpp's clients see its shape unchanged): why it stopped.
            "corral": {"reason": self.stop_reason or "crash"},
        }
        ctx.publish(name, "status_change", data)

    # -- stopping --------------------------------------------------------------------------

    async def drain_and_stop(self, release_port: Callable[[int], Awaitable[None]] | None) -> None:
        """Let requests in flight finish until the scheduler says the drain is over, then
        stop the child. A stream cut by the drain deadline ends with an error event when the
        child exits: its connection is released only once its last user is done."""
        ctx, name = self.ctx, self.name
        while True:
            changed = ctx.changed.current()  # before the look: no change slips in between
            if ctx.sched.drain_over(name, ctx.clock()):
                break
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(changed.wait(), ctx.sched.drain_left(name, ctx.clock()))
        # Requests still in flight: the drain deadline cut them; llama-server would finish
        # them before it obeys the exit command, so the child is killed now.
        cut = ctx.sched.view(name).in_flight > 0 if name in ctx.sched else False
        port = self.child.port
        if release_port is not None and port is not None:
            # A child with an idle keep-alive connection open exits 10 ms slower.
            await release_port(port)
        if cut:
            log.info("model=%s: drain over with requests in flight; they are cut", name)
        await self.child.stop(now=cut)
        if self.task is not None:
            await asyncio.shield(self.task)

    def _last_error(self) -> str:
        """The child's own last error line (of this run: the ring outlives restarts)."""
        logs = self.child.logs
        if logs is None:
            return ""
        return failure_line(logs.lines_since(self.log_seq)[1]) or ""
