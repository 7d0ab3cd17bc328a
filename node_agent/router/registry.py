"""The registry: the one owner of the agent's models, their children and the scheduler.

All scheduling state lives in the pure :class:`~node_agent.core.scheduler.Scheduler`; this
module only carries out its decisions (spawn a child, stop a victim) and turns child events
into scheduler events. Every mutation happens synchronously on the event loop, between two
awaits, so nothing here needs a lock: asyncio runs one step at a time, and a request's
"is it ready?" and "take the lease" are one step (never split by an eviction).

Each model's life has one owner, a :class:`~node_agent.router.model_run.ModelRun`: it
spawns the child, reports its states and its exit. Stopping goes through
:meth:`Registry._stop`, which has the run drain requests in flight (until the scheduler's drain
deadline: the model's stop timeout, or the shutdown's) before it asks the child to exit.
Requests are admitted by one loop (:meth:`Registry._admit`) for both proxied requests and
``POST /models/load``.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import AsyncGenerator, Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from node_agent.aio import Changed, TaskSet
from node_agent.core.scheduler import Decision, DecisionKind, Lease, ModelState, Scheduler
from node_agent.core.victims import RESIDENCY_FACTOR
from node_agent.errors import ApiError
from node_agent.router.downloads import Downloads, DownloadSettings
from node_agent.router.events import Event, EventHub
from node_agent.router.keep_alive import parse_keep_alive
from node_agent.router.model_run import SHUTTING_DOWN, Child, ChildFactory, ModelRun, RunContext
from node_agent.router.refusals import (
    backoff_error,
    closing_error,
    failed_error,
    queue_full_error,
    queue_timeout_error,
)
from node_agent.sources.catalog import Catalog
from node_agent.sources.download import needs_download
from node_agent.sources.spec import ModelSpec

if TYPE_CHECKING:
    from node_agent.router.memory import MemoryWatch

log = logging.getLogger("corral.registry")

# llama.cpp's router honours this to make its races reproducible; so do we (SPEC).
FAKE_TIMING_ENV = "LLAMA_SERVER_DEBUG_FAKE_TIMING"
DEFAULT_PARALLEL = 4  # llama-server's slots when -np is not given (or is -1, auto)
TTL_CHECK_SECONDS = 0.25  # how often idle models are checked against their TTL
DEFAULT_SHUTDOWN_TIMEOUT = 30.0  # seconds: the agent's --shutdown-timeout
# At shutdown, requests in flight may run until this long before the bound, so that the
# children they cut still exit and the agent ends within it.
SHUTDOWN_EXIT_SECONDS = 2.0


@dataclass(frozen=True)
class RegistryStatistics:
    """A snapshot of the registry's own bookkeeping (beside the scheduler's)."""

    models: int
    runs: int  # models with a child (or a load under way)
    stopping: int  # runs draining or stopping
    tasks: int
    subscribers: int
    closing: bool


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
        shutdown_timeout: float = DEFAULT_SHUTDOWN_TIMEOUT,
        residency_factor: float = RESIDENCY_FACTOR,
        downloads: DownloadSettings | None = None,
    ) -> None:
        self._sched = Scheduler(models_max, memory, residency_factor=residency_factor)
        self.memory = memory
        if memory is not None:
            memory.victims_from(lambda: self._sched.victim_candidates(self._clock()))
        self.ttl = ttl  # seconds idle before unload, for models without their own ``ttl``
        self.queue_timeout = queue_timeout
        self.max_queue = max_queue
        # Closes the proxy's idle connections to a child before it is asked to exit.
        self._release_port = release_port
        self._keep_alive: dict[str, float | None] = {}  # per-request overrides (Ollama's)
        self._specs: dict[str, ModelSpec] = {}
        self._aliases: dict[str, str] = {}
        self._runs: dict[str, ModelRun] = {}
        self._factory = child_factory
        self._clock = clock
        self._changed = Changed()
        self._tasks = TaskSet("registry")
        self._hub = EventHub()
        # Downloads hold no slot and no memory: the scheduler never sees them.
        self.downloads = Downloads(self._hub, downloads or DownloadSettings())
        self.shutdown_timeout = shutdown_timeout
        self.fake_timing = (
            bool(os.environ.get(FAKE_TIMING_ENV)) if fake_timing is None else fake_timing
        )
        self._ctx = RunContext(
            self._sched,
            memory,
            clock,
            self._hub,
            self._changed,
            self._wake,
            self._stop,
            self.fake_timing,
        )
        self._set_specs(catalog.models, catalog.aliases)

    # -- catalog -----------------------------------------------------------------------------

    def _set_specs(self, specs: Mapping[str, ModelSpec], aliases: Mapping[str, str]) -> None:
        self._specs = dict(specs)
        self._aliases = dict(aliases)  # the catalog's, already checked for collisions
        for name, spec in self._specs.items():
            self._sched.add_model(name, pin=spec.pin, priority=spec.priority)

    def resolve(self, name: str) -> str | None:
        """The canonical name for a model name or alias (or a download on its way), or None
        when unknown."""
        if name in self._specs or self.downloads.active(name):
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
        run = self._runs.get(name)
        return run.child if run is not None else None

    async def reload(self, catalog: Catalog, changed: set[str]) -> None:
        """Apply a re-read catalog: stop models that vanished or whose arguments changed.

        The others are updated in place. Requests for a changed model that arrive meanwhile
        wait in the queue and load it again with its new arguments.
        """
        specs = catalog.models
        before = dict(self._specs)
        gone = [name for name in self._specs if name not in specs]
        # Gone models stay known until their children have stopped (draining).
        self._set_specs({**{n: self._specs[n] for n in gone}, **specs}, catalog.aliases)
        stops = [self._stop(name, "reload") for name in (*gone, *changed)]
        await _wait_all(stops)
        for name in gone:
            if name not in self._runs:
                self._sched.remove_model(name)
                self._specs.pop(name, None)
        self._publish("*", "models_reload", None)
        self._wake()
        if not self._sched.closing:
            # Presets added (or switched to load-on-startup) at runtime load now, as at start.
            for name, spec in specs.items():
                was = before.get(name)
                if spec.load_on_startup and (was is None or not was.load_on_startup):
                    self._load_on_startup(name)

    # -- requests ----------------------------------------------------------------------------

    async def acquire(self, name: str, *, autoload: bool, inference: bool = True) -> Lease:
        """Wait until ``name`` can take a request and lease it; load it when allowed.

        Cancelling (the client went away) leaves the queue; a load it started goes on. With
        ``--max-queue`` a request beyond that many waiters, and with ``--queue-timeout`` one
        that waited that long, gets 503 with Retry-After instead of an endless wait; so does
        every request once the agent is closing.
        """
        self._refuse_if_closing()
        if name not in self._specs:  # only a download so far (POST /models): wait for it
            await self.downloads.wait(
                name, queue_timeout=self.queue_timeout, max_queue=self.max_queue
            )
            if self.resolve(name) != name:
                raise failed_error(name, self.downloads.failed(name) or "")
        lease = self._sched.try_lease(name, self._clock(), inference=inference)
        if lease is not None:
            return lease
        if not autoload and not self._sched.view(name).state.running:
            raise ApiError(400, "model is not loaded")
        if self.max_queue is not None and self._sched.view(name).queued >= self.max_queue:
            raise queue_full_error(name, self.max_queue)
        await self._fetch_first(name, queue_timeout=self.queue_timeout, max_queue=self.max_queue)
        lease = await self._admit(name, inference=inference, may_load=autoload, direct=False)
        assert lease is not None
        return lease

    async def load(self, name: str) -> None:
        """``POST /models/load``: start loading ``name``; returns once its child is spawned
        (``loading``), like llama.cpp, or raises when it could not be. A preset whose file
        must be downloaded first returns once the download is on its way (``downloading``):
        llama.cpp answers at once too (its child downloads), and the load goes on."""
        self._refuse_if_closing()
        if name not in self._specs:  # a download on its way (llama.cpp: success, no load)
            return
        view = self._sched.view(name)
        downloading = self.downloads.active(name)  # llama.cpp's child is `loading` then
        if (view.state.running or view.claimed or downloading) and not view.stopping:
            raise ApiError(400, "model is already running")
        plan = needs_download(self._specs[name])
        if plan is not None and not await self.downloads.start_preset(name, plan):
            self._tasks.spawn(
                self._quietly(f"load of model={name}", self._load(name)), f"load:{name}"
            )
            return
        await self._load(name)

    async def _load(self, name: str) -> None:
        """Load ``name`` (its download first, if any); returns once its child is spawned.
        The download is waited for without the queue bounds: the client was told success, and
        ``--load-timeout`` and the downloader's own limits bound it; a failed download leaves
        the model failed (``GET /models``, ``download_failed``)."""
        await self._fetch_first(name, queue_timeout=None, max_queue=None)
        await self._admit(name, inference=True, may_load=True, direct=True)
        while True:  # granted: wait for the spawn (the run's first step)
            changed = self._changed.current()
            view = self._sched.view(name)
            if not view.claimed:
                break
            await changed.wait()
        if self._sched.closing and not view.state.running:
            raise closing_error()
        if view.failed and not view.state.running:
            raise failed_error(name, view.error or "")

    async def _fetch_first(
        self, name: str, *, queue_timeout: float | None, max_queue: int | None
    ) -> None:
        """A preset's file the agent downloads itself: in the cache before the load is queued
        (the download holds no slot and no memory)."""
        plan = needs_download(self._specs[name])
        if plan is not None:
            await self.downloads.fetch_preset(
                name, plan, queue_timeout=queue_timeout, max_queue=max_queue
            )

    def _refuse_if_closing(self) -> None:
        if self._sched.closing:
            raise closing_error()

    async def _admit(
        self, name: str, *, inference: bool, may_load: bool, direct: bool
    ) -> Lease | None:
        """The one admission loop: queue for ``name`` and carry out the scheduler's decisions
        until the request is leased (``direct``: a ``/models/load``, done once its load is
        granted) or refused."""
        await self._prepare(name)
        waiter = self._sched.join(name)
        timeout = None if direct else self.queue_timeout
        deadline = None if timeout is None else self._clock() + timeout
        waiting = False
        try:
            while True:
                changed = self._changed.current()
                self._tick()
                decision = self._sched.poll(
                    waiter, self._clock(), inference=inference, may_load=may_load
                )
                if decision.kind is DecisionKind.LEASED:
                    assert decision.lease is not None
                    if not direct:
                        return decision.lease
                    self._sched.release(decision.lease, self._clock())
                    return None
                if decision.kind is DecisionKind.LOAD:
                    self._start(name)
                    if direct:
                        return None
                    continue
                if decision.kind is not DecisionKind.WAIT:
                    raise _refusal(name, decision, direct=direct)
                if direct and self._sched.stuck(name):
                    # Only busy models could make room: a request would wait, but a direct
                    # load is told to come back (llama.cpp's wording).
                    raise ApiError(500, "model limit reached, try again later")
                if not waiting:
                    waiting = True
                    log.info("request for model=%s waits: %s", name, self._sched.wait_reason(name))
                await self._wait_change(changed, deadline, name)
        finally:
            self._sched.leave(waiter)
            self._wake()

    async def _wait_change(self, changed: asyncio.Event, deadline: float | None, name: str) -> None:
        view = self._sched.view(name)
        loading = view.state is ModelState.LOADING or view.claimed
        if deadline is None or (loading and not view.stopping):
            # The queue timeout bounds the wait for a turn, not a load already under way:
            # a big model that takes longer to load than the timeout must still be servable.
            await changed.wait()
            return
        try:
            await asyncio.wait_for(changed.wait(), max(0.0, deadline - self._clock()))
        except TimeoutError:
            assert self.queue_timeout is not None
            reason = self._sched.wait_reason(name)
            log.info("request for model=%s gave up after %gs: %s", name, self.queue_timeout, reason)
            raise queue_timeout_error(name, self.queue_timeout, reason) from None

    def release(self, lease: Lease) -> None:
        self._sched.release(lease, self._clock())
        self._wake()

    def port(self, lease: Lease) -> int:
        """The port of the child a lease points at (leased models always have a child)."""
        run = self._runs.get(lease.model)
        if run is None or run.child.port is None:
            raise ApiError(500, f"model name={lease.model} is not running")
        return run.child.port

    async def stop_and_wait(self, name: str) -> None:
        """Stop ``name`` if it runs (``DELETE /models``); return once its child has exited."""
        if self.downloads.cancel(name):
            await self.downloads.wait_cancelled(name)
        elif name in self._runs:
            await _wait_all([self._stop(name, "remove")])

    def unload(self, name: str) -> None:
        """``POST /models/unload``: drain and stop ``name``, or cancel its download; returns
        once stopping began."""
        if self.downloads.cancel(name):
            return
        if not self._sched.view(name).state.running:
            raise ApiError(400, "model is not running")
        self._stop(name, "manual")

    # -- the scheduler's decisions -----------------------------------------------------------

    def _wake(self) -> None:
        for change in self._sched.take_transitions():
            log.info("model=%s: %s -> %s", change.model, change.old.value, change.new.value)
        self._changed.notify()

    def _local(self, name: str) -> ModelSpec:
        """``name``'s spec, loading its downloaded file when the agent downloads it."""
        spec = self._specs[name]
        return self.downloads.local(spec, needs_download(spec))

    async def _prepare(self, name: str) -> None:
        if self.memory is not None:
            # Its header and estimate, off the loop and bounded (issue 26, row 6).
            await self.memory.prepare_off_loop([self._local(name)])

    def _tick(self) -> None:
        if self.memory is not None:
            self.memory.refresh()
        for eviction in self._sched.tick(self._clock()):
            log.info("evicting model=%s to make room (%s)", eviction.model, eviction.reason)
            self._begin_stop(eviction.model, eviction.reason)

    def _start(self, name: str) -> None:
        """Start ``name``'s run (the caller holds the scheduler's claim). The model shows
        ``loading`` once the run has spawned its child."""
        spec = self._local(name)
        if self.memory is not None:
            spec = self.memory.placed(spec)  # the GPU(s) it goes to, chosen now
        run = self._runs[name] = ModelRun(self._ctx, spec, self._factory)
        run.task = self._tasks.spawn(self._own(run), f"run:{name}")

    async def _own(self, run: ModelRun) -> None:
        try:
            await run.run()
        finally:
            if self._runs.get(run.name) is run:
                del self._runs[run.name]
            gone = run.name not in self._specs and run.name in self._sched
            if gone and not self._sched.view(run.name).state.running:
                self._sched.remove_model(run.name)
            self._wake()

    def _begin_stop(self, name: str, reason: str) -> None:
        run = self._runs.get(name)
        if run is None or run.stop_task is not None:
            return
        run.stop_reason = reason
        spec = self._specs.get(name)
        timeout = spec.stop_timeout if spec is not None else run.spec.stop_timeout
        self._sched.begin_drain(name, self._clock() + timeout)
        if self.memory is not None:
            run.freed_check = self.memory.exiting(name)
        log.info("stopping model=%s (%s)", name, reason)
        run.stop_task = self._tasks.spawn(run.drain_and_stop(self._release_port), f"stop:{name}")

    def _stop(self, name: str, reason: str) -> asyncio.Task[None] | None:
        """Mark ``name`` stopping and start its drain; returns the stop's task, if any."""
        self._sched.request_stop(name)
        self._begin_stop(name, reason)
        self._wake()
        run = self._runs.get(name)
        return run.stop_task if run is not None else None

    # -- events ------------------------------------------------------------------------------

    def _publish(self, model: str, event: str, data: dict[str, Any] | None) -> None:
        self._hub.publish(Event(model, event, data))

    publish = _publish  # for the routes that report their own events (DELETE /models)

    def events(self) -> AsyncGenerator[Event, None]:
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
                for name in self._runs
                if name in self._specs and (ttl := self.ttl_of(name)) is not None
            }
            for name in self._sched.expired(self._clock(), ttls):
                log.info("model=%s idle for %gs (its ttl): unloading", name, ttls[name])
                self._stop(name, "ttl")
            if self._sched.statistics().needed:
                # A victim's minimum residency may have ended: waiters look again.
                self._changed.notify()

    # -- lifecycle ---------------------------------------------------------------------------

    def start(self) -> None:
        """Load the models marked ``load-on-startup`` (in the background, like llama.cpp)."""
        for name, spec in self._specs.items():
            if spec.load_on_startup:
                self._load_on_startup(name)
        self._tasks.spawn(self._expire_idle(), "ttl", forever=True)

    def _load_on_startup(self, name: str) -> None:
        self._tasks.spawn(
            self._quietly(f"load-on-startup of model={name}", self.load(name)), f"startup:{name}"
        )

    async def _quietly(self, what: str, load: Awaitable[None]) -> None:
        """A load nobody waits for: its failure is logged (and shown in ``GET /models``)."""
        try:
            await load
        except ApiError as exc:
            log.warning("%s: %s", what, exc.message)

    def begin_close(self) -> None:
        """The agent is shutting down: from now on every request is refused (503 with
        Retry-After), nothing is spawned, and every running model starts draining."""
        if self._sched.closing:
            return
        if self._runs:  # a start that failed to listen has nothing to say here (one line)
            log.info("closing: refusing new requests, draining %d models", len(self._runs))
        bound = self.shutdown_timeout
        drain = bound - SHUTDOWN_EXIT_SECONDS if bound > 2 * SHUTDOWN_EXIT_SECONDS else bound / 2
        deadline = self._clock() + drain
        for name in self._sched.close():
            self._begin_stop(name, "shutdown")
        for name in self._runs:
            self._sched.begin_drain(name, deadline)  # the shutdown's bound wins
        self._wake()

    async def close(self) -> None:
        """Close (see :meth:`begin_close`), wait for every child to stop, then end the tasks."""
        self.begin_close()
        await _wait_all([run.stop_task for run in list(self._runs.values())])
        await _wait_all([run.task for run in list(self._runs.values())])
        await self.downloads.close()
        await self._tasks.close()

    def kill(self) -> None:
        """A forced shutdown (the second signal, or the bound passed): kill every child now."""
        for run in self._runs.values():
            log.warning("killing model=%s (forced shutdown)", run.name)
            run.child.kill()

    def state(self, name: str) -> ModelState:
        return self._sched.view(name).state

    def statistics(self) -> RegistryStatistics:
        return RegistryStatistics(
            models=len(self._specs),
            runs=len(self._runs),
            stopping=sum(1 for run in self._runs.values() if run.stop_task is not None),
            tasks=len(self._tasks),
            subscribers=self._hub.statistics().subscribers,
            closing=self._sched.closing,
        )


def _refusal(name: str, decision: Decision, *, direct: bool) -> ApiError:
    """The error for a waiter the scheduler turned away."""
    if decision.kind is DecisionKind.UNLOADED:
        return ApiError(400, "model is not loaded")
    if decision.kind is DecisionKind.FAILED:
        if decision.reason == SHUTTING_DOWN:
            return closing_error()
        return failed_error(name, decision.reason)
    if decision.kind is DecisionKind.GONE:
        return ApiError(404 if direct else 400, f"model '{name}' not found")
    if decision.kind is DecisionKind.BACKOFF:
        return backoff_error(name, decision.reason, decision.retry_after)
    if decision.kind is DecisionKind.CLOSING:
        return closing_error()
    raise AssertionError(f"not a refusal: {decision.kind}")


async def _wait_all(tasks: list[asyncio.Task[None] | None]) -> None:
    """Wait for stop tasks without cancelling them when the waiter is cancelled."""
    pending = [t for t in tasks if t is not None]
    if pending:
        await asyncio.wait([asyncio.shield(t) for t in pending])
