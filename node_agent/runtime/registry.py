"""The registry: the one owner of the agent's runtime: the scheduler, the specs and the runs.

Every decision is the pure :class:`~node_agent.core.scheduler.Scheduler`'s. This module turns
what happens into scheduler events (a request arrives or leaves, a lease is given back, a
child is spawned, ready or gone, a timer fires), hands each to ``Scheduler.handle`` once, in
arrival order, through one inbox (:meth:`Registry._submit`), and carries out the effects it
returns: it answers waiting requests, makes a :class:`~node_agent.runtime.model_run.ModelRun`
for a load, logs a drain and stops a child when its drain is over. Nothing else touches the
scheduler, so nothing needs a lock, and a change wakes exactly the waiters it concerns.

The ledger's devices are read here at a bounded rate, only while a load waits for room.
"""

from __future__ import annotations

import asyncio
import collections
import functools
import itertools
import logging
import math
import os
import time
from collections.abc import AsyncGenerator, Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from node_agent.aio import Changed, TaskSet
from node_agent.child.probe import probe_child
from node_agent.core.model_state import ModelState, Transition
from node_agent.core.scheduler import Scheduler
from node_agent.core.scheduler_events import (
    Catalog as CatalogEvent,
)
from node_agent.core.scheduler_events import (
    ChildFault,
    Close,
    Drain,
    Effect,
    Event,
    Exited,
    Grant,
    Keep,
    KeepAliveValue,
    Lease,
    Leave,
    ModelConfig,
    Probe,
    Probed,
    Queued,
    Ready,
    Refusal,
    Refuse,
    Release,
    Removed,
    Request,
    Sleeping,
    Spawn,
    Spawned,
    SpawnFailed,
    Started,
    Stop,
    Tick,
    Unload,
    Woke,
)
from node_agent.core.victims import RESIDENCY_FACTOR
from node_agent.core.warm_book import NOBODY
from node_agent.errors import ApiError
from node_agent.runtime.event_hub import Event as HubEvent
from node_agent.runtime.event_hub import EventHub
from node_agent.runtime.model_downloads import Downloads, DownloadSettings
from node_agent.runtime.model_run import SHUTTING_DOWN, Child, ChildFactory, ModelRun, RunEvent
from node_agent.runtime.refusals import (
    backoff_error,
    closing_error,
    failed_error,
    queue_full_error,
    queue_timeout_error,
)
from node_agent.runtime.warm_swaps import WarmSwaps
from node_agent.sources.catalog import Catalog
from node_agent.sources.download import DownloadPlan, needs_download
from node_agent.sources.spec import ModelSpec

if TYPE_CHECKING:
    from node_agent.runtime.memory_watch import MemoryWatch

log = logging.getLogger("corral.registry")

# llama.cpp's router honours this to make its races reproducible; so do we (SPEC).
FAKE_TIMING_ENV = "LLAMA_SERVER_DEBUG_FAKE_TIMING"
DEFAULT_SHUTDOWN_TIMEOUT = 30.0  # seconds: the agent's --shutdown-timeout
# At shutdown, requests in flight may run until this long before the bound, so that the
# children they cut still exit and the agent ends within it.
SHUTDOWN_EXIT_SECONDS = 2.0
# While a load waits for memory, the devices are read this often (memory freed by another
# process shows up this late at most); never more often, however many events come.
ROOM_READ_SECONDS = 0.25
# The stops after which a model's prompt caches are saved (warm swaps).
WARM_REASONS = frozenset({"manual", "ttl", "count", "memory"})
# A child that answers this many requests in a row with a 5xx of its own is restarted as
# wedged (the agent's --max-child-errors; 0: never).
DEFAULT_CHILD_ERRORS = 5
# The bound of each step of a suspect child's probe (the agent's --timeout: the patience a
# request gets before its child is suspected of stalling).
DEFAULT_PROBE_TIMEOUT = 600.0


