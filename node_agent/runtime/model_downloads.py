"""The one owner of the agent's downloads: ``POST /models`` repositories and presets' files.

Each download is one task, started here and only here; the pure
:class:`~node_agent.core.download_book.DownloadBook` decides what may start and which progress is
reported. A download holds no instance slot and no device memory: the scheduler never sees it.
Requests for a model whose download is on its way wait for it (bounded by ``--max-queue`` and
``--queue-timeout``); an unload cancels it.

Events on ``/models/sse`` are llama.cpp b11434's: ``model_status {"status": "downloading"}``,
``download_progress {"progress": {<url>: {"done", "total"}}}``, then ``download_finished`` or
``download_failed`` (no data), then the reload's ``models_reload``.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from node_agent.aio import TaskSet
from node_agent.core.download_book import DownloadBook, Refusal
from node_agent.errors import ApiError
from node_agent.redact import redact
from node_agent.runtime.download_records import DownloadRecords
from node_agent.runtime.event_hub import Event, EventHub
from node_agent.runtime.refusals import failed_error, queue_full_error, queue_timeout_error
from node_agent.sources import hf_hub
from node_agent.sources.download import (
    TIMEOUT,
    DownloadError,
    DownloadPlan,
    Limits,
    discard_partial,
    fetch,
    use_cached,
    with_local_model,
)
from node_agent.sources.hf_cache import hub_dir
from node_agent.sources.spec import ModelSpec

log = logging.getLogger("corral.downloads")


@dataclass(frozen=True)
class DownloadSettings:
    """What the agent's options say about downloads."""

    env: Mapping[str, str] = field(default_factory=lambda: dict(os.environ))
    token: str | None = None
    """``--hf-token``, else ``$HF_TOKEN``."""
    limits: Limits = field(default_factory=Limits)
    load_timeout: float | None = None
    """A preset's download is part of its load: ``--load-timeout`` bounds it too."""
    records: Path | None = None
    """Where unfinished ``POST /models`` downloads are recorded (None: nowhere)."""

    @property
    def hub(self) -> Path | None:
        return hub_dir(self.env)


