"""The memory ledger at work: estimates, device readings and child transitions fed to it.

A thin layer over the pure :class:`~node_agent.core.ledger.MemoryLedger`. The scheduler asks
it (as its ``RoomCheck``, questions that change nothing) whether the head of the queue fits
and which idle model to evict; for a model that pins no GPU it first chooses the GPU(s)
(``core.placement``, the child's side in ``memory.placing``) and asks the ledger about that
placement only, so that only models on the chosen GPU are evicted;
the registry tells it when children spawn, become ready, sleep and exit; and it waits, after
a victim's exit, until the victim's memory really shows free again (GPU drivers report freed
memory late; the host frees at exit).
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import logging
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

from node_agent.core.ledger import MemoryLedger, freed_memory_visible
from node_agent.core.placement import Gpu, Holder, Placement, choose
from node_agent.errors import CorralError
from node_agent.memory.devices import HOST, CompositeProbe
from node_agent.memory.estimate_job import EstimateJob, EstimateResult, run_estimate
from node_agent.memory.placing import (
    PlacementInput,
    child_environment,
    placeable,
    tensor_split,
)
from node_agent.memory.shape_cache import (
    HEADER_TIME_LIMIT,
    FileKey,
    Kind,
    ShapeCache,
    Unreadable,
    file_key,
    read_file,
)
from node_agent.sources.preset_env import pins_device
from node_agent.sources.spec import ModelSpec, OptionValue, merge_options

if TYPE_CHECKING:  # gguf, hence numpy: imported on first use (start-up time)
    from node_agent.memory.shape import ModelShape, VisionShape

log = logging.getLogger("corral.ledger")

MIB = 1 << 20
# How long a victim's memory may take to show free after its exit (Ollama waits up to a few
# seconds for the same reason: drivers release VRAM after the process is gone).
FREED_WAIT_SECONDS = 5.0
FREED_POLL_SECONDS = 0.05
# How long a load waits for its header and estimate: the read's own bound, and a margin.
HEADER_WAIT_SECONDS = HEADER_TIME_LIMIT + 1.0
# Headers and estimates run on one thread of their own, not asyncio's default pool: the work
# is pure Python, holding the GIL a switch interval at a time (agent.SWITCH_INTERVAL), and
# every busy thread is one more the loop queues behind (/health took 125 ms with the default
# pool's six threads estimating ten crafted models, under 30 ms with one, both at CPython's
# 5 ms interval). Each job is bounded, so one thread keeps up.
_WORKER = ThreadPoolExecutor(max_workers=1, thread_name_prefix="corral-estimates")


def _estimator_options(spec: ModelSpec) -> dict[str, str | None]:
    """The estimator's view of a spec's options: a flag on is ``name: None``, a flag off its
    negative form ``no-name: None`` (``--no-repack``, ``--no-kv-offload`` turn off what is on
    by default: leaving them out would estimate the default)."""
    options: dict[str, str | None] = {}
    for key, value in spec.options:
        if value is True:
            options[key] = None
        elif value is False:
            options[f"no-{key}"] = None
        else:
            options[key] = value
    return options


def _vision_path(spec: ModelSpec) -> str | None:
    """The projector (``--mmproj``) the estimate reads, as the estimator finds it in the
    options (canonical names here), without importing it: ``GET /models`` asks before the
    headers are read, and the estimator pulls in numpy (that import runs in the reader's
    thread instead)."""
    value = spec.get("mmproj")
    return value if isinstance(value, str) and value else None


def _version(spec: ModelSpec, files: Sequence[FileKey]) -> tuple[object, ...] | None:
    """What ``spec``'s estimate is for, given its ``files`` (``MemoryWatch._files``): their
    versions (the model's and its projector's: a replaced projector left the model counted at
    the old one's size) and its options. None: no model file on disk yet, so no estimate and
    no memory check, as in llama.cpp."""
    if not files or files[0].kind != "model":
        return None
    return (*files, spec.options)


class MemoryWatch:
    """Owns the ledger and the device probes for one agent."""

    def __init__(
        self,
        *,
        margin_mib: int,
        limits: Mapping[str, int],
        probe: CompositeProbe,
        clock: Callable[[], float] = time.monotonic,
        shapes: ShapeCache | None = None,
    ) -> None:
        self.ledger = MemoryLedger(margin_mib * MIB, limits)
        self.probe = probe
        self._clock = clock
        self._devices = [r.name for r in probe.read()]
        for device in limits:
            if device not in self._devices:
                self._devices.append(device)
        self._estimated: dict[str, tuple[object, ...]] = {}
        # What each child will take by its own --fit (see prepare): held at least this.
        self._taken: dict[str, dict[str, int]] = {}
        # Automatic placement: each placeable model's figures, its latest plan, and the
        # placement its running child was started on (fixed until it exits).
        self._inputs: dict[str, PlacementInput] = {}
        self._plans: dict[str, Placement] = {}
        self._placed: dict[str, Placement] = {}
        # GGUF shapes by file version, and the reads on their way (issue 26, row 6); why a
        # model has no estimate, for GET /models.
        self._shapes = shapes if shapes is not None else ShapeCache()
        self._reading: dict[FileKey, asyncio.Future[Any]] = {}
        self._unestimated: dict[str, str] = {}
        # Estimates on their way, by model: the key they are for and their worker's future.
        self._estimating: dict[str, tuple[tuple[object, ...], asyncio.Future[Any]]] = {}

    @property
    def devices(self) -> list[str]:
        return list(self._devices)

    @property
    def gpus(self) -> list[str]:
        return [d for d in self._devices if d != HOST]

    # -- estimates -------------------------------------------------------------------------

    async def prepare_off_loop(
        self, specs: Iterable[ModelSpec], *, wait: float = HEADER_WAIT_SECONDS
    ) -> None:
        """:meth:`prepare` for the agent: the GGUF headers ``specs`` need (one read per file
        version, however many ask) and then their estimates run in worker threads, waited for
        at most ``wait`` seconds in all. What outlasts the wait goes on and lands when done;
        each part is bounded (the header walk by ``HEADER_TIME_LIMIT``, the arithmetic by
        llama.cpp's 512 layers), so no thread runs unbounded either (issue 26, row 6)."""
        # Only what is not estimated for its file versions and options yet: a header is read
        # for an estimate, and a catalog larger than the shape cache (1,000 models) read every
        # header again on every GET /models, waiting the whole bound for them.
        pending = []
        for spec in specs:
            files = self._files(spec)
            version = _version(spec, files)
            if version != self._estimated.get(spec.name):
                pending.append((spec, files, version))
        # Room for every file asked for at once (a model and its projector): fewer, and a read
        # evicted a shape whose estimate had not been made, so that model never was.
        self._shapes.hold_at_least(2 * len(pending))
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait
        reads: list[asyncio.Future[Any]] = []
        for _, files, _ in pending:
            for key in files:
                if self._shapes.get(key) is not None:
                    continue
                future = self._reading.get(key)
                if future is None:
                    future = loop.run_in_executor(_WORKER, read_file, key)
                    future.add_done_callback(functools.partial(self._read_done, key))
                    self._reading[key] = future
                reads.append(future)
        if reads:
            await asyncio.wait(reads, timeout=max(0.0, deadline - loop.time()))
        estimates: list[asyncio.Future[Any]] = []
        for spec, _, version in pending:
            running = self._estimating.get(spec.name)
            if running is not None and running[0] == version:
                estimates.append(running[1])  # on its way already
                continue
            job = self._job(spec, version, read=False)
            if job is not None:
                future = loop.run_in_executor(_WORKER, run_estimate, job)
                future.add_done_callback(functools.partial(self._estimate_done, job))
                self._estimating[spec.name] = (job.key, future)
                estimates.append(future)
        if estimates:
            await asyncio.wait(estimates, timeout=max(0.0, deadline - loop.time()))

    def _read_done(self, key: FileKey, future: asyncio.Future[Any]) -> None:
        self._reading.pop(key, None)
        if future.cancelled():
            return
        error = future.exception()
        self._shapes.put(key, Unreadable(str(error)) if error is not None else future.result())

    def _estimate_done(self, job: EstimateJob, future: asyncio.Future[Any]) -> None:
        running = self._estimating.get(job.model)
        if running is None or running[1] is not future:
            return  # a newer job for the model (its file or options changed) took over
        del self._estimating[job.model]
        if future.cancelled():
            return
        error = future.exception()
        self._apply(job, EstimateResult(error=str(error)) if error is not None else future.result())

    def _files(self, spec: ModelSpec) -> list[FileKey]:
        """The file versions ``spec``'s estimate reads (missing files: none, as in prepare)."""
        wanted: list[tuple[str | None, Kind]] = [
            (spec.model_path, "model"),
            (_vision_path(spec), "vision"),
        ]
        keys = []
        for path, kind in wanted:
            if path is not None:
                try:
                    keys.append(file_key(path, kind))
                except OSError:
                    continue
        return keys

    def _shape(self, path: str, kind: Kind, read: bool) -> ModelShape | VisionShape | None:
        """``path``'s shape: cached, else read here when ``read`` (None when not read yet);
        GgufError when its header is unreadable."""
        from node_agent.memory.gguf_header import GgufError

        try:
            key = file_key(path, kind)
        except OSError as exc:
            raise GgufError(f"{path}: cannot read GGUF header: {exc}") from exc
        found = self._shapes.get(key)
        if found is None and read:
            found = read_file(key)
            self._shapes.put(key, found)
        if isinstance(found, Unreadable):
            raise GgufError(found.reason)
        return found

    def prepare(self, spec: ModelSpec) -> None:
        """Estimate ``spec``'s min and max (once per file version and options), here and now:
        reading its header where the cache lacks it. The agent uses :meth:`prepare_off_loop`."""
        job = self._job(spec, _version(spec, self._files(spec)), read=True)
        if job is not None:
            self._apply(job, run_estimate(job))

    def _job(
        self, spec: ModelSpec, key: tuple[object, ...] | None, *, read: bool
    ) -> EstimateJob | None:
        """What ``spec``'s estimate needs now; None when there is nothing to do (estimated
        for ``key`` already, no file on disk, a header not read yet, or one that is
        unreadable: that model's reason is kept for ``GET /models``)."""
        path = spec.model_path
        if key is None or path is None or self._estimated.get(spec.name) == key:
            return None
        # Imported on first use: gguf pulls in numpy (~90 ms), which an agent without the
        # ledger, and every agent's start-up, can do without (the header reader's thread has
        # imported it by the time the agent gets here).
        from node_agent.memory.shape import ModelShape, VisionShape

        try:
            shape = self._shape(path, "model", read)
            vision = None
            if mmproj := _vision_path(spec):
                vision = self._shape(mmproj, "vision", read)
        except (CorralError, OSError, ValueError) as exc:
            self._unestimable(spec.name, str(exc))
            return None
        if not isinstance(shape, ModelShape) or (mmproj and not isinstance(vision, VisionShape)):
            return None  # its header is on its way: estimated on a later look
        options = _estimator_options(spec)
        ngl = options.get("n-gpu-layers")
        placed = placeable(options, self.gpus, ngl) and not pins_device(spec.env)
        return EstimateJob(
            model=spec.name,
            key=key,
            shape=shape,
            vision=vision if isinstance(vision, VisionShape) else None,
            options=options,
            devices=tuple(self._devices),
            budget={d: a for d in self._devices if (a := self.ledger.available(d)) is not None},
            seen={r.name: r.total if r.name == "host" else r.free for r in self.probe.read()},
            gpus=tuple(self.gpus) if placed else None,
        )

    def _unestimable(self, model: str, reason: str) -> None:
        # One bad file is one model without an estimate, with its reason in GET /models;
        # never an error for the whole list (issue 26, row 8). Logged once per reason.
        if self._unestimated.get(model) != reason:
            log.warning("model=%s: cannot estimate its memory (%s); not checked", model, reason)
        self._unestimated[model] = reason

    def _apply(self, job: EstimateJob, result: EstimateResult) -> None:
        """Have the ledger count a finished estimate."""
        name = job.model
        self._estimated[name] = job.key  # tried once per file version and options, either way
        if result.error is not None or result.figures is None:
            self._unestimable(name, result.error or "no figures")
            return
        self._unestimated.pop(name, None)
        if result.placement is not None:
            self._inputs[name] = result.placement
            if name not in self._placed:
                self._plan(name, ())
            return
        if result.placement_error is not None:
            log.warning(
                "model=%s: cannot estimate it per GPU (%s); not placed",
                name,
                result.placement_error,
            )
        self._inputs.pop(name, None)
        figures = result.figures
        self.ledger.set_estimate(name, figures.min.per_device(), figures.max.per_device())
        # The child's own --fit sizes its context to the device as llama.cpp sees it (on the
        # CPU: all of its RAM, free or not), not to --memory-limit: without a pinned -c it
        # takes the trained context wherever that fits. Its pages fill lazily (a compute
        # buffer is touched by the first full batch), so held is at least this estimate, not
        # the smaller smaps reading at ready.
        fit = result.fit or figures
        self._taken[name] = fit.max.per_device()

    def unestimated(self, model: str) -> str | None:
        """Why ``model`` has no estimate (its header or options cannot be read), if so."""
        return self._unestimated.get(model)

    # -- placement ---------------------------------------------------------------------------

    def _choose(self, model: str, candidates: Sequence[str]) -> Placement:
        """Where ``model`` would go now, were ``candidates`` evictable (changes nothing)."""
        inputs = self._inputs[model]
        margin = self.ledger.margin
        gpus = []
        for name in inputs.single:
            avail = self.ledger.available(name, without=model)
            gpus.append(Gpu(name, None if avail is None else avail - margin))
        holders = [Holder(c, self.ledger.held(c)) for c in candidates if c != model]
        return choose(gpus, inputs.single, inputs.split_need(), holders)

    def _plan(self, model: str, candidates: Sequence[str]) -> Placement:
        """Choose ``model``'s placement now and have the ledger count it there."""
        plan = self._plans[model] = self._choose(model, candidates)
        # The agent pins the context it estimated at (memory.placing): max is min.
        self.ledger.set_estimate(model, plan.need, plan.need)
        return plan

    def _preview(self, model: str, candidates: Sequence[str]) -> Placement | None:
        """A plan for a model the agent places and that is not running yet (else None)."""
        if model not in self._inputs or model in self._placed:
            return None
        return self._choose(model, candidates)

    def placed(self, spec: ModelSpec) -> ModelSpec:
        """``spec`` as its child must start: on the placement chosen now (the load was
        granted), with its context pinned. Unchanged for a model the ledger does not place."""
        name = spec.name
        if name not in self._inputs:
            return spec
        plan = self._plan(name, ())  # granted: it fits now (or loads anyway, alone)
        self._placed[name] = plan
        self._taken[name] = dict(plan.need)
        log.info("model=%s placed on %s: %s", name, ",".join(plan.gpus), plan.reason)
        extra: list[tuple[str, OptionValue]] = []
        if spec.get("ctx-size") is None:
            extra.append(("ctx-size", str(self._inputs[name].context)))
        split = tensor_split(plan)
        if split is not None:
            extra.append(("tensor-split", split))
        env = {**dict(spec.env), **child_environment(plan)}
        return dataclasses.replace(
            spec, options=merge_options(spec.options, extra), env=tuple(env.items())
        )

    def placement(self, model: str) -> dict[str, Any] | None:
        """Where the model runs (or would go now), for ``GET /models``."""
        plan = self._placed.get(model) or self._plans.get(model)
        if plan is None:
            return None
        return {
            **plan.as_dict(),
            "running": model in self._placed,
            "env": child_environment(plan),
            "context": self._inputs[model].context if model in self._inputs else None,
        }

    def refresh(self) -> None:
        """Read the devices and recalibrate external use."""
        self.ledger.calibrate(self.probe.read())

    # -- the scheduler's RoomCheck -----------------------------------------------------------

    def shortfall(self, model: str, candidates: Sequence[str]) -> bool:
        """Whether ``model`` does not fit now (with ``candidates`` evictable)."""
        plan = self._preview(model, candidates)
        if plan is not None and plan.kind == "evict":
            return True  # it fits on its GPU only once the victims there are gone
        return bool(self.ledger.deficit(model, need=plan.need if plan is not None else None))

    def pick_victim(self, model: str, candidates: Sequence[str]) -> str | None:
        """The victim to stop for ``model`` (the first of ``candidates`` that helps)."""
        plan = self._preview(model, candidates)
        if plan is not None and plan.kind == "evict":
            return plan.victims[0]
        need = plan.need if plan is not None else None
        return self.ledger.pick_victim(model, candidates, need=need)

    def explain_eviction(self, model: str, victim: str) -> None:
        """Log why ``victim`` goes to make room for ``model`` (once: the scheduler decided)."""
        plan = self._preview(model, [victim])
        if plan is not None and plan.kind == "evict" and victim in plan.victims:
            self._plans[model] = plan  # where it goes, for GET /models
            log.info("model=%s: evicting %s on %s: %s", model, victim, plan.gpus[0], plan.reason)
            return
        short = self.ledger.deficit(model)
        lacking = ", ".join(f"{d}: {b / MIB:.0f} MiB" for d, b in sorted(short.items()))
        held = ", ".join(sorted(self.ledger.held(victim)))
        log.info("model=%s: evicting %s (it holds %s; short by %s)", model, victim, held, lacking)

    def warn_if_short(self, model: str) -> None:
        """Called as a load starts: a load that does not fit went ahead (nothing to evict)."""
        short = self.ledger.deficit(model)
        if short:
            lacking = ", ".join(f"{d}: {b / MIB:.0f} MiB" for d, b in sorted(short.items()))
            log.warning(
                "model=%s is projected to be short by %s with nothing else to unload; "
                "loading anyway",
                model,
                lacking,
            )

    # -- transitions -------------------------------------------------------------------------

    def spawned(self, model: str) -> None:
        self.ledger.on_spawned(model)

    def ready(self, model: str, pid: int | None) -> None:
        measured = self.probe.process_usage([pid]) if pid is not None else {}
        taken = self._taken.get(model, {})
        effective = {d: max(measured.get(d, 0), taken.get(d, 0)) for d in {*measured, *taken}}
        self.ledger.on_ready(model, effective or None)

    def sleeping(self, model: str) -> None:
        self.ledger.on_sleeping(model)

    def exiting(self, model: str) -> tuple[dict[str, int], dict[str, int]]:
        """Before a child's exit is reported: (free per device now, what it held)."""
        baseline = {r.name: r.free for r in self.probe.read()}
        return baseline, dict(self.ledger.held(model))

    async def wait_freed(self, baseline: Mapping[str, int], held: Mapping[str, int]) -> bool:
        """Wait (bounded) until memory the model held shows free; False if it never did."""
        deadline = self._clock() + FREED_WAIT_SECONDS
        gpu_held = {d: b for d, b in held.items() if d != "host"}
        if not gpu_held:
            return True  # the host's memory is free the moment the process is gone
        while not freed_memory_visible(baseline, self.probe.read(), gpu_held):
            if self._clock() >= deadline:
                return False
            await asyncio.sleep(FREED_POLL_SECONDS)
        return True

    def unloaded(self, model: str) -> None:
        self.ledger.on_unloaded(model)
        self._placed.pop(model, None)

    # -- views -------------------------------------------------------------------------------

    def figures(self, model: str) -> dict[str, Any]:
        fig = self.ledger.figures(model)
        return {
            "min": dict(fig.min),
            "max": dict(fig.max) if fig.max is not None else None,
            "effective": dict(fig.effective) if fig.effective is not None else None,
            "held": dict(self.ledger.held(model)),
            "placement": self.placement(model),
        }

    def statistics(self) -> dict[str, Any]:
        """The ledger as of the last device reading (:meth:`refresh`); never probes itself."""
        return self.ledger.statistics().as_dict()
