"""Responses that stay open until the client leaves (``/models/sse``, ``/models/logs?follow=1``)
end when the agent shuts down.

Nothing else would end them: aiohttp's shutdown waits for every handler up to
``--shutdown-timeout`` and then cancels it mid-stream, so one open event stream held the whole
shutdown for its bound and the client saw its stream cut. aiohttp's answer (its docs,
"Graceful shutdown") is an ``on_shutdown`` handler that closes such connections; it runs once
the listener has stopped, before the wait. llama.cpp's router does the same: its SSE loop
returns when the router is ``stopping``, which ends the stream with its last chunk. Proxied
streams are not here: the registry's drain ends those.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import TypeVar

from aiohttp import web

T = TypeVar("T")

ENDING: web.AppKey[asyncio.Event] = web.AppKey("corral_ending", asyncio.Event)


async def until_shutdown(app: web.Application, items: AsyncIterator[T]) -> AsyncIterator[T]:
    """``items`` until they end or the agent begins its shutdown, whichever comes first."""
    ending = app[ENDING]
    if ending.is_set():
        return
    stop = asyncio.ensure_future(ending.wait())
    step: asyncio.Future[T] | None = None
    try:
        while True:
            step = asyncio.ensure_future(anext(items))
            await asyncio.wait({step, stop}, return_when=asyncio.FIRST_COMPLETED)
            if not step.done():
                return
            try:
                item = step.result()
            except StopAsyncIteration:
                return
            step = None
            yield item
    finally:
        stop.cancel()
        if step is not None and not step.done():
            step.cancel()
            with contextlib.suppress(asyncio.CancelledError, StopAsyncIteration):
                await step


async def _end_streams(app: web.Application) -> None:
    app[ENDING].set()


def setup_long_lived(app: web.Application) -> None:
    app[ENDING] = asyncio.Event()
    app.on_shutdown.append(_end_streams)
