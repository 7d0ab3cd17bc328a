"""WebSocket requests against the real agent and today's llama-server (issue 29, item 8).

b11434 serves no WebSocket yet: its answer to the handshake is what the client gets, after
the model was found and leased like any request (the session itself is tested with a stub
child that serves one: tests/unit/test_registry_async.py)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

import aiohttp
import pytest

from tests.integration.harness import AgentProcess

Start = Callable[..., AgentProcess]

pytestmark = pytest.mark.timeout(120)


async def handshake(url: str) -> tuple[int, str]:
    async with aiohttp.ClientSession() as session:
        try:
            async with session.ws_connect(url):
                return 101, ""
        except aiohttp.WSServerHandshakeError as exc:
            return exc.status, exc.message


def test_a_websocket_goes_to_the_models_child_and_its_answer_comes_back(
    start_agent: Start, demo_dir: Path
) -> None:
    agent = start_agent("--models-dir", str(demo_dir), "--models-max", "1", "-c", "512")
    status, _ = asyncio.run(handshake(f"{agent.url}/v1/realtime?model=demo-tiny"))
    assert status == 404  # b11434's own answer: it has no such route
    assert agent.state("demo-tiny") == "loaded"  # found, loaded and leased like a request
    status, _ = asyncio.run(handshake(f"{agent.url}/v1/realtime"))
    assert status == 400  # no model named: llama.cpp's router reads it from the query
    status, _ = asyncio.run(handshake(f"{agent.url}/v1/realtime?model=nope"))
    assert status == 400
