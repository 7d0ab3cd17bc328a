"""Hot reload's watch: a change under a watched path reloads once it has settled (issue 29)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from node_agent.source_watch import SourceWatch, inotify_available, signature, watched_paths


@pytest.mark.parametrize("use_inotify", [True, False], ids=["inotify", "polling"])
async def test_a_new_file_and_an_edited_preset_reload(tmp_path: Path, use_inotify: bool) -> None:
    models, preset = tmp_path / "models", tmp_path / "presets.ini"
    models.mkdir()
    preset.write_text("[a]\n")
    reloads: list[float] = []

    async def reload() -> None:
        reloads.append(time.monotonic())

    if use_inotify:
        assert inotify_available([models, preset])  # watchfiles is in the test extra
    watch = SourceWatch(
        watched_paths(str(models), str(preset), None), reload, use_inotify=use_inotify
    )
    task = asyncio.create_task(watch.run())
    try:
        await asyncio.sleep(0.3)  # the watch is set up
        started = time.monotonic()
        (models / "new.gguf").write_bytes(b"GGUF")
        while not reloads and time.monotonic() - started < 2:
            await asyncio.sleep(0.02)
        assert len(reloads) == 1 and reloads[0] - started < 2
        # An editor's save: a new file renamed over the old one.
        (tmp_path / "presets.ini.new").write_text("[a]\n[b]\n")
        (tmp_path / "presets.ini.new").rename(preset)
        while len(reloads) < 2 and time.monotonic() - started < 4:
            await asyncio.sleep(0.02)
        assert len(reloads) == 2
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task


async def test_many_changes_in_a_row_are_one_reload(tmp_path: Path) -> None:
    reloads: list[int] = []

    async def reload() -> None:
        reloads.append(1)

    watch = SourceWatch([tmp_path], reload, use_inotify=False)
    task = asyncio.create_task(watch.run())
    try:
        for _ in range(5):  # requests closer together than SETTLE_SECONDS
            watch.request("test")
            await asyncio.sleep(0.05)
        await asyncio.sleep(0.6)
        assert reloads == [1]
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task


def test_the_polls_signature_is_bounded_and_sees_absent_paths(tmp_path: Path) -> None:
    missing = tmp_path / "hub"
    before = signature([missing])
    assert before == ((str(missing), -1, -1),)
    missing.mkdir()
    assert signature([missing]) != before
