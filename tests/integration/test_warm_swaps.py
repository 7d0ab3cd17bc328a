"""Warm swaps against the real llama-server (issue 28): a model's prompt caches saved when it
is evicted and restored when it loads again, so the next turn re-processes only what is new.

The demo models' weights are random, but their caches are real llama-server slot files:
what is measured is ``timings.prompt_n``, the tokens the child evaluated for the request.
"""

from __future__ import annotations

import hashlib
import os
import re
import signal
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from tests.integration.harness import AgentProcess, chat

pytestmark = pytest.mark.timeout(180)

TINY, SMALL = "demo-tiny", "demo-small"
PROMPT = " ".join(f"word{i}" for i in range(300))  # about 2,000 tokens with the demo tokenizer


@pytest.fixture
def state(tmp_path: Path) -> Path:
    return tmp_path


@pytest.fixture
def agent(demo_dir: Path, state: Path) -> Iterator[AgentProcess]:
    args = ["--models-dir", str(demo_dir), "--models-max", "1", "-np", "1", "-c", "4096"]
    # no --warm-cache-size: warm swaps are on by default
    process = AgentProcess(args, env={"XDG_STATE_HOME": str(state)})
    try:
        yield process
    finally:
        process.stop()


def evaluated(agent: AgentProcess, model: str, prompt: str = PROMPT) -> int:
    """The prompt tokens the child evaluated for one request (not those it had cached)."""
    body = chat(model, 2, messages=[{"role": "user", "content": prompt}])
    status, answer = agent.post("/v1/chat/completions", body)
    assert status == 200, answer
    prompt_n: int = answer["timings"]["prompt_n"]
    return prompt_n


def warm(agent: AgentProcess, model: str) -> dict[str, Any] | None:
    entry: dict[str, Any] | None = agent.models()[model]["corral"].get("warm")
    return entry


def saved_files(state: Path) -> list[Path]:
    folder = state / "corral" / "warm"
    return sorted(folder.iterdir()) if folder.exists() else []


def test_a_conversation_continues_warm_after_its_model_was_evicted(
    agent: AgentProcess, state: Path
) -> None:
    cold = evaluated(agent, TINY)
    assert cold > 1000
    evaluated(agent, SMALL, "hi")  # --models-max 1: demo-tiny is evicted, its cache saved
    held = warm(agent, TINY)
    assert held is not None and held["files"] == 1 and held["bytes"] > 0
    assert oct(os.stat(state / "corral" / "warm").st_mode & 0o777) == "0o700"
    assert evaluated(agent, TINY) < 10  # restored: only the end of the prompt is new
    assert "saved prompt caches restored (warm swap)" in agent.log()
    status, metrics = agent.get("/metrics")
    assert status == 200
    assert "corral_warm_restored_total 1.0" in metrics, metrics


def test_a_saved_cache_the_child_refuses_is_dropped_and_the_model_still_serves(
    agent: AgentProcess, state: Path
) -> None:
    evaluated(agent, TINY)
    evaluated(agent, SMALL, "hi")
    (tiny_file,) = [f for f in saved_files(state) if f.stat().st_size > 100_000]
    # Not a slot file, under the name of its own checksum: it reaches the child (a damaged
    # file whose name it does not match never does: tests/security/test_round3_warm.py).
    garbage = b"not a slot file" * 100
    checksum = hashlib.sha256(garbage).hexdigest()[:32]
    tiny_file.unlink()
    refused = tiny_file.with_name(re.sub("[0-9a-f]{32}.bin$", f"{checksum}.bin", tiny_file.name))
    refused.write_bytes(garbage)
    assert evaluated(agent, TINY) > 1000  # cold, but served
    assert "did not restore; deleted" in agent.log()
    assert not refused.exists()


def test_a_crash_saves_nothing(agent: AgentProcess, state: Path) -> None:
    evaluated(agent, TINY)
    (pid,) = agent.children()
    os.kill(pid, signal.SIGKILL)
    agent.wait_state(TINY, "unloaded")
    assert saved_files(state) == []
    assert evaluated(agent, TINY) > 1000


def test_clients_cannot_touch_the_agents_slot_files(agent: AgentProcess) -> None:
    evaluated(agent, TINY, "hi")
    for action in ("save", "restore", "erase"):
        status, answer = agent.post(
            f"/slots/0?action={action}", {"model": TINY, "filename": "mine.bin"}
        )
        assert status == 501, answer
        assert "--slot-save-path" in answer["error"]["message"]


def test_the_saved_caches_never_exceed_their_budget(demo_dir: Path, state: Path) -> None:
    budget = 1_500_000  # one long conversation's cache of demo-tiny (about 1 MB), not two
    assert budget == 1500 * 1000  # as given below: 1500K
    args = ["--models-dir", str(demo_dir), "--models-max", "1", "-np", "1", "-c", "4096"]
    args += ["--warm-cache-size", "1500K"]
    agent = AgentProcess(args, env={"XDG_STATE_HOME": str(state)})
    try:
        for model, prompt in ((TINY, PROMPT), (SMALL, PROMPT), (TINY, PROMPT), (SMALL, "hi")):
            evaluated(agent, model, prompt)
            assert sum(f.stat().st_size for f in saved_files(state)) <= budget
        assert len(saved_files(state)) >= 1
    finally:
        agent.stop()


def test_a_restore_brings_back_one_save_not_slots_of_several(demo_dir: Path, state: Path) -> None:
    """b11434's slots share one KV pool (-np auto: 4 slots, unified), and it clears idle slots
    when a task starts: an unload then often saves one slot of four. The slots' files of one
    save fit the pool together; files of several saves may not. Before, a save left the older
    files of the slots it found empty, the next load restored them beside the new one, and
    the child refused them ("No available space in KV cache"): they were deleted as bad."""
    args = ["--models-dir", str(demo_dir), "--models-max", "1", "-c", "512"]
    args += ["--warm-cache-size", "2GiB"]
    agent = AgentProcess(args, env={"XDG_STATE_HOME": str(state)})
    try:
        short = [" ".join(f"w{n}x{i}" for i in range(12)) for n in range(4)]
        with ThreadPoolExecutor(4) as pool:  # several slots hold a prompt each
            assert all(n > 0 for n in pool.map(lambda p: evaluated(agent, TINY, p), short))
        evaluated(agent, SMALL, "hi")  # demo-tiny is evicted: its slots saved
        held = warm(agent, TINY)
        # (a slot whose request ended before another's began is cleared: not always four)
        assert held is not None and held["files"] >= 2, held
        long = " ".join(f"long{i}" for i in range(50))
        assert evaluated(agent, TINY, long) > 300  # one slot now holds most of the pool
        evaluated(agent, SMALL, "hi")  # evicted again: the newest save is that one slot
        held = warm(agent, TINY)
        assert held is not None and held["files"] == 1, held
        assert evaluated(agent, TINY, long) < 10  # restored
        assert "did not restore" not in agent.log()
    finally:
        agent.stop()
