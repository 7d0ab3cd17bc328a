"""``/api/chat``, ``/api/generate``, ``/api/embed``: Ollama's requests, served by the child.

Each request goes through the registry as an OpenAI-style one does: the same queue, the same
lease (a model is never evicted under it), the same ``keep_alive``, the same autoload rule.
Then it is translated (``ollama.translate``), sent to the leased child's ``/v1/...``
endpoint, and the answer translated back; a stream stays a stream, each SSE chunk becoming
one NDJSON line as it comes.

Two differences from the OpenAI-style routes, both for want of a seam in the proxy (which
writes the child's bytes to the client as they are): these requests do not wait at the
child's slot gate (``--max-queue`` and ``--queue-timeout`` apply to the model's load queue,
not to its slots: llama-server queues them itself), and they are served here, never forwarded
to a peer agent.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any, Final

import aiohttp
from aiohttp import web

from node_agent.api.replies import with_preset_fix
from node_agent.api.state import STATE, AgentState
from node_agent.api.tenants import request_tenant
from node_agent.child.keys import child_key
from node_agent.child.ports import CHILD_HOST
from node_agent.core.scheduler_events import Keep, KeepAliveValue
from node_agent.errors import ApiError
from node_agent.ollama.listing import resolve
from node_agent.ollama.translate import (
    Translated,
    answer_piece,
    done_reason,
    durations,
    finish_of,
    now_text,
)
from node_agent.runtime.ttl import parse_keep_alive

CHILD_SESSION: web.AppKey[aiohttp.ClientSession] = web.AppKey(
    "corral_ollama_child_session", aiohttp.ClientSession
)
# llama-server's own --timeout default (600 s): how long a child may say nothing.
CHILD_READ_SECONDS: Final = 600.0
NDJSON: Final = "application/x-ndjson"


async def child_session(app: web.Application) -> AsyncIterator[None]:
    """The session these routes reach children with (the app's cleanup context).

    No keep-alive: an idle pooled connection holds one of llama-server's few HTTP threads
    until it times out (bench S5 measured 5-20 s stalls from that in the proxy)."""
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=10, sock_read=CHILD_READ_SECONDS)
    connector = aiohttp.TCPConnector(force_close=True)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        app[CHILD_SESSION] = session
        yield


def _child_error(status: int, text: str, model: str) -> ApiError:
    """The child's error answer, its message kept (Ollama's clients show ``error``), with
    what a Corral user does about a feature the child lacks (``with_preset_fix``)."""
    message = text[:2000]
    try:
        document = json.loads(text)
    except json.JSONDecodeError:
        document = None
    if isinstance(document, dict):
        error = document.get("error")
        if isinstance(error, dict) and isinstance(error.get("message"), str):
            message = error["message"]
        elif isinstance(error, str):
            message = error
    message = with_preset_fix(message, model)
    return ApiError(status, f"the model's server answered {status}: {message}")


async def serve(
    request: web.Request,
    body: dict[str, Any],
    translate: Callable[[Mapping[str, Any]], Translated],
) -> web.StreamResponse:
    """Translate ``body``, lease the model, send it to the child, answer in Ollama's shape."""
    state = request.app[STATE]
    wanted = translate(body)
    registry = state.registry
    name = resolve(registry, wanted.model)
    # Ollama's keep_alive: how long the model stays once idle after this request (absent or
    # null: the model's own idle time).
    keep_alive: KeepAliveValue = (
        Keep.DEFAULT if wanted.keep_alive is None else parse_keep_alive(wanted.keep_alive)
    )
    tenant = request_tenant(request)
    if _nothing_to_say(wanted):
        return await _load_or_unload(state, wanted, name, keep_alive, tenant)
    started = time.monotonic_ns()
    lease = await registry.acquire(
        name, autoload=state.settings.models_autoload, keep_alive=keep_alive, tenant=tenant
    )
    try:
        load_ns = time.monotonic_ns() - started
        port = lease.port
        if port is None:
            raise ApiError(500, f"model name={name} is not running")
        session = request.app[CHILD_SESSION]
        url = f"http://{CHILD_HOST}:{port}{wanted.path}"
        headers = {"Authorization": f"Bearer {child_key(port)}"}
        try:
            async with session.post(
                url, json={**wanted.body, "model": name}, headers=headers
            ) as up:
                if up.status != 200:
                    raise _child_error(up.status, await up.text(errors="replace"), name)
                if wanted.stream:
                    return await _stream(request, state, wanted, up, started, load_ns)
                answer = await up.json(content_type=None)
        except aiohttp.ClientError as exc:
            raise ApiError(502, f"the model's server did not answer: {exc}") from exc
    finally:
        registry.release(lease)
    total = time.monotonic_ns() - started
    return web.json_response(_whole(wanted, answer, total, load_ns))


