"""A conversation request (``X-Conversation-Id``) whose client drops as soon as it has sent it
still reaches its child, whose session keeps the generation (as b11434's router sends it on),
whatever its body's size: one over ``OFF_LOOP_BYTES`` (a chat with an image) is parsed off the
loop, and the drop came while it was."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from typing import Any

import pytest

from node_agent.api.bodies import OFF_LOOP_BYTES
from tests.unit.fake_child import Plan, chat, fake_agent, spec


def _raw(conv: str, body: dict[str, Any]) -> bytes:
    data = json.dumps(body).encode()
    return (
        "POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        f"Content-Type: application/json\r\nX-Conversation-Id: {conv}\r\n"
        f"Content-Length: {len(data)}\r\n\r\n"
    ).encode() + data


async def _send_and_drop(url: str, conv: str, body: dict[str, Any]) -> None:
    host, port = url.removeprefix("http://").split(":")
    _, writer = await asyncio.open_connection(host, int(port))
    writer.write(_raw(conv, body))
    await writer.drain()
    writer.transport.abort()


@pytest.mark.parametrize("size", [10_000, OFF_LOOP_BYTES + 1])
async def test_a_request_dropped_as_soon_as_sent_reaches_the_ready_child(
    caplog: pytest.LogCaptureFixture, size: int
) -> None:
    caplog.set_level(logging.INFO)
    plan = Plan()
    async with fake_agent(plan, [spec("m")]) as agent:
        async with agent.client.post(f"{agent.url}/v1/chat/completions", json=chat("m")) as r:
            assert r.status == 200  # loaded: the request is not parked behind a load
        body = chat("m", 8, stream=True)
        body["messages"][0]["content"] = "x" * size
        await _send_and_drop(agent.url, "c-1", body)
        deadline = time.monotonic() + 10
        while "c-1" not in plan.conversations:
            assert time.monotonic() < deadline, "the dropped request never reached the child"
            await asyncio.sleep(0.02)
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR], caplog.text
