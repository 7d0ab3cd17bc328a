"""The registry: the one owner of the agent's models, their children and the scheduler.

All scheduling state lives in the pure :class:`~node_agent.core.scheduler.Scheduler`; this
module only carries out its decisions (spawn a child, stop a victim) and turns child events
into scheduler events. Every mutation happens synchronously on the event loop, between two
awaits, so nothing here needs a lock: asyncio runs one step at a time, and a request's
"is it ready?" and "take the lease" are one step (never split by an eviction).

Each child has one owner task (:meth:`Registry._own_child`): it starts the child, waits for
it to exit and reports the exit. Stopping goes through :meth:`Registry._stop`, which drains
requests in flight (up to the model's stop timeout) before asking the child to exit.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Any

from node_agent.aio import Changed, TaskSet
from node_agent.child.logs import LogRing, failure_line
from node_agent.child.process import EXIT_NOT_RUN
from node_agent.core.scheduler import DecisionKind, Lease, ModelState, Scheduler
from node_agent.errors import ApiError
from node_agent.router.events import Event, EventHub
from node_agent.router.keep_alive import parse_keep_alive
from node_agent.router.refusals import (
    backoff_error,
    failed_error,
    queue_full_error,
    queue_timeout_error,
)
from node_agent.router.running import Child, ChildFactory, ModelEvents, Running
from node_agent.sources.catalog import Catalog
from node_agent.sources.download import (
    DownloadError,
    DownloadPlan,
    fetch,
    needs_download,
    with_local_model,
)
from node_agent.sources.spec import ModelSpec

if TYPE_CHECKING:
    from node_agent.router.memory import MemoryWatch

log = logging.getLogger(__name__)

# llama.cpp's router honours this to make its races reproducible; so do we (SPEC).
FAKE_TIMING_ENV = "LLAMA_SERVER_DEBUG_FAKE_TIMING"
FAKE_TIMING_SECONDS = 2.0
DEFAULT_PARALLEL = 4  # llama-server's slots when -np is not given (or is -1, auto)
TTL_CHECK_SECONDS = 0.25  # how often idle models are checked against their TTL


class Registry:
    """Models by name, their children, and the scheduler that decides between them."""

    def __init__(
        self,
        catalog: Catalog,
        *,
        models_max: int,
        child_factory: ChildFactory,
        memory: MemoryWatch | None = None,
        ttl: float | None = None,
        queue_timeout: float | None = None,
        max_queue: int | None = None,
        release_port: Callable[[int], Awaitable[None]] | None = None,
        clock: Callable[[], float] = time.monotonic,
        fake_timing: bool | None = None,
    ) -> None:
        self._sched = Scheduler(models_max, memory)
        self.memory = memory
        self.ttl = ttl  # seconds idle before unload, for models without their own ``ttl``
        self.queue_timeout = queue_timeout
        self.max_queue = max_queue
        # Closes the proxy's idle connections to a child before it is asked to exit.
        self._release_port = release_port
        self._keep_alive: dict[str, float | None] = {}  # per-request overrides (Ollama's)
        self._specs: dict[str, ModelSpec] = {}
        self._aliases: dict[str, str] = {}
        self._running: dict[str, Running] = {}
        self._factory = child_factory
        self._clock = clock
        self._changed = Changed()
        self._tasks = TaskSet("registry")
        self._hub = EventHub()
        self.fake_timing = (
            bool(os.environ.get(FAKE_TIMING_ENV)) if fake_timing is None else fake_timing
        )
        self._set_specs(catalog.models, catalog.aliases)

    # -- catalog -----------------------------------------------------------------------------

    def _set_specs(self, specs: Mapping[str, ModelSpec], aliases: Mapping[str, str]) -> None:
        self._specs = dict(specs)
        self._aliases = dict(aliases)  # the catalog's, already checked for collisions
        for name, spec in self._specs.items():
            self._sched.add_model(name, pin=spec.pin, priority=spec.priority)

    def resolve(self, name: str) -> str | None:
        """The canonical name for a model name or alias, or None when unknown."""
        if name in self._specs:
            return name
        return self._aliases.get(name)

    def spec(self, name: str) -> ModelSpec:
        return self._specs[name]

    def specs(self) -> Mapping[str, ModelSpec]:
        return self._specs

    @property
    def scheduler(self) -> Scheduler:
        """Read access for snapshots (``/models``, metrics, tests); never mutate it."""
        return self._sched

    def slots(self, name: str) -> int:
        """How many requests ``name``'s child serves at once (its ``-np``; llama-server's
        default is 4)."""
        value = self._specs[name].get("parallel")
        try:
            parallel = int(value) if isinstance(value, str) else 0
        except ValueError:
            parallel = 0
        return parallel if parallel > 0 else DEFAULT_PARALLEL

    def now(self) -> float:
        """The registry's clock (monotonic seconds), for views of scheduler times."""
        return self._clock()

    def child(self, name: str) -> Child | None:
        running = self._running.get(name)
        return running.child if running is not None else None

    async def reload(self, catalog: Catalog, changed: set[str]) -> None:
        """Apply a re-read catalog: stop models that vanished or whose arguments changed.

        The others are updated in place. Requests for a changed model that arrive meanwhile
        wait in the queue and load it again with its new arguments.
        """
        specs = catalog.models
        gone = [name for name in self._specs if name not in specs]
        # Gone models stay known until their children have stopped (draining).
        self._set_specs({**{n: self._specs[n] for n in gone}, **specs}, catalog.aliases)
        stops = [self._stop(name, "reload") for name in (*gone, *changed)]
        await _wait_all(stops)
        for name in gone:
            if name not in self._running:
                self._sched.remove_model(name)
                self._specs.pop(name, None)
        self._publish("*", "models_reload", None)
        self._wake()
        # Presets added (or switched to load-on-startup) at runtime load now, as at start.
        for name, spec in specs.items():
            if spec.load_on_startup and not self._sched.view(name).state.running:
                self._tasks.spawn(self._load_quietly(name), f"startup:{name}")

    # -- requests ----------------------------------------------------------------------------

    async def acquire(self, name: str, *, autoload: bool, inference: bool = True) -> Lease:
        """Wait until ``name`` can take a request and lease it; load it when allowed.

        Cancelling (the client went away) leaves the queue; a load it started goes on. With
        ``--max-queue`` a request beyond that many waiters, and with ``--queue-timeout`` one
        that waited that long, gets 503 with Retry-After instead of an endless wait.
        """
        lease = self._sched.try_lease(name, self._clock(), inference=inference)
        if lease is not None:
            return lease
        if not autoload and not self._sched.view(name).state.running:
            raise ApiError(400, "model is not loaded")
        if self.max_queue is not None and self._sched.view(name).queued >= self.max_queue:
            raise queue_full_error(name, self.max_queue)
        self._prepare(name)
        waiter = self._sched.join(name)
        deadline = None if self.queue_timeout is None else self._clock() + self.queue_timeout
        try:
            while True:
                changed = self._changed.current()
                self._tick()
                decision = self._sched.poll(
                    waiter, self._clock(), inference=inference, may_load=autoload
                )
                if decision.kind is DecisionKind.LEASED:
                    assert decision.lease is not None
                    return decision.lease
                if decision.kind is DecisionKind.LOAD:
                    self._start(name)
                    continue
                if decision.kind is DecisionKind.UNLOADED:
                    raise ApiError(400, "model is not loaded")
                if decision.kind is DecisionKind.FAILED:
                    raise failed_error(name, decision.reason)
                if decision.kind is DecisionKind.GONE:
                    raise ApiError(400, f"model '{name}' not found")
                if decision.kind is DecisionKind.BACKOFF:
                    raise backoff_error(name, decision.reason, decision.retry_after)
                await self._wait_change(changed, deadline, name)
        finally:
            self._sched.leave(waiter)
            self._wake()

    async def _wait_change(self, changed: asyncio.Event, deadline: float | None, name: str) -> None:
        view = self._sched.view(name)
        if deadline is None or (view.state is ModelState.LOADING and not view.stopping):
            # The queue timeout bounds the wait for a turn, not a load already under way:
            # a big model that takes longer to load than the timeout must still be servable.
            await changed.wait()
            return
        try:
            await asyncio.wait_for(changed.wait(), max(0.0, deadline - self._clock()))
        except TimeoutError:
            assert self.queue_timeout is not None
            raise queue_timeout_error(name, self.queue_timeout) from None

    def release(self, lease: Lease) -> None:
        self._sched.release(lease, self._clock())
        self._wake()

    def port(self, lease: Lease) -> int:
        """The port of the child a lease points at (leased models always have a child)."""
        running = self._running.get(lease.model)
        if running is None or running.child.port is None:
            raise ApiError(500, f"model name={lease.model} is not running")
        return running.child.port

    async def load(self, name: str) -> None:
        """``POST /models/load``: start loading ``name`` (returns once it is spawned)."""
        view = self._sched.view(name)
        if view.state.running and not view.stopping:
            raise ApiError(400, "model is already running")
        self._prepare(name)
        waiter = self._sched.join(name)
        try:
            while True:
                changed = self._changed.current()
                self._tick()
                decision = self._sched.poll(waiter, self._clock())
                if decision.kind is DecisionKind.LEASED:
                    assert decision.lease is not None
                    self._sched.release(decision.lease, self._clock())
                    return
                if decision.kind is DecisionKind.LOAD:
                    self._start(name)
                    return
                if decision.kind is DecisionKind.FAILED:
                    raise failed_error(name, decision.reason)
                if decision.kind is DecisionKind.GONE:
                    raise ApiError(404, f"model '{name}' not found")
                if decision.kind is DecisionKind.BACKOFF:
                    raise backoff_error(name, decision.reason, decision.retry_after)
                if self._sched.stuck(name):
                    # Only busy models could make room: a request would wait, but a direct
                    # load is told to come back (llama.cpp's wording).
                    raise ApiError(500, "model limit reached, try again later")
                await changed.wait()
        finally:
            self._sched.leave(waiter)
            self._wake()

    async def unload(self, name: str) -> None:
        """``POST /models/unload``: drain and stop ``name``; returns once stopping began."""
        if not self._sched.view(name).state.running:
            raise ApiError(400, "model is not running")
        self._stop(name, "manual")

    # -- the scheduler's decisions -----------------------------------------------------------

    def _wake(self) -> None:
        self._changed.notify()

    def _prepare(self, name: str) -> None:
        if self.memory is not None:
            self.memory.prepare(self._specs[name])

    def _tick(self) -> None:
        if self.memory is not None:
            self.memory.refresh()
        for eviction in self._sched.tick():
            log.info("evicting model=%s to make room (%s)", eviction.model, eviction.reason)
            self._begin_stop(eviction.model, eviction.reason)

    def _start(self, name: str) -> None:
        """Spawn ``name``'s child (the caller holds the scheduler's claim)."""
        spec = self._specs[name]
        plan = needs_download(spec)  # pure; the preset parser has checked its keys
        if plan is not None:  # the child loads the verified file from where fetch() puts it
            spec = with_local_model(spec, plan.destination)
        child = self._factory(spec, ModelEvents(self, name))
        running = self._running[name] = Running(child, download=plan)
        logs = getattr(child, "logs", None)
        if isinstance(logs, LogRing):
            running.log_seq = logs.statistics().appended
        self._sched.claim_done(name, spawned=True)
        if self.memory is not None:
            self.memory.warn_if_short(name)
            self.memory.spawned(name)
        self._publish(name, "model_status", {"status": "loading"})
        running.task = self._tasks.spawn(self._own_child(name, running), f"child:{name}")
        self._wake()

    async def _own_child(self, name: str, running: Running) -> None:
        """Start the child, report ready, then wait for its exit and report that."""
        reason = ""
        spawned = False  # a failed or stopped download never spawns the child
        try:
            if self.fake_timing:
                await asyncio.sleep(FAKE_TIMING_SECONDS)
            if running.download is not None:
                await self._fetch_model(name, running, running.download)
            spawned = True
            await running.child.start()
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # a failed start is reported as the child's exit below
            reason = str(exc)
            log.warning("model=%s failed to load: %s", name, reason)
        else:
            self._sched.on_ready(name, self._clock())
            if self.memory is not None:
                self.memory.ready(name, running.child.pid)
            log.info(
                "model=%s loaded (pid=%s port=%s)", name, running.child.pid, running.child.port
            )
            info = getattr(running.child, "meta", None)
            data: dict[str, Any] = {"status": "loaded"}
            if isinstance(info, Mapping):
                data["info"] = dict(info)  # llama.cpp sends the child's ready payload
            self._publish(name, "status_change", data)
            self._wake()
        code = await running.child.wait_exited() if spawned else EXIT_NOT_RUN
        if self.memory is not None:
            # Still "stopping" to the scheduler meanwhile: nobody loads into memory that does
            # not show free yet.
            check = running.freed_check
            if check is not None and not await self.memory.wait_freed(*check):
                log.warning("model=%s: its memory did not show free in time", name)
            self.memory.unloaded(name)
        if self._running.get(name) is running:
            del self._running[name]
        failed = not self._sched.view(name).stopping
        self._sched.on_exited(name, code, self._clock(), reason=reason or self._last_error(running))
        if failed:
            log.warning("model=%s exited unexpectedly with code %s", name, code)
        data = {
            "status": "unloaded",
            "exit_code": code,
            # Corral's extra (llama.cpp's clients see its shape unchanged): why it stopped.
            "corral": {"reason": running.stop_reason or "crash"},
        }
        self._publish(name, "status_change", data)
        if name not in self._specs:
            self._sched.remove_model(name)
        self._wake()

    async def _fetch_model(self, name: str, running: Running, plan: DownloadPlan) -> None:
        """Download the model's file (``downloading`` on /models/sse). Its own task, so that a
        stop can cancel the download alone and the owner still reports the exit."""

        def progress(value: float) -> None:
            data = {"status": "downloading", "progress": {"value": value}}
            self._publish(name, "status_change", data)

        progress(0.0)
        fetching = running.fetching = asyncio.ensure_future(
            fetch(plan.url, plan.destination.parent, plan.sha256, progress=progress)
        )
        try:
            await asyncio.wait([fetching])
        finally:
            running.fetching = None
            if not fetching.done():  # the owner itself was cancelled (shutdown)
                fetching.cancel()
                await asyncio.wait([fetching])
        if fetching.cancelled():
            raise DownloadError(f"stopped while downloading {plan.url}")
        fetching.result()  # DownloadError / ChecksumError: the load failed, with its reason
        if self.memory is not None:  # the estimate needs the file, which now exists
            self.memory.prepare(with_local_model(self._specs[name], plan.destination))

    def _begin_stop(self, name: str, reason: str) -> None:
        running = self._running.get(name)
        if running is None or running.stop_task is not None:
            return
        running.stop_reason = reason
        if self.memory is not None:
            running.freed_check = self.memory.exiting(name)
        running.stop_task = self._tasks.spawn(
            self._drain_and_stop(name, running, reason), f"stop:{name}"
        )

    def _stop(self, name: str, reason: str) -> asyncio.Task[None] | None:
        """Mark ``name`` stopping and start its drain; returns the stop's task, if any."""
        self._sched.request_stop(name)
        self._begin_stop(name, reason)
        self._wake()
        running = self._running.get(name)
        return running.stop_task if running is not None else None

    async def _drain_and_stop(self, name: str, running: Running, reason: str) -> None:
        """Let requests in flight finish (up to the stop timeout), then stop the child."""
        spec = self._specs.get(name)
        timeout = spec.stop_timeout if spec is not None else 10.0
        deadline = self._clock() + timeout
        log.info("stopping model=%s (%s)", name, reason)
        while self._sched.view(name).in_flight > 0 and self._clock() < deadline:
            changed = self._changed.current()
            try:
                await asyncio.wait_for(changed.wait(), max(0.0, deadline - self._clock()))
            except TimeoutError:
                break
        if running.fetching is not None:
            running.fetching.cancel()  # a stop during the download ends it (no .part is left)
        port = running.child.port
        if self._release_port is not None and port is not None:
            # A child with an idle keep-alive connection open exits 10 ms slower.
            await self._release_port(port)
        await running.child.stop()
        if running.task is not None:
            await asyncio.shield(running.task)

    @staticmethod
    def _last_error(running: Running) -> str:
        """The child's own last error line (of this run: the ring outlives restarts)."""
        logs = getattr(running.child, "logs", None)
        if not isinstance(logs, LogRing):
            return ""
        return failure_line(logs.lines_since(running.log_seq)[1]) or ""

    def _child_slept(self, name: str) -> None:
        self._sched.on_sleeping(name)
        if self.memory is not None:
            self.memory.sleeping(name)
        self._publish(name, "status_change", {"status": "sleeping"})
        self._wake()

    def _child_woke(self, name: str) -> None:
        self._sched.on_woke(name)
        running = self._running.get(name)
        if self.memory is not None and running is not None:
            self.memory.ready(name, running.child.pid)
        self._publish(name, "status_change", {"status": "loaded"})
        self._wake()

    # -- events ------------------------------------------------------------------------------

    def _publish(self, model: str, event: str, data: dict[str, Any] | None) -> None:
        self._hub.publish(Event(model, event, data))

    def events(self) -> AsyncIterator[Event]:
        """Every event from now on, for one ``/models/sse`` client (or metrics, the page)."""
        return self._hub.subscribe()

    # -- idle unload ---------------------------------------------------------------------------

    def keep_alive(self, name: str, value: object) -> None:
        """A request's ``keep_alive`` (Ollama's): how long ``name`` stays after it is idle.

        0 unloads it as soon as it is idle, a negative number keeps it forever, a duration
        (``"5m"``, ``"30s"``, seconds as a number) sets its idle time; the last request's
        value holds until another request says otherwise. Raises ApiError on a bad value.
        """
        self._keep_alive[name] = parse_keep_alive(value)

    def ttl_of(self, name: str) -> float | None:
        """Seconds ``name`` may stay idle: last keep_alive, else its preset, else the agent's."""
        if name in self._keep_alive:
            return self._keep_alive[name]
        spec_ttl = self._specs[name].ttl
        if spec_ttl is not None:
            return spec_ttl if spec_ttl > 0 else None  # ttl = 0 in a preset: never
        return self.ttl

    async def _expire_idle(self) -> None:
        """Unload models idle past their TTL; never one with a request in flight."""
        while True:
            await asyncio.sleep(TTL_CHECK_SECONDS)
            ttls = {
                name: ttl
                for name in self._running
                if name in self._specs and (ttl := self.ttl_of(name)) is not None
            }
            for name in self._sched.expired(self._clock(), ttls):
                log.info("model=%s idle for %gs (its ttl): unloading", name, ttls[name])
                self._stop(name, "ttl")

    # -- lifecycle ---------------------------------------------------------------------------

    async def start(self) -> None:
        """Load the models marked ``load-on-startup`` (in the background, like llama.cpp)."""
        for name, spec in self._specs.items():
            if spec.load_on_startup:
                self._tasks.spawn(self._load_quietly(name), f"startup:{name}")
        self._tasks.spawn(self._expire_idle(), "ttl")

    async def _load_quietly(self, name: str) -> None:
        try:
            await self.load(name)
        except ApiError as exc:
            log.warning("load-on-startup of model=%s: %s", name, exc.message)

    async def close(self) -> None:
        """Stop every child (draining requests up to their stop timeouts), then the tasks."""
        await _wait_all([self._stop(name, "shutdown") for name in list(self._running)])
        await self._tasks.close()

    def state(self, name: str) -> ModelState:
        return self._sched.view(name).state


async def _wait_all(tasks: list[asyncio.Task[None] | None]) -> None:
    """Wait for stop tasks without cancelling them when the waiter is cancelled."""
    pending = [t for t in tasks if t is not None]
    if pending:
        await asyncio.wait([asyncio.shield(t) for t in pending])