def _nothing_to_say(wanted: Translated) -> bool:
    """Ollama's way to load (or, with keep_alive 0, unload) a model: a request with no
    prompt or no messages."""
    if wanted.kind == "embed":
        return False
    if "prompt" in wanted.body:
        return not wanted.body["prompt"]
    messages = wanted.body.get("messages") or []
    return not messages or (wanted.kind == "generate" and all(not m["content"] for m in messages))


async def _load_or_unload(
    state: AgentState, wanted: Translated, name: str, keep_alive: KeepAliveValue, tenant: str
) -> web.Response:
    registry = state.registry
    reason = "load"
    if keep_alive == 0:  # Ollama's unload: the model goes (once idle), if it runs at all
        if registry.state(name).running:
            registry.unload(name)
        reason = "unload"
    else:
        lease = await registry.acquire(
            name, autoload=state.settings.models_autoload, keep_alive=keep_alive, tenant=tenant
        )
        registry.release(lease)
    said: dict[str, Any] = (
        {"message": {"role": "assistant", "content": ""}}
        if wanted.kind == "chat"
        else {"response": ""}
    )
    return web.json_response(
        {
            "model": wanted.model,
            "created_at": now_text(),
            **said,
            "done": True,
            "done_reason": reason,
        }
    )


def _whole(wanted: Translated, answer: Any, total: int, load_ns: int) -> dict[str, Any]:
    if not isinstance(answer, dict):
        raise ApiError(502, "the model's server answered something that is not a JSON object")
    if wanted.kind == "embed":
        data = answer.get("data") if isinstance(answer.get("data"), list) else []
        assert isinstance(data, list)
        ordered = sorted((d for d in data if isinstance(d, dict)), key=lambda d: d.get("index", 0))
        stats = durations(answer, total, load_ns)
        return {
            "model": wanted.model,
            "embeddings": [d.get("embedding") for d in ordered],
            "total_duration": total,
            "load_duration": load_ns,
            **(
                {"prompt_eval_count": stats["prompt_eval_count"]}
                if "prompt_eval_count" in stats
                else {}
            ),
        }
    return {
        "model": wanted.model,
        "created_at": now_text(),
        **answer_piece(wanted, answer),
        "done": True,
        "done_reason": done_reason(finish_of(answer)),
        **durations(answer, total, load_ns),
    }


def _line(document: Mapping[str, Any]) -> bytes:
    return json.dumps(document, ensure_ascii=False).encode() + b"\n"


async def _stream(
    request: web.Request,
    state: AgentState,
    wanted: Translated,
    upstream: aiohttp.ClientResponse,
    started: int,
    load_ns: int,
) -> web.StreamResponse:
    """The child's SSE chunks as NDJSON lines, each written as it comes; the last line has
    ``done: true`` and the counts (``stream_options.include_usage`` asked for them)."""
    response = web.StreamResponse(headers={"Content-Type": NDJSON})
    await response.prepare(request)
    limit = state.settings.client_timeout
    stats: dict[str, Any] = {}
    finish: object = None

    async def write(document: Mapping[str, Any]) -> None:
        # A client that takes nothing for --client-timeout is cut off, as the proxy does:
        # it would hold the lease, and the model, for ever.
        async with asyncio.timeout(limit):
            await response.write(_line(document))

    try:
        async for raw in upstream.content:
            line = raw.strip()
            if not line.startswith(b"data:"):
                continue
            payload = line[5:].strip()
            if payload == b"[DONE]":
                break
            chunk = json.loads(payload)
            if not isinstance(chunk, dict):
                continue
            if "error" in chunk:
                failed = _child_error(500, payload.decode(errors="replace"), wanted.model)
                await write({"error": str(failed)})
                await response.write_eof()
                return response
            for key in ("usage", "timings"):
                if isinstance(chunk.get(key), dict):
                    stats[key] = chunk[key]
            finish = finish_of(chunk) or finish
            piece = answer_piece(wanted, chunk)
            said = piece.get("message", piece)
            if any(said.get(k) for k in ("content", "response", "thinking", "tool_calls")):
                await write(
                    {"model": wanted.model, "created_at": now_text(), **piece, "done": False}
                )
        total = time.monotonic_ns() - started
        empty = answer_piece(wanted, {"choices": [{"delta": {}}]})
        await write(
            {
                "model": wanted.model,
                "created_at": now_text(),
                **empty,
                "done": True,
                "done_reason": done_reason(finish),
                **durations(stats, total, load_ns),
            }
        )
        await response.write_eof()
        return response
    except (ConnectionResetError, TimeoutError):
        # The client hung up, or took nothing for --client-timeout (aiohttp's reset error is a
        # ClientError too: caught first). Leaving ``upstream`` unread closes it, and the child
        # stops generating.
        if request.transport is not None:
            request.transport.abort()
        return response
    except (aiohttp.ClientError, ValueError) as exc:  # ValueError: a line past aiohttp's cap
        with contextlib.suppress(ConnectionResetError, TimeoutError):  # the client left too
            await write({"error": f"the model's server stopped mid-answer: {exc}"})
            await response.write_eof()
        return response
