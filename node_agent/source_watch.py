"""Hot reload: the models folder, the preset file and the Hugging Face cache, watched.

A new ``.gguf`` in ``--models-dir`` or an edited preset showed up only after
``GET /models?reload=1``, which few users knew of (issue 29; llama-swap users expect their
config to be watched). A change to any watched path now reloads as ``?reload=1`` does, once
the changes have settled (a copy in progress is many writes).

Through inotify (the ``watchfiles`` library, where it is installed) or, without it, by
comparing a signature of the paths every :data:`POLL_SECONDS` (a listing: names, sizes,
modification times, bounded to :data:`MAX_ENTRIES` entries). The operator's preset folder
(a ConfigMap volume) keeps its own watch (``Agent.watch_presets``): it is not watched here.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import Awaitable, Callable, Iterable, Sequence
from pathlib import Path
from typing import Final

from node_agent.errors import ApiError
from node_agent.sources.download import PARTIAL

log = logging.getLogger("corral.agent")

POLL_SECONDS: Final = 0.5
# Changes that come closer together than this are one change (a copy, an editor's save).
SETTLE_SECONDS: Final = 0.3
# The most entries a poll looks at per path: a cache of thousands of files is watched by
# its first ones (inotify has no such bound).
MAX_ENTRIES: Final = 20_000
# Folders a poll descends into below a watched folder: a models folder's subfolders are
# models; the hub's models--org--repo/snapshots/<commit>/<file> is three more.
DEPTH: Final = 4

Reload = Callable[[], Awaitable[None]]


def watched_paths(models_dir: str | None, preset: str | None, hub: Path | None) -> list[Path]:
    """What to watch: the models folder, the preset file (its folder, since editors replace a
    file by renaming a new one over it), the hub. A path that does not exist yet is watched
    from its nearest existing parent by the poll, not at all by inotify."""
    paths = []
    if models_dir:
        paths.append(Path(models_dir))
    if preset and not Path(preset).is_dir():
        paths.append(Path(preset))
    if hub is not None:
        paths.append(hub)
    return paths


def signature(paths: Iterable[Path]) -> tuple[tuple[str, int, int], ...]:
    """Names, sizes and modification times under ``paths`` (bounded; blocking)."""
    seen: list[tuple[str, int, int]] = []
    for root in paths:
        _walk(root, 0, seen)
    return tuple(seen)


def growing(path: str) -> bool:
    """A download's partial file (``*.downloadInProgress``): it grows for as long as the download
    runs, and is no source until it is renamed into place (that rename is a change). A poll
    that saw it re-read every source twice a second during a download (issue 49)."""
    return path.endswith(PARTIAL)


def _walk(path: Path, depth: int, seen: list[tuple[str, int, int]]) -> None:
    if len(seen) >= MAX_ENTRIES or growing(path.name):
        return
    try:
        st = path.stat()  # follows the hub's snapshot symlinks to their blobs
    except OSError:
        seen.append((str(path), -1, -1))  # absent (or gone): its coming back is a change
        return
    seen.append((str(path), st.st_size, st.st_mtime_ns))
    if depth >= DEPTH or not path.is_dir():
        return
    try:
        with os.scandir(path) as entries:
            names = sorted(entry.name for entry in entries)
    except OSError:
        return
    for name in names:
        _walk(path / name, depth + 1, seen)


async def poll(paths: Sequence[Path], changed: Callable[[], None], *, once: bool = False) -> None:
    """Call ``changed`` whenever the signature of ``paths`` changes: forever, or (``once``)
    until the first change."""
    before = await asyncio.to_thread(signature, paths)
    while True:
        await asyncio.sleep(POLL_SECONDS)
        now = await asyncio.to_thread(signature, paths)
        if now != before:
            before = now
            changed()
            if once:
                return


async def notify(paths: Sequence[Path], changed: Callable[[], None]) -> None:
    """Call ``changed`` on each batch of inotify events under ``paths`` (forever). A file is
    watched through its folder, not recursively, for its own name only: an editor's save
    renames a new file over the old one, and a watch on the old one would see nothing more."""
    import watchfiles

    folders = [str(p) for p in paths if p.is_dir()]
    files = {str(p.resolve()) for p in paths if not p.is_dir()}

    def one_of_the_files(change: watchfiles.Change, path: str) -> bool:
        return str(Path(path).resolve()) in files

    def not_growing(change: watchfiles.Change, path: str) -> bool:
        return not growing(path)

    async def follow(
        where: list[str],
        recursive: bool,
        only: Callable[[watchfiles.Change, str], bool] | None,
    ) -> None:
        async for _ in watchfiles.awatch(
            *where,
            watch_filter=only,
            debounce=1600,
            # How often its thread wakes (taking the GIL) and how long a batch must be quiet:
            # 4 times a second, not 20 (an idle agent's CPU 3.2 -> 1.7 ms/s); a change reaches
            # the reload's settling 0.29-0.45 s after it is made, not 0.06-0.1 s (measured).
            step=250,
            recursive=recursive,
        ):
            changed()

    async with asyncio.TaskGroup() as group:
        if folders:
            group.create_task(follow(folders, True, not_growing))
        if files:
            parents = sorted({str(Path(f).parent) for f in files})
            group.create_task(follow(parents, False, one_of_the_files))


def have_watchfiles() -> bool:
    try:
        import watchfiles  # noqa: F401
    except ImportError:
        return False
    return True


async def notify_or_poll(paths: Sequence[Path], changed: Callable[[], None]) -> None:
    """inotify on the paths that exist, a poll of those that do not (inotify cannot watch a
    path before it is there: the Hugging Face cache before the first download); once one
    appears, it is a change, and the watch starts over with it. Forever."""
    while True:
        existing = [p for p in paths if p.exists()]
        missing = [p for p in paths if not p.exists()]
        watching = asyncio.ensure_future(notify(existing, changed)) if existing else None
        try:
            if missing:
                await poll(missing, changed, once=True)
            elif watching is not None:
                # Nothing to poll for (a poll of nothing woke a thread twice a second).
                await watching
        finally:
            if watching is not None:
                watching.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await watching


class SourceWatch:
    """Reloads when the sources change, once the changes have settled, or when asked
    (``SIGHUP``, :meth:`request`)."""

    def __init__(
        self, paths: Sequence[Path], reload: Reload, *, use_inotify: bool | None = None
    ) -> None:
        """``use_inotify``: None to use it where it is available, False to poll."""
        self.paths = list(paths)
        self._reload = reload
        self._use_inotify = use_inotify
        self._wake = asyncio.Event()
        self.reloads = 0  # reloads this watch has run (a statistic, and the tests' witness)

    def request(self, why: str) -> None:
        """Reload soon (from a signal handler: it only sets a flag)."""
        log.info("%s: reloading the models folder, the presets and the cache", why)
        self._wake.set()

    async def run(self) -> None:
        """Watch and reload; never returns (cancel it)."""
        async with asyncio.TaskGroup() as group:
            if self.paths:
                use_inotify = self._use_inotify is not False and have_watchfiles()
                how = "inotify" if use_inotify else f"polling every {POLL_SECONDS:g} s"
                log.info("hot reload: watching %s (%s)", ", ".join(map(str, self.paths)), how)
                watch = notify_or_poll if use_inotify else poll
                group.create_task(watch(self.paths, self._wake.set))
            while True:
                await self._settled()
                try:
                    await self._reload()
                except ApiError as exc:  # a source that cannot be read: nothing was changed
                    log.error("models or presets changed but cannot be applied: %s", exc.message)
                self.reloads += 1

    async def _settled(self) -> None:
        """Wait for a change, then until none came for SETTLE_SECONDS."""
        await self._wake.wait()
        self._wake.clear()
        while True:
            try:
                await asyncio.wait_for(self._wake.wait(), SETTLE_SECONDS)
            except TimeoutError:
                return
            self._wake.clear()
