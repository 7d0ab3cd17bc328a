"""TaskSet's guard and statistics, and the event hub's bounded subscriber queues."""

from __future__ import annotations

import asyncio
import logging

import pytest

from node_agent.aio import TaskSet
from node_agent.runtime.event_hub import QUEUE_LIMIT, Event, EventHub


async def test_a_forever_task_that_returns_is_logged(caplog: pytest.LogCaptureFixture) -> None:
    tasks = TaskSet("t")

    async def returns() -> None:
        return None

    async def runs() -> None:
        await asyncio.Event().wait()

    tasks.spawn(returns(), "oops", forever=True)
    tasks.spawn(runs(), "fine", forever=True)
    tasks.spawn(returns(), "one-shot")
    with caplog.at_level(logging.ERROR, logger="corral"):
        await asyncio.sleep(0.01)
    assert "task t:oops returned, but it should run until the agent stops" in caplog.text
    assert "one-shot" not in caplog.text
    stats = tasks.statistics()
    assert (stats.running, stats.started, stats.crashed, stats.closed) == (1, 3, 1, False)
    await tasks.close()  # cancelling a forever task is its normal end: nothing logged
    assert "fine" not in caplog.text
    assert tasks.statistics().closed


async def test_a_lagging_subscriber_keeps_only_the_newest_events() -> None:
    hub = EventHub()
    events = hub.subscribe()
    first = asyncio.ensure_future(anext(events))
    await asyncio.sleep(0)  # subscribed
    hub.publish(Event("m", "e", {"n": -1}))
    assert (await first).data == {"n": -1}
    for n in range(QUEUE_LIMIT + 5):
        hub.publish(Event("m", "e", {"n": n}))
    stats = hub.statistics()
    assert (stats.subscribers, stats.published, stats.dropped) == (1, QUEUE_LIMIT + 6, 5)
    assert (await anext(events)).data == {"n": 5}  # the 5 oldest were dropped
    await events.aclose()
    assert hub.statistics().subscribers == 0
