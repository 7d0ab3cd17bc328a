"""The benchmark's HTTP client (aiohttp): timed completions, streams and router calls.

Every call returns what it measured or raises :class:`RequestFailed`; scenarios decide
whether a failure ends a target (warm paths) or counts as an error (S5).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any

import aiohttp

CHAT = "/v1/chat/completions"
PROMPT = "hello"


class RequestFailed(Exception):
    """A request that did not end in a 200 with a complete body."""


def chat_body(model: str, max_tokens: int, **extra: Any) -> dict[str, Any]:
    return {
        "model": model,
        "max_tokens": max_tokens,
        "messages": [{"role": "user", "content": PROMPT}],
        **extra,
    }


def keepalive_session(timeout: float = 120.0) -> aiohttp.ClientSession:
    """One connection, reused: S1 measures what the router adds, not connection set-up."""
    connector = aiohttp.TCPConnector(limit=1, force_close=False)
    return aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=timeout))


def fresh_session(timeout: float = 300.0) -> aiohttp.ClientSession:
    """A new connection per request: llama-server closes the connection after a streamed
    response (a reused one then fails with "Server disconnected"), so streams never reuse."""
    connector = aiohttp.TCPConnector(force_close=True)
    return aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=timeout))


async def complete(
    session: aiohttp.ClientSession, url: str, model: str, max_tokens: int = 1
) -> float:
    """One non-streamed chat completion; seconds from send to the whole body read."""
    body = chat_body(model, max_tokens)
    start = time.perf_counter()
    try:
        async with session.post(url + CHAT, json=body) as response:
            payload = await response.read()
            elapsed = time.perf_counter() - start
    except (TimeoutError, aiohttp.ClientError) as exc:
        raise RequestFailed(f"{type(exc).__name__}: {exc}") from exc
    if response.status != 200:
        raise RequestFailed(f"HTTP {response.status}: {payload[:300]!r}")
    return elapsed


@dataclass(frozen=True)
class StreamTiming:
    ttft: float  # seconds from send to the first chunk that carries content
    total: float  # seconds from send to `data: [DONE]`
    tokens: int  # completion tokens (usage if the server sent it, else content chunks)


async def stream(
    session: aiohttp.ClientSession, url: str, model: str, max_tokens: int
) -> StreamTiming:
    """One streamed chat completion of exactly ``max_tokens`` tokens (EOS ignored)."""
    body = chat_body(
        model,
        max_tokens,
        stream=True,
        ignore_eos=True,
        stream_options={"include_usage": True},
    )
    start = time.perf_counter()
    first: float | None = None
    chunks = 0
    usage: int | None = None
    done = False
    try:
        async with session.post(url + CHAT, json=body) as response:
            if response.status != 200:
                raise RequestFailed(f"HTTP {response.status}: {(await response.read())[:300]!r}")
            # SSE lines: iterate line by line as they arrive (no buffering on our side).
            async for raw in response.content:
                line = raw.strip()
                if not line.startswith(b"data: "):
                    continue
                data = line[6:]
                if data == b"[DONE]":
                    # Read on to the end of the body (no `break`): a response left unread
                    # cannot go back to the keep-alive pool.
                    done = True
                    continue
                event = json.loads(data)
                if event.get("usage"):
                    usage = event["usage"].get("completion_tokens")
                for choice in event.get("choices") or ():
                    if (choice.get("delta") or {}).get("content"):
                        chunks += 1
                        if first is None:
                            first = time.perf_counter()
    except (TimeoutError, aiohttp.ClientError, ValueError) as exc:
        raise RequestFailed(f"{type(exc).__name__}: {exc}") from exc
    total = time.perf_counter() - start
    if not done or first is None:
        raise RequestFailed(f"stream ended early ({chunks} content chunks, done={done})")
    return StreamTiming(first - start, total, usage or chunks)


async def get_json(session: aiohttp.ClientSession, url: str) -> tuple[float, Any]:
    """GET; (seconds, parsed JSON)."""
    start = time.perf_counter()
    try:
        async with session.get(url) as response:
            payload = await response.read()
            elapsed = time.perf_counter() - start
    except (TimeoutError, aiohttp.ClientError) as exc:
        raise RequestFailed(f"{type(exc).__name__}: {exc}") from exc
    if response.status != 200:
        raise RequestFailed(f"HTTP {response.status}: {payload[:300]!r}")
    return elapsed, json.loads(payload)


async def model_states(session: aiohttp.ClientSession, router_url: str) -> dict[str, str]:
    _, data = await get_json(session, router_url + "/models")
    return {m["id"]: m["status"]["value"] for m in data["data"]}


async def unload(session: aiohttp.ClientSession, router_url: str, model: str) -> None:
    async with session.post(router_url + "/models/unload", json={"model": model}) as response:
        payload = await response.read()
    if response.status != 200:
        raise RequestFailed(f"unload {model}: HTTP {response.status}: {payload[:300]!r}")
