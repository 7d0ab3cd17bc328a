"""Issue 50 (security round 3), rows 5 and 6: warm swaps' saved prompt caches, on real b11434.

Row 5: after client A's chat, client B's exact guess of A's prompt showed ``cache_n=49,
prompt_n=1`` (a wrong guess ``cache_n=18``): the prompt cache tells whether a guess is right.
Within one child that is llama-server's behaviour; across an eviction it was the agent's, for
a warm swap restored A's cache into a new child whoever asked for it. A saved cache is now
the key's that made it, and it is restored only into a child loaded for that key's requests.

Row 6: a saved cache cut short aborted the child as it was restored (b11434:
``GGML_ASSERT(nread <= state_size)``, exit -6), and that request got 502; one with flipped
bytes was restored without a word and the model answered from a garbage cache. Each file
now carries the checksum of what the child wrote; a file that differs is deleted, not read.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.harness import AgentProcess, chat

pytestmark = pytest.mark.timeout(180)

TINY, SMALL = "demo-tiny", "demo-small"
PROMPT = " ".join(f"word{i}" for i in range(300))  # about 2,000 tokens with the demo tokenizer
COLD = 1000  # more prompt tokens evaluated than this: nothing was restored
KEYS = {"a": "tenant-a-key-0123456789", "b": "tenant-b-key-0123456789"}


def evaluated(agent: AgentProcess, model: str, prompt: str, key: str | None = None) -> int:
    """The prompt tokens the child evaluated for one request (not those it had cached)."""
    headers = {"Authorization": f"Bearer {KEYS[key]}"} if key else None
    body = chat(model, 2, messages=[{"role": "user", "content": prompt}])
    status, answer = agent.post("/v1/chat/completions", body, headers=headers)
    assert status == 200, answer
    prompt_n: int = answer["timings"]["prompt_n"]
    return prompt_n


def start(demo_dir: Path, state: Path, *extra: str) -> AgentProcess:
    args = ["--models-dir", str(demo_dir), "--models-max", "1", "-np", "1", "-c", "4096"]
    return AgentProcess(
        [*args, "--warm-cache-size", "2GiB", *extra], env={"XDG_STATE_HOME": str(state)}
    )


@pytest.fixture
def two_keys(demo_dir: Path, tmp_path: Path) -> Iterator[AgentProcess]:
    agent = start(demo_dir, tmp_path, "--api-key", ",".join(KEYS.values()))
    try:
        yield agent
    finally:
        agent.stop()


def test_a_saved_cache_is_restored_only_for_the_key_that_made_it(two_keys: AgentProcess) -> None:
    agent = two_keys
    assert evaluated(agent, TINY, PROMPT, "a") > COLD
    evaluated(agent, SMALL, "hi", "a")  # --models-max 1: demo-tiny goes, A's cache is saved
    # B's exact guess of A's prompt loads demo-tiny again: A's cache stays on disk.
    assert evaluated(agent, TINY, PROMPT, "b") > COLD
    evaluated(agent, SMALL, "hi", "a")
    # A's next turn loads it for A alone: A's cache comes back.
    assert evaluated(agent, TINY, PROMPT, "a") < 10
    assert "saved prompt caches restored (warm swap)" in agent.log()


def test_a_cache_of_several_keys_is_not_saved(two_keys: AgentProcess) -> None:
    agent = two_keys
    evaluated(agent, TINY, PROMPT, "a")
    evaluated(agent, TINY, "hi", "b")  # the child's caches now hold both keys' prompts
    evaluated(agent, SMALL, "hi", "a")
    assert "served more than one key" in agent.log()
    assert evaluated(agent, TINY, PROMPT, "a") > COLD
    assert evaluated(agent, TINY, "hi", "b") > 0


@pytest.fixture
def open_agent(demo_dir: Path, tmp_path: Path) -> Iterator[AgentProcess]:
    agent = start(demo_dir, tmp_path)
    try:
        yield agent
    finally:
        agent.stop()


def saved_cache(state: Path) -> Path:
    """demo-tiny's saved cache (demo-small's "hi" is far smaller)."""
    (found,) = [f for f in (state / "corral" / "warm").iterdir() if f.stat().st_size > 100_000]
    return found


@pytest.mark.parametrize("damage", ["cut short", "bytes flipped"])
def test_a_damaged_saved_cache_is_deleted_unread(
    open_agent: AgentProcess, tmp_path: Path, damage: str
) -> None:
    agent = open_agent
    evaluated(agent, TINY, PROMPT)
    evaluated(agent, SMALL, "hi")
    file = saved_cache(tmp_path)
    data = file.read_bytes()
    if damage == "cut short":  # b11434 aborted on this one: GGML_ASSERT(nread <= state_size)
        file.write_bytes(data[:-1000])
    else:  # and answered from this one
        middle = len(data) // 2
        file.write_bytes(data[:middle] + bytes(b ^ 0xFF for b in data[middle : middle + 64]))
        with file.open("ab") as out:
            out.write(data[middle + 64 :])
    assert evaluated(agent, TINY, PROMPT) > COLD  # served, cold
    (child,) = agent.children()
    assert evaluated(agent, TINY, PROMPT) < 10  # the same child goes on, its own cache warm
    assert agent.children() == [child] and agent.state(TINY) == "loaded"
    log = agent.log()
    assert "GGML_ASSERT" not in log
    assert "is not what was saved" in log
    assert not file.exists()
