"""Hot reload's watch: a change under a watched path reloads once it has settled (issue 29)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from node_agent.source_watch import SourceWatch, have_watchfiles, signature, watched_paths
from tests.waiting import until


@contextlib.asynccontextmanager
async def running(watch: SourceWatch) -> AsyncIterator[None]:
    """``watch`` runs for the block; cancelled after it, as the agent cancels it."""
    task = asyncio.create_task(watch.run())
    try:
        yield
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task


@pytest.mark.parametrize("use_inotify", [True, False], ids=["inotify", "polling"])
async def test_a_new_file_and_an_edited_preset_reload(tmp_path: Path, use_inotify: bool) -> None:
    models, preset = tmp_path / "models", tmp_path / "presets.ini"
    models.mkdir()
    preset.write_text("[a]\n")
    reloads: list[float] = []

    async def reload() -> None:
        reloads.append(time.monotonic())

    if use_inotify:
        assert have_watchfiles()  # it is in the test extra
    watch = SourceWatch(
        watched_paths(str(models), str(preset), None), reload, use_inotify=use_inotify
    )
    async with running(watch):
        await asyncio.sleep(0.3)  # the watch is set up
        started = time.monotonic()
        (models / "new.gguf").write_bytes(b"GGUF")
        await until(lambda: len(reloads) >= 1, 2)
        assert len(reloads) == 1 and reloads[0] - started < 2
        # An editor's save: a new file renamed over the old one.
        (tmp_path / "presets.ini.new").write_text("[a]\n[b]\n")
        (tmp_path / "presets.ini.new").rename(preset)
        await until(lambda: len(reloads) >= 2, 2)
        assert len(reloads) == 2


async def test_many_changes_in_a_row_are_one_reload(tmp_path: Path) -> None:
    reloads: list[int] = []

    async def reload() -> None:
        reloads.append(1)

    watch = SourceWatch([tmp_path], reload, use_inotify=False)
    async with running(watch):
        for _ in range(5):  # requests closer together than SETTLE_SECONDS
            watch.request("test")
            await asyncio.sleep(0.05)
        await asyncio.sleep(0.6)
        assert reloads == [1]


def test_the_polls_signature_is_bounded_and_sees_absent_paths(tmp_path: Path) -> None:
    missing = tmp_path / "hub"
    before = signature([missing])
    assert before == ((str(missing), -1, -1),)
    missing.mkdir()
    assert signature([missing]) != before


async def test_a_path_that_appears_later_is_watched_from_then_on(tmp_path: Path) -> None:
    """The Hugging Face cache before the first download: polled until it exists, then
    inotify (its files' changes are seen)."""
    hub = tmp_path / "hub"
    reloads: list[int] = []

    async def reload() -> None:
        reloads.append(1)

    watch = SourceWatch([hub], reload, use_inotify=True)
    async with running(watch):
        await asyncio.sleep(0.2)
        hub.mkdir()
        for count in (1, 2):
            await until(lambda: len(reloads) >= count, 3)  # noqa: B023 - awaited at once
            assert len(reloads) == count
            await asyncio.sleep(0.2)
            (hub / f"file{count}").write_bytes(b"x")  # seen by inotify now


@pytest.mark.skipif(not have_watchfiles(), reason="inotify through watchfiles")
async def test_with_every_path_there_nothing_is_polled(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """inotify watches them all: no poll of nothing wakes a thread twice a second."""
    import node_agent.source_watch as source_watch

    polls: list[int] = []
    monkeypatch.setattr(source_watch, "signature", lambda paths: polls.append(1) or ())

    async def reload() -> None:
        pass

    async with running(SourceWatch([tmp_path], reload, use_inotify=True)):
        await asyncio.sleep(3 * source_watch.POLL_SECONDS)
    assert polls == []


def test_a_growing_partial_file_is_no_change_until_it_is_renamed(tmp_path: Path) -> None:
    blob = tmp_path / "blobs" / "abc"
    blob.parent.mkdir()
    partial = blob.with_name("abc.downloadInProgress")
    partial.write_bytes(b"x")
    before = signature([tmp_path])
    partial.write_bytes(b"x" * 1000)  # the download goes on
    assert signature([tmp_path]) == before
    partial.rename(blob)  # the file is in place: that is a change
    assert signature([tmp_path]) != before


@pytest.mark.skipif(not have_watchfiles(), reason="inotify through watchfiles")
async def test_inotify_sees_no_growing_partial_file(tmp_path: Path) -> None:
    reloads: list[int] = []

    async def reload() -> None:
        reloads.append(1)

    partial = tmp_path / "abc.downloadInProgress"
    watch = SourceWatch([tmp_path], reload, use_inotify=True)
    async with running(watch):
        await asyncio.sleep(0.3)
        for size in range(1, 8):
            partial.write_bytes(b"x" * size * 1000)
            await asyncio.sleep(0.3)
        assert reloads == []
        partial.rename(tmp_path / "abc")
        await until(lambda: reloads == [1], 5)
