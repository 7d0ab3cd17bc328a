"""``until_shutdown``: a long-lived response's items stop when the agent's shutdown begins."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from aiohttp import web

from node_agent.api.long_lived import ENDING, setup_long_lived, until_shutdown


def _app() -> web.Application:
    app = web.Application()
    setup_long_lived(app)
    return app


async def test_items_pass_until_they_end() -> None:
    async def items() -> AsyncIterator[int]:
        for i in range(3):
            yield i

    assert [i async for i in until_shutdown(_app(), items())] == [0, 1, 2]


async def test_the_shutdown_ends_a_wait_and_closes_the_source() -> None:
    app = _app()
    closed = asyncio.Event()

    async def forever() -> AsyncIterator[int]:
        try:
            yield 1
            await asyncio.Event().wait()  # an event stream with nothing more to say
            yield 2
        finally:
            closed.set()

    seen: list[int] = []

    async def consume() -> None:
        async for i in until_shutdown(app, forever()):
            seen.append(i)

    task = asyncio.create_task(consume())
    await asyncio.sleep(0.01)
    assert seen == [1] and not task.done()
    app.freeze()
    await app.shutdown()  # aiohttp's on_shutdown: once the listener has stopped
    await asyncio.wait_for(task, 1)
    assert seen == [1] and closed.is_set()


async def test_a_stream_opened_during_the_shutdown_ends_at_once() -> None:
    app = _app()
    app[ENDING].set()

    async def one() -> AsyncIterator[int]:
        yield 1

    assert [i async for i in until_shutdown(app, one())] == []


async def test_a_cancellation_during_the_close_goes_on() -> None:
    """The shutdown ends the wait; while the source takes its time to stop, the handler is
    cancelled (aiohttp's shutdown timeout): that cancellation reaches the handler."""
    app = _app()
    stopping = asyncio.Event()

    async def slow_to_stop() -> AsyncIterator[int]:
        try:
            await asyncio.Event().wait()
            yield 1
        finally:
            stopping.set()
            await asyncio.sleep(5)  # cut short by the handler's own cancellation

    async def consume() -> None:
        async for _ in until_shutdown(app, slow_to_stop()):
            pass

    task = asyncio.create_task(consume())
    await asyncio.sleep(0.01)
    app.freeze()
    await app.shutdown()
    await asyncio.wait_for(stopping.wait(), 1)
    task.cancel()
    await asyncio.wait({task}, timeout=1)
    assert task.cancelled()


async def test_a_client_that_leaves_closes_the_source() -> None:
    closed = asyncio.Event()

    async def forever() -> AsyncIterator[int]:
        try:
            while True:
                yield 1
        finally:
            closed.set()

    items = until_shutdown(_app(), forever())
    assert await anext(items) == 1
    await items.aclose()  # aiohttp ends the handler: its ``async for`` is left
    assert closed.is_set()