@dataclass(frozen=True)
class RegistryStatistics:
    """A snapshot of the registry's own bookkeeping (beside the scheduler's)."""

    models: int
    runs: int  # models with a child (or a load under way)
    stopping: int  # runs draining or stopping
    tasks: int
    subscribers: int
    closing: bool


@dataclass
class _Waiter:
    """A request the scheduler has not answered yet: its future and how to word a refusal."""

    future: asyncio.Future[Lease | None]
    model: str
    direct: bool
    tenant: str | None  # whose prompts it brings (None: none, a conversation's replay)


class Registry:
    """Models by name, their runs, and the scheduler that decides between them."""

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
        child_errors: int = DEFAULT_CHILD_ERRORS,
        probe_timeout: float = DEFAULT_PROBE_TIMEOUT,
        warm: WarmSwaps | None = None,
        cpu_turn: float = 0.0,
        child_threads: int | None = None,
    ) -> None:
        self._sched = Scheduler(
            models_max,
            memory,
            residency_factor=residency_factor,
            max_queue=max_queue,
            child_errors=child_errors,
            turn=cpu_turn,
        )
        self.memory = memory
        # The threads every child runs unless its own options say (None: a thread per core).
        self.child_threads = child_threads
        self.probe_timeout = probe_timeout  # each step of a suspect child's probe
        self.ttl = ttl  # seconds idle before unload, for models without their own ``ttl``
        self.queue_timeout = queue_timeout
        self.max_queue = max_queue
        # Closes the proxy's idle connections to a child before it is asked to exit.
        self._release_port = release_port
        self._specs: dict[str, ModelSpec] = {}
        self._aliases: dict[str, str] = {}
        self._runs: dict[str, ModelRun] = {}
        self._run_tasks: dict[str, asyncio.Task[None]] = {}
        self._stop_reasons: dict[str, str] = {}  # why a stopping model stops
        # Free memory per device just before a stop, and what the model held: after the exit
        # the run's end waits until that memory shows free again (GPUs report it late).
        self._freed_checks: dict[str, tuple[dict[str, int], dict[str, int]]] = {}
        self._factory = child_factory
        # Warm swaps: the prompt caches saved at a stop and restored at the next load, by the
        # identity each model's child last started with.
        self.warm = warm
        self._warm_keys: dict[str, str] = {}
        # Which version of its preset each running child serves (``ModelSpec.preset_hash``):
        # a reload that restarts a child leaves the old hash until the old child is gone.
        self._served_hash: dict[str, str | None] = {}
        self._clock = clock
        self._tasks = TaskSet("registry")
        self._hub = EventHub()
        # Downloads hold no slot and no memory: the scheduler never sees them.
        self.downloads = Downloads(self._hub, downloads or DownloadSettings())
        self.shutdown_timeout = shutdown_timeout
        self.fake_timing = (
            bool(os.environ.get(FAKE_TIMING_ENV)) if fake_timing is None else fake_timing
        )
        self._waiters: dict[int, _Waiter] = {}
        self._ids = itertools.count(1)
        self._inbox: collections.deque[Event] = collections.deque()
        # Once per handled batch of events: who shows the runtime's state elsewhere (the
        # peers' subscriptions, api/peer_view.py) looks again then, not on a timer.
        self.changed = Changed()
        self.version = 0
        self._handling = False
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at: float | None = None
        self._room_read_at = -math.inf
        self._set_specs(catalog.models, catalog.aliases)
        # The catalog's models (``_specs`` also keeps those that left it until they stopped).
        self._listed_names = frozenset(catalog.models)
        self._submit(CatalogEvent(self._configs()))

    # -- catalog -----------------------------------------------------------------------------

    def _set_specs(self, specs: Mapping[str, ModelSpec], aliases: Mapping[str, str]) -> None:
        self._specs = dict(specs)
        self._plans: dict[str, DownloadPlan | None] = {}
        self._aliases = dict(aliases)  # the catalog's, already checked for collisions

    def _configs(self) -> dict[str, ModelConfig]:
        return {name: self._config(spec) for name, spec in self._specs.items()}

    def _config(self, spec: ModelSpec) -> ModelConfig:
        ttl = self.ttl
        if spec.ttl is not None:
            ttl = spec.ttl if spec.ttl > 0 else None  # ttl = 0 in a preset: never
        return ModelConfig(
            pin=spec.pin,
            priority=spec.priority,
            slots=spec.slots,
            ttl=ttl,
            stop_timeout=spec.stop_timeout,
            turns=self._sched.turn > 0 and spec.takes_turns(self.child_threads),
        )

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

    def listed(self) -> dict[str, ModelSpec]:
        """The models ``GET /models`` lists: all but the cache entries a preset's
        ``dedup-cache-models`` hides (still usable by name)."""
        return {name: spec for name, spec in self._specs.items() if not spec.hidden}

    @property
    def scheduler(self) -> Scheduler:
        """Read access for snapshots (``/models``, metrics, tests); never mutate it."""
        return self._sched

    def now(self) -> float:
        """The registry's clock (monotonic seconds), for views of scheduler times."""
        return self._clock()

    def stamp(self) -> tuple[int, int]:
        """Changes whenever what a view of the runtime shows may have: the batches of events
        the scheduler handled, and the events published (downloads' among them)."""
        return self.version, self._hub.statistics().published

    def warm_owns(self, name: str) -> bool:
        """Whether ``name``'s slot files are the agent's (warm swaps apply to it)."""
        return self.warm is not None and self.warm.applies(self._specs[name])

    def warm_figures(self) -> dict[str, int] | None:
        """Warm swaps' counts and the folder's bytes, for ``/metrics`` (None: off)."""
        if self.warm is None:
            return None
        stats = self.warm.statistics
        folder = sum(s.size for s in self.warm.saved())
        return {
            "saved": stats.saved,
            "restored": stats.restored,
            "missed": stats.missed,
            "dropped": stats.dropped,
            "bytes": folder,
        }

    def warm_held(self, name: str) -> tuple[int, int] | None:
        """(files, bytes) of ``name``'s saved prompt caches; None when warm swaps do not
        apply to it or it never ran."""
        key = self._warm_keys.get(name)
        if self.warm is None or key is None:
            return None
        return self.warm.held(key)

    def child(self, name: str) -> Child | None:
        run = self._runs.get(name)
        return run.child if run is not None else None

    def preset_hash(self, name: str) -> str | None:
        """The preset version ``name`` serves: its running child's, else its next load's."""
        if name in self._served_hash:
            return self._served_hash[name]
        return self._specs[name].preset_hash

    async def reload(self, catalog: Catalog, changed: set[str]) -> None:
        """Apply a re-read catalog: stop models that vanished or whose arguments changed;
        returns once they have stopped.

        The others are updated in place. Requests for a changed model that arrive meanwhile
        wait in the queue and load it again with its new arguments.
        """
        specs = catalog.models
        # (One that left and comes back before its child ended is new: loaded if it says so.)
        before = {n: s for n, s in self._specs.items() if n in self._listed_names}
        self._listed_names = frozenset(specs)
        gone = [name for name in self._specs if name not in specs]
        # Gone models stay known until their children have stopped (draining).
        self._set_specs({**{n: self._specs[n] for n in gone}, **specs}, catalog.aliases)
        for name in self._served_hash.keys() & specs.keys() - changed:
            # Updated in place (a TTL, a pin): the running child serves the new version, unless
            # it is on its way out (a child stopped by an earlier reload still runs the old, as
            # does one spawned for a load granted before it changed or left and came back).
            if not self._sched.outgoing(name):
                self._served_hash[name] = specs[name].preset_hash
        configs = {name: self._config(spec) for name, spec in specs.items()}
        self._submit(CatalogEvent(configs, frozenset(n for n in changed if n in configs)))
        await _wait_all([self._run_tasks.get(name) for name in (*gone, *changed)])
        self._publish("*", "models_reload", None)
        if not self._sched.closing:
            # Presets added (or switched to load-on-startup) at runtime load now, as at start,
            # and so do those just stopped for new arguments.
            for name, spec in specs.items():
                was = before.get(name)
                # (Unless its waiters' load is on its way already: a start-up load that waited
                # through the restart, or a request.)
                view = self._sched.view(name)
                again = name in changed and view.state is ModelState.UNLOADED and not view.claimed
                if spec.load_on_startup and (was is None or not was.load_on_startup or again):
                    self._load_on_startup(name)

    # -- requests ----------------------------------------------------------------------------

    async def acquire(
        self,
        name: str,
        *,
        autoload: bool,
        inference: bool = True,
        slot: bool = True,
        keep_alive: KeepAliveValue = Keep.DEFAULT,
        tenant: str = NOBODY,
    ) -> Lease:
        """Wait until ``name`` can take a request and lease it; load it when allowed.

        ``slot``: the request takes one of the child's slots (it waits for a free one, in the
        same queue). Cancelling (the client went away) leaves the queue; a load it started
        goes on. ``--queue-timeout`` bounds the whole wait, from arrival (a download, a load's
        turn, a slot), and ``--max-queue`` the waiters per model: beyond either, 503 with
        Retry-After; so does every request once the agent is closing. ``keep_alive``: the
        request's (Ollama's), how long the model stays once idle after it (parse_keep_alive).
        ``tenant``: whose prompts it brings (``api.tenants``; warm swaps keep them apart).
        """
        self._refuse_if_closing()
        deadline = None if self.queue_timeout is None else self._clock() + self.queue_timeout
        if name not in self._specs:  # only a download so far (POST /models): wait for it
            await self.downloads.wait(
                name,
                queue_timeout=self.queue_timeout,
                left=self._left(deadline),
                max_queue=self.max_queue,
            )
            if self.resolve(name) != name:
                raise failed_error(name, self.downloads.failed(name) or "")
        plan = self._download_plan(name)
        if plan is not None:
            await self.downloads.fetch_preset(
                name,
                plan,
                queue_timeout=self.queue_timeout,
                left=self._left(deadline),
                max_queue=self.max_queue,
            )
        if self.memory is not None and self._sched.view(name).state is ModelState.UNLOADED:
            await self._prepare(name)
        waiter = next(self._ids)
        request = Request(
            waiter, name, inference, slot, autoload, deadline=deadline, keep_alive=keep_alive
        )
        brings = tenant if inference or slot else None
        lease = await self._wait(request, brings)
        assert lease is not None
        if self.warm is not None and brings is not None:
            self.warm.served(name, brings)
        return lease

    def _left(self, deadline: float | None) -> float | None:
        return None if deadline is None else max(0.0, deadline - self._clock())

    async def _wait(self, request: Request, tenant: str | None) -> Lease | None:
        """Hand ``request`` to the scheduler and wait for its answer (a lease; None for a
        direct load, once its child exists)."""
        future: asyncio.Future[Lease | None] = asyncio.get_running_loop().create_future()
        self._waiters[request.waiter] = _Waiter(future, request.model, request.direct, tenant)
        try:
            self._submit(request)
            return await future
        except BaseException:
            if future.done() and not future.cancelled() and future.exception() is None:
                granted = future.result()  # granted as the client went away: given back
                if granted is not None:
                    self.release(granted)
            raise
        finally:
            del self._waiters[request.waiter]
            if not future.done() or future.cancelled():
                self._submit(Leave(request.waiter))

    async def load(self, name: str, *, tenant: str | None = None) -> None:
        """``POST /models/load``: start loading ``name``; returns once its child is spawned
        (``loading``), like llama.cpp, or raises when it could not be. A preset whose file
        must be downloaded first returns once the download is on its way (``downloading``):
        llama.cpp answers at once too (its child downloads), and the load goes on.
        ``tenant``: the client's (``acquire``); None: the agent's own (load-on-startup)."""
        self._refuse_if_closing()
        if tenant is None:
            tenant = self.warm.own_tenant if self.warm is not None else NOBODY
        if name not in self._specs:  # a download on its way (llama.cpp: success, no load)
            return
        if self.downloads.active(name) and not self._sched.view(name).stopping:
            raise ApiError(400, "model is already running")  # llama.cpp's child is loading
        plan = self._download_plan(name)
        if plan is not None and not await self.downloads.start_preset(name, plan):
            self._tasks.spawn(
                self._quietly(
                    f"load of model={name}", self._load(name, tenant, after_download=True)
                ),
                f"load:{name}",
            )
            return
        await self._load(name, tenant)

    async def _load(self, name: str, tenant: str, *, after_download: bool = False) -> None:
        """Load ``name`` (its download first, if any); returns once its child is spawned.
        The download is waited for without the queue bounds: the client was told success, and
        ``--load-timeout`` and the downloader's own limits bound it; a failed download leaves
        the model failed (``GET /models``, ``download_failed``)."""
        plan = self._download_plan(name)
        if plan is not None:
            await self.downloads.fetch_preset(
                name, plan, queue_timeout=None, left=None, max_queue=None
            )
        if after_download and self._sched.view(name).usable:
            return  # a request loaded it while it downloaded
        await self._prepare(name)
        await self._wait(Request(next(self._ids), name, direct=True), tenant)

    def _refuse_if_closing(self) -> None:
        if self._sched.closing:
            raise closing_error()

    def release(self, lease: Lease, fault: ChildFault | None = None) -> None:
        """A leased request ended; ``fault``: how its child failed it, if it did (a child
        that stalls or keeps failing is restarted: ``Scheduler._judge``)."""
        self._submit(Release(lease, fault))

    async def stop_and_wait(self, name: str) -> None:
        """Stop ``name`` if it runs (``DELETE /models``); return once its child has exited."""
        if self.downloads.cancel(name):
            await self.downloads.wait_cancelled(name)
        elif name in self._runs:
            self._submit(Unload(name, "remove"))
            await _wait_all([self._run_tasks.get(name)])

    def unload(self, name: str) -> None:
        """``POST /models/unload``: drain and stop ``name``, or cancel its download; returns
        once stopping began."""
        if self.downloads.cancel(name):
            return
        if not self._sched.view(name).state.running:
            raise ApiError(400, "model is not running")
        self._submit(Unload(name, "manual"))

    # -- the inbox and the effects -------------------------------------------------------------

    def _submit(self, event: Event) -> None:
        """Hand ``event`` to the scheduler and carry out its effects. Events raised while
        effects are carried out wait in the inbox and are handled next, in order."""
        self._inbox.append(event)
        if self._handling:
            return
        self._handling = True
        rearm = False
        try:
            while self._inbox:
                event = self._inbox.popleft()
                now = self._clock()
                self._read_room(event, now)
                effects = self._sched.handle(event, now)
                for effect in effects:
                    self._apply(effect, now)
                # A lease granted at once moves no deadline closer (a TTL only later): the
                # timer armed before still fires first, and the Tick re-arms it.
                rearm = rearm or not (
                    isinstance(event, Request) and all(isinstance(e, Grant) for e in effects)
                )
        finally:
            self._handling = False
            self.version += 1
            self.changed.notify()
        if rearm:
            self._arm_timer()

    def _read_room(self, event: Event, now: float) -> None:
        """Read the devices before a decision that may need room: at most every
        ``ROOM_READ_SECONDS`` however many events come, and after every exit (a victim's
        memory is free now)."""
        if self.memory is None:
            return
        if isinstance(event, Exited) or now - self._room_read_at >= ROOM_READ_SECONDS:
            self._room_read_at = now
            self.memory.refresh()

    def _arm_timer(self) -> None:
        now = self._clock()
        at = self._sched.wakeup
        if self.memory is not None and self._sched.needs_room():
            # A load waits for room: memory other processes free shows up on the next read.
            at = min(at if at is not None else math.inf, now + ROOM_READ_SECONDS)
        if at == self._timer_at:
            return
        if self._timer is not None:
            self._timer.cancel()
        self._timer, self._timer_at = None, at
        if at is not None and not math.isinf(at):
            loop = asyncio.get_running_loop()
            self._timer = loop.call_later(max(0.0, at - now), self._on_timer)

    def _on_timer(self) -> None:
        self._timer = self._timer_at = None
        self._submit(Tick())

    def _apply(self, effect: Effect, now: float) -> None:
        match effect:
            case Transition(model=name, old=old, new=new):
                log.info("model=%s: %s -> %s", name, old.value, new.value)
            case Grant(waiter=waiter, lease=lease):
                found = self._waiters.get(waiter)
                if found is None or found.future.done():
                    self._submit(Release(lease))  # its client went away as it was granted
                else:
                    found.future.set_result(lease)
            case Started(waiter=waiter):
                found = self._waiters.get(waiter)
                if found is not None and not found.future.done():
                    found.future.set_result(None)
            case Refuse():
                found = self._waiters.get(effect.waiter)
                if found is not None and not found.future.done():
                    found.future.set_exception(self._refusal(effect, found))
            case Queued(model=name, reason=reason, slot=slot):
                log.log(
                    logging.DEBUG if slot else logging.INFO,
                    "request for model=%s waits: %s",
                    name,
                    reason,
                )
            case Spawn(model=name):
                self._spawn(name)
            case Drain():
                self._begin_drain(effect)
            case Stop(model=name, cut=cut):
                run = self._runs.get(name)
                if run is not None:
                    self._tasks.spawn(self._stop(run, cut), f"stop:{name}")
            case Probe():
                self._tasks.spawn(self._probe(effect), f"probe:{effect.model}")
            case Removed(model=name):
                self._specs.pop(name, None)

    def _refusal(self, refuse: Refuse, waiter: _Waiter) -> ApiError:
        """The error for a waiter the scheduler turned away, worded as llama.cpp does."""
        name = waiter.model
        match refuse.kind:
            case Refusal.FAILED:
                if refuse.reason == SHUTTING_DOWN:
                    return closing_error()
                return failed_error(name, refuse.reason)
            case Refusal.GONE:
                return ApiError(404 if waiter.direct else 400, f"model '{name}' not found")
            case Refusal.BACKOFF:
                return backoff_error(name, refuse.reason, refuse.retry_after)
            case Refusal.UNLOADED:
                return ApiError(400, "model is not loaded")
            case Refusal.CLOSING:
                return closing_error()
            case Refusal.TIMEOUT:
                assert self.queue_timeout is not None
                log.info(
                    "request for model=%s gave up after %gs: %s",
                    name,
                    self.queue_timeout,
                    refuse.reason,
                )
                return queue_timeout_error(name, self.queue_timeout, refuse.reason)
            case Refusal.FULL:
                return queue_full_error(name, int(refuse.limit))
            case Refusal.RUNNING:
                return ApiError(400, "model is already running")
            case Refusal.LIMIT:
                # Only busy models could make room: a request would wait, but a direct load
                # is told to come back (llama.cpp's wording).
                return ApiError(500, "model limit reached, try again later")
        raise AssertionError(refuse.kind)

    # -- runs --------------------------------------------------------------------------------

    def _local(self, name: str) -> ModelSpec:
        """``name``'s spec, loading its downloaded file when the agent downloads it."""
        return self.downloads.local(self._specs[name], self._download_plan(name))

    def _download_plan(self, name: str) -> DownloadPlan | None:
        """The download ``name``'s preset needs before its load (None: none), worked out
        once per catalog."""
        if name not in self._plans:
            self._plans[name] = needs_download(self._specs[name])
        return self._plans[name]

    async def _prepare(self, name: str) -> None:
        if self.memory is not None:
            # Its header and estimate, off the loop and bounded (issue 26, row 6).
            await self.memory.prepare_off_loop([self._local(name)])

    def _spawn(self, name: str) -> None:
        """Start ``name``'s run (the scheduler granted its load). The model shows
        ``loading`` once the run has spawned its child."""
        spec = self._local(name)
        if self.memory is not None:
            spec = self.memory.placed(spec)  # the GPU(s) it goes to, chosen now
            # The ledger counts a granted load from the grant on (at its estimate), so that
            # no second load is granted into the same memory before this one has spawned.
            self.memory.warn_if_short(name)
            self.memory.spawned(name)
        restore = None
        if self.warm is not None and (key := self.warm.key(spec)) is not None:
            spec = self.warm.child_spec(spec)
            self._warm_keys[name] = key
            restore = functools.partial(self._restore, name, key, spec.slots, self._tenants(name))
        self._served_hash[name] = self._specs[name].preset_hash
        run = self._runs[name] = ModelRun(
            spec,
            self._factory,
            report=functools.partial(self._from_run, name),
            publish=self._publish,
            may_spawn=lambda: not self._sched.closing,
            fake_timing=self.fake_timing,
            after_start=restore,
        )
        self._run_tasks[name] = self._tasks.spawn(self._own(run), f"run:{name}")

    def _from_run(self, name: str, what: RunEvent, port: int | None) -> None:
        """A run's report: the ledger hears of it, then the scheduler."""
        memory, run = self.memory, self._runs.get(name)
        if memory is not None and what in (RunEvent.READY, RunEvent.WOKE):
            memory.ready(name, run.child.pid if run is not None else None)
        elif memory is not None and what is RunEvent.SLEEPING:
            memory.sleeping(name)
        event: Event
        match what:
            case RunEvent.SPAWNED:
                event = Spawned(name, port)
            case RunEvent.READY:
                event = Ready(name, port)
            case RunEvent.SLEEPING:
                event = Sleeping(name)
            case RunEvent.WOKE:
                event = Woke(name)
        self._submit(event)

    async def _own(self, run: ModelRun) -> None:
        """Run ``run`` to its end, then report how it ended (once its memory shows free)."""
        name = run.name
        try:
            outcome = await run.run()
        except BaseException:
            self._served_hash.pop(name, None)
            raise
        finally:
            if self._runs.get(name) is run:
                del self._runs[name]
                del self._run_tasks[name]
        if self.memory is not None:
            # Still "stopping" to the scheduler meanwhile: nobody loads into memory that does
            # not show free yet.
            check = self._freed_checks.pop(name, None)
            if check is not None and not await self.memory.wait_freed(*check):
                log.warning("model=%s: its memory did not show free in time", name)
            self.memory.unloaded(name)
        reason = self._stop_reasons.pop(name, None)
        # Its version until the scheduler hears it is gone (it shows as loaded till then).
        self._served_hash.pop(name, None)
        if outcome.withdrawn:
            self._submit(SpawnFailed(name, outcome.reason, count=False))
            return
        if not outcome.spawned:  # nothing ever ran (the binary could not be started)
            self._submit(SpawnFailed(name, outcome.reason or f"exit code {outcome.code}"))
        else:
            if reason is None:
                log.warning("model=%s exited unexpectedly with code %s", name, outcome.code)
            self._submit(Exited(name, outcome.code, outcome.reason))
        data = {
            "status": "unloaded",
            "exit_code": outcome.code,
            # Corral's extra (llama.cpp's clients see its shape unchanged): why it stopped.
            "corral": {"reason": reason or "crash"},
        }
        self._publish(name, "status_change", data)

    def _begin_drain(self, drain: Drain) -> None:
        name = drain.model
        self._stop_reasons[name] = drain.reason
        if self.memory is not None:
            self._freed_checks[name] = self.memory.exiting(name)
            if drain.reason == "memory" and drain.evicted_for is not None:
                self.memory.explain_eviction(drain.evicted_for, name)
        if drain.evicted_for is not None:
            log.info("evicting model=%s to make room (%s)", name, drain.reason)
        if drain.reason == "wedged":
            why = self._sched.wedged_why(name)
            log.warning("model=%s is wedged (%s): killing it; it loads again when asked", name, why)
            self._publish(name, "model_wedged", {"reason": why})
        log.info("stopping model=%s (%s)", name, drain.reason)

    async def _probe(self, probe: Probe) -> None:
        """Probe a suspect child (``child.probe``) and tell the scheduler what it showed."""
        log.info("model=%s: probing its child (%s)", probe.model, probe.suspicion)
        broken: str | None = None
        try:
            broken = await probe_child(probe.port, self.probe_timeout)
        except Exception:  # the task's boundary: a probe that broke judges nothing
            log.exception("model=%s: the probe of its child failed", probe.model)
            self._submit(Probed(probe.model, probe.port, None))
            return
        if broken is None:
            log.info(
                "model=%s: its child answered the probe: not wedged (%s: the requests' own)",
                probe.model,
                probe.suspicion,
            )
        self._submit(Probed(probe.model, probe.port, broken))

    def _tenants(self, name: str) -> frozenset[str]:
        """Whose prompts the requests waiting for ``name`` bring."""
        waiting = self._waiters.values()
        return frozenset(w.tenant for w in waiting if w.model == name and w.tenant is not None)

    async def _restore(
        self, name: str, key: str, slots: int, loaded_for: frozenset[str], child: Child
    ) -> None:
        """Restore ``name``'s saved caches into its new child, for the requests it was
        loaded for and those that came since (``WarmSwaps.restore`` says whose go in)."""
        assert self.warm is not None
        if child.port is None:
            return
        waiting = loaded_for | self._tenants(name)
        restored = await self.warm.restore(name, child.port, key, slots, waiting)
        if restored:
            log.info("model=%s: %d saved prompt caches restored (warm swap)", name, restored)

    async def _save(self, run: ModelRun) -> None:
        """Before a stop by choice (an unload, a TTL, an eviction), the child's prompt caches
        go to the warm folder: never after a crash, a wedge, a cut drain, or for a model
        whose arguments changed or that leaves (its cache would never be asked for)."""
        key = self._warm_keys.get(run.name)
        reason = self._stop_reasons.get(run.name)
        port = run.child.port
        if self.warm is None or key is None or port is None or reason not in WARM_REASONS:
            return
        written = await self.warm.save(run.name, port, key, run.spec.slots)
        if written:
            log.info("model=%s: %d bytes of prompt caches saved (warm swap)", run.name, written)

    async def _stop(self, run: ModelRun, cut: bool) -> None:
        if not cut:
            await self._save(run)
        port = run.child.port
        if self._release_port is not None and port is not None:
            # A child with an idle keep-alive connection open exits 10 ms slower.
            await self._release_port(port)
        await run.stop(cut=cut)

    # -- events ------------------------------------------------------------------------------

    def _publish(self, model: str, event: str, data: dict[str, Any] | None) -> None:
        self._hub.publish(HubEvent(model, event, data))

    publish = _publish  # for the routes that report their own events (DELETE /models)

    def events(self) -> AsyncGenerator[HubEvent, None]:
        """Every event from now on, for one ``/models/sse`` client (or metrics, the page)."""
        return self._hub.subscribe()

    # -- lifecycle ---------------------------------------------------------------------------

    def start(self) -> None:
        """Load the models marked ``load-on-startup`` (in the background, like llama.cpp), and
        resume the downloads the last run left unfinished."""
        for name, spec in self._specs.items():
            if spec.load_on_startup:
                self._load_on_startup(name)
        self.downloads.resume_recorded(lambda name: self.resolve(name) is not None)

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
        self._submit(Close(self._clock() + drain))

    async def close(self) -> None:
        """Close (see :meth:`begin_close`), wait for every child to stop, then end the tasks."""
        self.begin_close()
        await _wait_all(list(self._run_tasks.values()))
        if self._timer is not None:
            self._timer.cancel()
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
            stopping=self._sched.statistics().stopping,
            tasks=len(self._tasks),
            subscribers=self._hub.statistics().subscribers,
            closing=self._sched.closing,
        )


async def _wait_all(tasks: list[asyncio.Task[None] | None]) -> None:
    """Wait for run tasks without cancelling them when the waiter is cancelled."""
    pending = [t for t in tasks if t is not None]
    if pending:
        await asyncio.wait([asyncio.shield(t) for t in pending])
