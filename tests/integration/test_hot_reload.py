"""Hot reload through the real agent: a file dropped into the models folder or a preset edited
shows in ``GET /models`` without ``?reload=1``; SIGHUP reloads, with a log line (issue 29)."""

from __future__ import annotations

import shutil
import signal
import time
from pathlib import Path
from typing import Any

from tests.integration.harness import AgentProcess, wait_until

TINY, SMALL = "demo-tiny", "demo-small"


def listed_within(agent: AgentProcess, name: str, seconds: float) -> float | None:
    """How long until ``name`` is listed (polling GET /models), None if not within."""
    started = time.monotonic()
    while time.monotonic() - started < seconds:
        if name in agent.models():
            return time.monotonic() - started
        time.sleep(0.05)
    return None


def watching(agent: AgentProcess, folder: Path) -> None:
    """Wait until the agent watches ``folder``: its watch starts once it listens, a moment
    after /health answers, and misses what came before. A file that is no model, written
    again each second until then (a change each time), brings a reload."""
    written = [0.0]

    def reloaded() -> bool:
        if "reloaded: " in agent.log():
            return True
        if time.monotonic() - written[0] >= 1:
            (folder / "notes.txt").write_text(f"not a model ({time.monotonic()})\n")
            written[0] = time.monotonic()
        return False

    wait_until(reloaded, f"a reload for a change in {folder}", timeout=20)


def tiny_folder(demo_dir: Path, tmp_path: Path) -> Path:
    """A models folder holding demo-tiny."""
    folder = tmp_path / "models"
    folder.mkdir()
    shutil.copy(demo_dir / f"{TINY}.gguf", folder)
    return folder


def test_a_file_dropped_into_the_models_folder_is_listed_within_2_s(
    start_agent: Any, demo_dir: Path, tmp_path: Path
) -> None:
    folder = tiny_folder(demo_dir, tmp_path)
    preset = tmp_path / "presets.ini"
    preset.write_text("[extra]\nmodel = " + str(folder / f"{TINY}.gguf") + "\n")
    agent: AgentProcess = start_agent(
        "--models-dir", str(folder), "--models-preset", str(preset), "-c", "512"
    )
    assert SMALL not in agent.models()
    watching(agent, folder)
    shutil.copy(demo_dir / f"{SMALL}.gguf", folder)
    took = listed_within(agent, SMALL, 2.0)
    assert took is not None, agent.log()[-2000:]
    # An edited preset file, saved as editors do (a new file renamed over the old one).
    text = preset.read_text() + "[another]\nmodel = " + str(folder / f"{SMALL}.gguf") + "\n"
    (tmp_path / "presets.ini.tmp").write_text(text)
    (tmp_path / "presets.ini.tmp").rename(preset)
    assert listed_within(agent, "another", 2.0) is not None, agent.log()[-2000:]
    # A file removed goes from the list the same way.
    (folder / f"{SMALL}.gguf").unlink()
    started = time.monotonic()
    while SMALL in agent.models() and time.monotonic() - started < 2:
        time.sleep(0.05)
    assert SMALL not in agent.models()


def test_sighup_reloads_with_a_log_line(start_agent: Any, demo_dir: Path, tmp_path: Path) -> None:
    folder = tiny_folder(demo_dir, tmp_path)
    agent: AgentProcess = start_agent("--models-dir", str(folder), "-c", "512")
    agent.proc.send_signal(signal.SIGHUP)
    started = time.monotonic()
    while "SIGHUP: reloading" not in agent.log() and time.monotonic() - started < 5:
        time.sleep(0.05)
    # The reload comes once no other change came for a moment, off the loop (a worker thread).
    wait_until(lambda: "reloaded: 0 added" in agent.log(), "the reload's line", timeout=10)
    assert agent.proc.poll() is None, agent.log()[-2000:]  # it used to end the agent
    log = agent.log()
    assert "SIGHUP: reloading the models folder, the presets and the cache" in log
    assert "reloaded: 0 added, 0 removed" in log
    assert TINY in agent.models()


def test_a_broken_file_dropped_in_is_a_warning(
    start_agent: Any, demo_dir: Path, tmp_path: Path
) -> None:
    """As at start (item 1), a file that cannot load is said when it arrives."""
    folder = tiny_folder(demo_dir, tmp_path)
    agent: AgentProcess = start_agent("--models-dir", str(folder), "-c", "512")
    watching(agent, folder)
    whole = (demo_dir / f"{SMALL}.gguf").read_bytes()
    (folder / "cut.gguf").write_bytes(whole[: len(whole) // 2])
    assert listed_within(agent, "cut", 2.0) is not None
    started = time.monotonic()
    while "model cut: its model file" not in agent.log() and time.monotonic() - started < 5:
        time.sleep(0.05)
    assert (
        "model cut: its model file" in agent.log() and "not within the file bounds" in agent.log()
    )
