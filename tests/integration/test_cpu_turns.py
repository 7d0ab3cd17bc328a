"""``--cpu-turns`` and the children's threads with the real agent and real CPU children: a
model whose child runs several threads waits while another computes, for one turn at most,
then computes beside it; each child runs a thread per core but one unless told."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from node_agent.llama_server.cpu_threads import child_threads
from tests.integration.harness import chat, children_of, open_stream

SMALL, MEDIUM = "demo-small", "demo-medium"
TURN = 2.0


@pytest.mark.timeout(300)
def test_a_model_waits_its_turn_while_another_computes_then_shares_the_cores(
    start_agent: Any, demo_dir: Path
) -> None:
    # Two threads each (the agent's own choice is one on a machine of two cores).
    agent = start_agent(
        "--models-dir", str(demo_dir), "--models-max", "2", "-c", "4096", "-t", "2",
        "--cpu-turns", f"{TURN:g}s", "--log-level", "debug",
    )  # fmt: skip
    assert "take turns on the CPU of at most 2s" in agent.log()  # this build lists no GPU
    for model in (MEDIUM, SMALL):
        assert agent.post("/v1/chat/completions", chat(model))[0] == 200
    turn_began = time.monotonic()  # (or a little later: when the agent leased it)
    conn, _ = open_stream(agent, MEDIUM)  # 3,000 tokens: medium computes a long while
    try:
        status, body = agent.post("/v1/chat/completions", chat(SMALL), timeout=120)
        waited = time.monotonic() - turn_began
        assert status == 200, body
        assert f"request for model={SMALL} waits: it takes turns on the CPU with {MEDIUM}" in (
            agent.log()
        )
        assert waited >= TURN  # not before medium's turn ran out…
        assert agent.models()[MEDIUM]["corral"]["in_flight"] == 1  # …nor after its stream
    finally:
        conn.close()


def test_each_child_runs_a_thread_per_core_but_one_unless_told(
    start_agent: Any, demo_dir: Path
) -> None:
    """A thread per core (llama-server's default) has a child's threads spin at ggml's
    barriers whenever another thread takes a core (issue 48): the agent leaves one."""
    expected = child_threads()  # 1 on this machine's 2 cores
    agent = start_agent("--models-dir", str(demo_dir), "--models-max", "2")
    assert f"each runs {expected} thread" in agent.log()
    assert agent.post("/v1/chat/completions", chat(SMALL))[0] == 200
    assert _threads(agent) == [str(expected)]

    told = start_agent("--models-dir", str(demo_dir), "-t", "3")  # the user's -t wins
    assert told.post("/v1/chat/completions", chat(SMALL))[0] == 200
    assert _threads(told) == ["3"]


def _threads(agent: Any) -> list[str]:
    """The thread counts on demo-small's child's command line."""
    (pid,) = children_of(agent.proc.pid)
    args = Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")
    return [args[n + 1] for n, arg in enumerate(args) if arg in ("-t", "--threads")]
