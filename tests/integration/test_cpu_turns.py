"""``--cpu-turns`` with the real agent and real CPU children: a model waits while another
computes, for one turn at most, then computes beside it."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from tests.integration.harness import chat, open_stream

SMALL, MEDIUM = "demo-small", "demo-medium"
TURN = 2.0


@pytest.mark.timeout(300)
def test_a_model_waits_its_turn_while_another_computes_then_shares_the_cores(
    start_agent: Any, demo_dir: Path
) -> None:
    agent = start_agent(
        "--models-dir", str(demo_dir), "--models-max", "2", "-c", "4096",
        "--cpu-turns", f"{TURN:g}s", "--log-level", "debug",
    )  # fmt: skip
    assert "models take turns of at most 2s" in agent.log()  # this build lists no GPU
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
