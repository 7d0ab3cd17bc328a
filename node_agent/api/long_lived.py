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
from collections.abc import AsyncGenerator, AsyncIterator
from typing import TypeVar

from aiohttp import web

T = TypeVar("T")

ENDING: web.AppKey[asyncio.Event] = web.AppKey("corral_ending", asyncio.Event)


async def until_shutdown(app: web.Application, items: AsyncGenerator[T, None]) -> AsyncIterator[T]:
    """``items`` until they end or the agent begins its shutdown, whichever comes first;
    ``items`` is closed either way (and when the client leaves)."""
    ending = app[ENDING]
    if ending.is_set():
        await items.aclose()
        return
    async with contextlib.aclosing(items), contextlib.aclosing(_until(ending, items)) as steps:
        async for item in steps:
            yield item


async def _until(ending: asyncio.Event, items: AsyncIterator[T]) -> AsyncGenerator[T, None]:
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
            try:
                await step
            except StopAsyncIteration:
                pass
            except asyncio.CancelledError:
                # Only ``step``'s own cancellation ends here; the handler's goes on.
                task = asyncio.current_task()
                if not step.cancelled() or (task is not None and task.cancelling() > 0):
                    raise


async def _end_streams(app: web.Application) -> None:
    app[ENDING].set()


def setup_long_lived(app: web.Application) -> None:
    app[ENDING] = asyncio.Event()
    app.on_shutdown.append(_end_streams)
