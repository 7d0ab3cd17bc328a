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
from collections.abc import Callable
from typing import Any, TypeVar

from aiohttp import web

from node_agent.errors import ApiError
from node_agent.router.body_fields import loads, top_level_fields
from node_agent.router.connections import mark_receiving

OFF_LOOP_BYTES = 1024 * 1024
_large = asyncio.Semaphore(1)
CLIENT_TIMEOUT: web.AppKey[float] = web.AppKey("corral_client_timeout", float)


async def read_body(request: web.Request) -> bytes:
    """The whole body, or 408 when it has not arrived within the client timeout."""
    limit = request.app.get(CLIENT_TIMEOUT)
    mark_receiving(request.protocol, True)
    try:
        async with asyncio.timeout(limit):
            return await request.read()
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
    """A control route's body (a lookup, a tool call, a download's name), read as
    :func:`read_body` reads it: such a body is small by nature, so one over
    ``OFF_LOOP_BYTES`` is refused (413) rather than parsed on the event loop."""
    body = await read_body(request)  # --max-body-size's own 413 first
    if len(body) <= OFF_LOOP_BYTES:
        return body
    raise ApiError(
        413,
        f"request body too large: {request.method} {request.path} takes at most "
        f"{OFF_LOOP_BYTES // (1024 * 1024)} MiB, this one is {len(body)} bytes",
    )


async def json_document(body: bytes) -> Any:
    """The body's JSON document: whole when small, else (parsed in a worker process) its
    top-level scalar fields only."""
    if len(body) <= OFF_LOOP_BYTES:
        return parse_json_body(body)
    return await digest(body, top_level_fields)


T = TypeVar("T")


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


def parse_json_body(body: bytes) -> Any:
    """The request's JSON document; a body that is not one is the client's mistake (400).

    llama.cpp answers 500 here (a deliberate difference, listed in app.py's docstring).
    """
    error, data = loads(body)
    if error is not None:
        raise ApiError(400, error)
    return data
