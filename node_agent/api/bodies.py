"""Request bodies: read within a deadline, parsed off the event loop when large (issue 16,
row 8).

``json.loads`` of a 60 MB body held the event loop for seconds (1.8 s in the issue, 10 s on
a busy machine here): every other client, ``/health`` included, waited, and the agent's RSS
grew by 1.5 GB. A body over ``OFF_LOOP_BYTES`` is parsed in a short-lived worker process
instead (``body_fields``: a thread would hold the GIL), one at a time, and only its top-level
scalar fields come back — the raw body is what the child gets. ``--max-body-size`` still caps
what is read (aiohttp's ``client_max_size``), and the whole body must arrive within
``--client-timeout`` (``connections``), so a client that trickles it cannot hold a
connection and its handler for ever.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import multiprocessing
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from aiohttp import web

from node_agent.api.body_fields import loads, top_level_fields
from node_agent.api.connections import mark_receiving
from node_agent.clip import clip
from node_agent.errors import ApiError

OFF_LOOP_BYTES = 1024 * 1024
_large = asyncio.Semaphore(1)
CLIENT_TIMEOUT: web.AppKey[float] = web.AppKey("corral_client_timeout", float)
T = TypeVar("T")


async def read_body(request: web.Request) -> bytes:
    """The whole body, or 408 when it has not arrived within the client timeout."""
    return await _receive(request, request.read())


async def _receive(request: web.Request, reading: Awaitable[T]) -> T:
    limit = request.app.get(CLIENT_TIMEOUT)
    mark_receiving(request.protocol, True)
    try:
        async with asyncio.timeout(limit):
            return await reading
    except TimeoutError:
        raise ApiError(
            408, f"the request body did not arrive within {limit:g} s (--client-timeout)"
        ) from None
    finally:
        mark_receiving(request.protocol, False)


async def read_json(request: web.Request) -> tuple[bytes, Any]:
    """The body as read, and its JSON document (:func:`json_document`)."""
    body = await read_body(request)
    return body, await json_document(body)


async def read_control_body(request: web.Request) -> bytes:
    """A control route's body (a lookup, a tool call, a download's name), within the client
    timeout as :func:`read_body`: such a body is small by nature, so one over
    ``OFF_LOOP_BYTES`` is refused (413) from its ``Content-Length``, or once that much of a
    chunked one has come, never read whole into memory nor parsed on the event loop.
    ``--max-body-size``'s own 413 (every route's) comes first."""
    most = request.client_max_size
    announced = request.content_length
    if most and (announced or 0) > most:
        raise web.HTTPRequestEntityTooLarge(most, announced or 0)
    cap = min(OFF_LOOP_BYTES, most or OFF_LOOP_BYTES)
    if announced is not None and announced > cap:
        raise _too_large(request, f"this one is {announced} bytes")
    body = await _receive(request, _read_at_most(request, cap))
    if body is not None:
        return body
    if cap < OFF_LOOP_BYTES:
        raise web.HTTPRequestEntityTooLarge(most)
    raise _too_large(request, f"this one is more than {cap} bytes")


async def _read_at_most(request: web.Request, cap: int) -> bytes | None:
    """The body, or None once more than ``cap`` bytes of it have come (the rest unread)."""
    body = bytearray()
    while chunk := await request.content.readany():
        body.extend(chunk)
        if len(body) > cap:
            return None
    return bytes(body)


def _too_large(request: web.Request, size: str) -> ApiError:
    return ApiError(
        413,
        f"request body too large: {request.method} {clip(request.path)} takes at most "
        f"{OFF_LOOP_BYTES // (1024 * 1024)} MiB, {size}",
    )


async def json_document(body: bytes) -> Any:
    """The body's JSON document: whole when small, else (parsed in a worker process) its
    top-level scalar fields only."""
    if len(body) <= OFF_LOOP_BYTES:
        return parse_json_body(body)
    return await digest(body, top_level_fields)


async def digest(body: bytes, parse: Callable[[bytes], tuple[str | None, T]]) -> T:
    """``parse(body)``, in a worker process when the body is large: ``parse`` (a function of a
    leaf module, as ``body_fields``) returns (the client's mistake in words, or None; what the
    route needs), small enough to come back at no cost. A mistake is a 400."""
    if len(body) <= OFF_LOOP_BYTES:
        error, data = parse(body)
    else:
        async with _large:
            loop = asyncio.get_running_loop()
            error, data = await loop.run_in_executor(_worker(), parse, body)
    if error is not None:
        raise ApiError(400, error)
    return data


@functools.cache
def _worker() -> concurrent.futures.ProcessPoolExecutor:
    # forkserver: a clean process (not a fork of the agent with its threads and sockets);
    # one task per process, so the memory of a huge parse goes back to the system at once.
    return concurrent.futures.ProcessPoolExecutor(
        max_workers=1,
        mp_context=multiprocessing.get_context("forkserver"),
        max_tasks_per_child=1,
    )


def end_worker() -> None:
    """End the large bodies' parser process, if one was started (the app's cleanup): left to
    the interpreter's exit, 3.11's executor finalizer fails noisily in a process that ran
    apps one after another (the tests)."""
    if _worker.cache_info().currsize:
        _worker().shutdown(wait=False)
        _worker.cache_clear()


def parse_json_body(body: bytes) -> Any:
    """The request's JSON document; a body that is not one is the client's mistake (400).

    llama.cpp answers 500 here (a deliberate difference, listed in app.py's docstring).
    """
    error, data = loads(body)
    if error is not None:
        raise ApiError(400, error)
    return data


MODEL_MISSING = "model name is missing from the request"


def body_model(data: Any) -> str | None:
    """The ``model`` a JSON body names, or None when it names none (absent, empty, not a
    string, or the body is not an object: llama.cpp treats them all as missing)."""
    model = data.get("model") if isinstance(data, dict) else None
    return model if isinstance(model, str) and model else None