class Downloads:
    """Downloads by model name; see the module docstring."""

    def __init__(
        self, hub: EventHub, settings: DownloadSettings, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.settings = settings
        self._hub = hub
        self._clock = clock
        self._book = DownloadBook()
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._errors: dict[str, str] = {}  # why a model's last download failed
        self._waits: dict[str, asyncio.Event] = {}  # set when a model's download is over
        self._discard: set[str] = set()  # cancelled for good: their partial files go too
        self._taskset = TaskSet("downloads")
        self._session: aiohttp.ClientSession | None = None
        # The agent's reload: a finished repository becomes a cache model.
        self.on_finished: Callable[[], Awaitable[None]] | None = None
        self._records = DownloadRecords(settings.records) if settings.records else None

    def active(self, name: str) -> bool:
        return self._book.active(name)

    def names(self) -> list[str]:
        return self._book.names()

    def _publish(self, name: str, event: str, data: dict[str, Any] | None = None) -> None:
        self._hub.publish(Event(name, event, data))

    def _http(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(timeout=TIMEOUT)
        return self._session

    # -- POST /models ----------------------------------------------------------------------

    async def start_repo(self, name: str, exists: Callable[[str], bool]) -> None:
        """Start downloading ``org/repo[:quant]`` into the hub cache; returns once it is on its
        way. ApiError (400) for a bad name, an existing model, or files shared with a download
        on its way; (500) when the Hub cannot say what to download."""
        try:
            hf_hub.split_repo_tag(name)
        except ValueError as exc:
            raise ApiError(400, str(exc)) from None
        if exists(name) or self.active(name):
            raise ApiError(400, f"model '{name}' already exists")
        hub = self.settings.hub
        if hub is None:
            raise ApiError(500, "no Hugging Face cache folder: set HF_HOME or LLAMA_CACHE")
        try:
            plan = await hf_hub.plan(
                self._http(), name, hub=hub, env=self.settings.env, token=self.settings.token
            )
        except DownloadError as exc:
            # llama.cpp accepts such a name and reports download_finished with nothing
            # downloaded; a name that downloads nothing is refused here (a listed difference).
            raise ApiError(400, redact(str(exc))) from None
        if exists(name):  # the plan took a while: a reload may have brought it
            raise ApiError(400, f"model '{name}' already exists")
        self._begin(name, plan.blobs)
        if self._records is not None:
            await asyncio.to_thread(self._records.add, name)
        self._run(name, self._repo(name, plan), becomes_model=True)

    def resume_recorded(self, exists: Callable[[str], bool]) -> None:
        """Start again the downloads recorded unfinished (the agent stopped or died while
        they ran); their partial files resume where they were."""
        if self._records is None:
            return
        for name in self._records.names():
            if exists(name):
                self._records.remove(name)
                continue
            log.info("model=%s: resuming its download (unfinished at the last stop)", name)
            self._taskset.spawn(self._resume(name, exists), f"resume:{name}")

    async def _resume(self, name: str, exists: Callable[[str], bool]) -> None:
        try:
            await self.start_repo(name, exists)
        except ApiError as exc:
            log.warning("model=%s: its download cannot resume: %s", name, exc.message)
            self._cross_out(name)

    def _cross_out(self, name: str) -> None:
        if self._records is not None:
            self._records.remove(name)

    async def _repo(self, name: str, plan: hf_hub.RepoPlan) -> None:
        def progress(url: str, done: int, total: int | None) -> None:
            self._report(name, url, done, total)

        await hf_hub.download(
            self._http(),
            plan,
            token=self.settings.token,
            limits=self.settings.limits,
            progress=progress,
        )

    # -- a preset's file, before its load ---------------------------------------------------

    def local(self, spec: ModelSpec, plan: DownloadPlan | None) -> ModelSpec:
        """``spec`` loading its downloaded file (once :meth:`fetch_preset` got it)."""
        return with_local_model(spec, plan.destination) if plan is not None else spec

    async def start_preset(self, name: str, plan: DownloadPlan) -> bool:
        """Whether ``name``'s preset file is in the cache and verified (no download, no
        events); when it is not, its download is on its way on return."""
        if self.active(name):
            return False
        if await asyncio.to_thread(use_cached, plan.destination, plan.sha256):
            self._errors.pop(name, None)
            return True
        if self.active(name):  # another load began it while the cache was looked at: join it
            return False
        self._begin(name, frozenset({str(plan.destination)}))
        self._run(name, self._preset(name, plan), becomes_model=False)
        return False

    async def fetch_preset(
        self,
        name: str,
        plan: DownloadPlan,
        *,
        queue_timeout: float | None,
        left: float | None,
        max_queue: int | None,
    ) -> None:
        """Make sure ``name``'s preset file is in the cache, downloading it (once, however many
        requests ask) when it is not. The caller waits at most ``left`` seconds (what is
        left of its ``--queue-timeout``, ``queue_timeout``); the download itself at most
        ``--load-timeout``. Raises ApiError."""
        if await self.start_preset(name, plan):
            return
        await self.wait(name, queue_timeout=queue_timeout, left=left, max_queue=max_queue)
        error = self._errors.get(name)
        if error is not None:
            raise failed_error(name, error)

    async def _preset(self, name: str, plan: DownloadPlan) -> None:
        def progress(value: float) -> None:
            self._report(name, plan.url, int(value * 1000), 1000)

        work = fetch(
            plan.url,
            plan.destination.parent,
            plan.sha256,
            session=self._http(),
            progress=progress,
            limits=self.settings.limits,
        )
        bound = self.settings.load_timeout
        try:
            await asyncio.wait_for(work, bound)
        except TimeoutError:
            raise DownloadError(
                f"download of {redact(plan.url)} took longer than --load-timeout ({bound:g} s)"
            ) from None

    # -- the tasks -------------------------------------------------------------------------

    def _begin(self, name: str, files: frozenset[str]) -> None:
        refusal = self._book.begin(name, files)
        if refusal is not None:
            kind, other = refusal
            if kind is Refusal.EXISTS:
                raise ApiError(400, f"model '{name}' already exists")
            raise ApiError(
                400,
                f"model '{name}' shares files with '{other}', which is downloading; "
                "try again once it is done",
            )
        self._errors.pop(name, None)
        self._publish(name, "model_status", {"status": "downloading"})
        log.info("model=%s: downloading", name)

    def _run(self, name: str, work: Awaitable[None], *, becomes_model: bool) -> None:
        """``becomes_model``: the files make a new cache model (a reload lists it)."""
        task = self._taskset.spawn(self._own(name, work, becomes_model), f"download:{name}")
        self._tasks[name] = task

    async def _own(self, name: str, work: Awaitable[None], becomes_model: bool) -> None:
        try:
            await work
        except asyncio.CancelledError:
            # An unload (or the shutdown) cancelled it: over, failed; the cancellation goes on.
            # An unload discards the partial files (llama.cpp's rule); a shutdown keeps them,
            # and the next download resumes them.
            self._errors[name] = "the download was cancelled"
            if name in self._discard:
                log.info("model=%s: download cancelled (its partial files are removed)", name)
                for path in self._book.files(name):
                    discard_partial(Path(path))
                self._cross_out(name)  # an unload: the user is done with it
            else:  # the shutdown (close), the one other canceller: nothing is lost
                later = (
                    "it resumes when the agent starts again"
                    if becomes_model  # a POST /models download, recorded (download_records)
                    else "the model's next load resumes it"
                )
                log.info("model=%s: download stopped by the shutdown; %s", name, later)
            self._over(name, ok=False)
            raise
        except (DownloadError, OSError) as exc:
            self._cross_out(name)  # the source refused it: a restart would not do better
            self._errors[name] = redact(str(exc))
            log.warning("model=%s: download failed: %s", name, self._errors[name])
            self._over(name, ok=False)
            return
        except Exception as exc:  # the task's boundary: whatever went wrong, it ends as failed
            # Left unended, the model stayed "downloading" for good: DELETE and requests
            # waited forever and a new POST was "already exists" (issue 26, row 12).
            self._errors[name] = redact(f"the download failed: {type(exc).__name__}: {exc}")[:500]
            log.exception("model=%s: download failed unexpectedly", name)
            self._over(name, ok=False)
            return
        self._publish(name, "download_finished")
        self._cross_out(name)
        try:
            if becomes_model and self.on_finished is not None:
                await self.on_finished()  # the new files become a cache model
        except ApiError as exc:
            log.warning("model=%s: downloaded, but the reload failed: %s", name, exc.message)
        except Exception:  # the task's boundary again: the download is over either way
            log.exception("model=%s: downloaded, but the reload failed", name)
        finally:
            self._over(name, ok=True)

    def _over(self, name: str, *, ok: bool) -> None:
        """The download ended: waiters wake to a catalog that has the model (or does not)."""
        self._tasks.pop(name, None)
        self._discard.discard(name)
        if not ok:
            self._publish(name, "download_failed")
        self._book.end(name)
        over = self._waits.pop(name, None)
        if over is not None:
            over.set()

    def _report(self, name: str, url: str, done: int, total: int | None) -> None:
        snapshot = self._book.progress(name, redact(url), done, total, self._clock())
        if snapshot is not None:
            self._publish(name, "download_progress", {"progress": snapshot})

    # -- waiting and cancelling ------------------------------------------------------------

    async def wait(
        self, name: str, *, queue_timeout: float | None, left: float | None, max_queue: int | None
    ) -> None:
        """Wait until ``name``'s download is over, at most ``left`` seconds (what is left of
        the request's ``--queue-timeout``, ``queue_timeout``, counted from its arrival); 503 when
        ``max_queue`` requests already wait or the time is up."""
        if not self.active(name):
            return
        if not self._book.join(name, max_queue):
            assert max_queue is not None
            raise queue_full_error(name, max_queue)
        log.info("request for model=%s waits for its download", name)
        over = self._waits.setdefault(name, asyncio.Event())
        try:
            await asyncio.wait_for(over.wait(), left)
        except TimeoutError:
            assert queue_timeout is not None
            raise queue_timeout_error(
                name, queue_timeout, "its download is still running"
            ) from None
        finally:
            self._book.leave(name)

    def failed(self, name: str) -> str | None:
        """Why ``name``'s last download failed (None: it did not, or none ran)."""
        return self._errors.get(name)

    def cancel(self, name: str) -> bool:
        """Cancel ``name``'s download (``POST /models/unload``); False when none runs."""
        task = self._tasks.get(name)
        if task is None:
            return False
        self._discard.add(name)
        task.cancel()
        return True

    async def wait_cancelled(self, name: str) -> None:
        """Return once ``name``'s download is over (llama.cpp's unload waits the same way)."""
        while self.active(name):
            over = self._waits.setdefault(name, asyncio.Event())
            await over.wait()

    def statistics(self) -> dict[str, int]:
        stats = self._book.statistics()
        return {"downloads": stats.downloads, "waiters": stats.waiters}

    async def close(self) -> None:
        for task in list(self._tasks.values()):
            task.cancel()
        await self._taskset.close()
        if self._session is not None:
            await self._session.close()
