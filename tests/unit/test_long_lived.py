"""``until_shutdown``: a long-lived response's items stop when the agent's shutdown begins."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from aiohttp import web

from node_agent.router.long_lived import ENDING, setup_long_lived, until_shutdown


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
