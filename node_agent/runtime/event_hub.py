"""The registry's events: llama.cpp's ``/models/sse`` messages, to every subscriber.

Each subscriber (an SSE client, the metrics, the status page) gets its own bounded queue, so
a slow one never holds the others back nor grows the agent's memory: a subscriber that falls
:data:`QUEUE_LIMIT` events behind loses the oldest ones (counted in :meth:`statistics`); one
that goes away is forgotten.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Event:
    """One ``/models/sse`` message: llama.cpp's ``{"model", "event", "data"}``."""

    model: str
    event: str
    data: dict[str, Any] | None


QUEUE_LIMIT = 1000  # events held per subscriber (a load publishes a few dozen)


@dataclass(frozen=True)
class HubStatistics:
    subscribers: int
    published: int
    dropped: int  # events a lagging subscriber never saw (its oldest ones)


class EventHub:
    """Publishes events to the subscribers of the moment (no history is kept)."""

    def __init__(self) -> None:
        self._subscribers: set[asyncio.Queue[Event]] = set()
        self._published = 0
        self._dropped = 0

    def publish(self, event: Event) -> None:
        self._published += 1
        for queue in self._subscribers:
            if queue.full():
                queue.get_nowait()
                self._dropped += 1
            queue.put_nowait(event)

    def statistics(self) -> HubStatistics:
        return HubStatistics(len(self._subscribers), self._published, self._dropped)

    async def subscribe(self) -> AsyncGenerator[Event, None]:
        """Every event from now on, until the caller stops iterating."""
        queue: asyncio.Queue[Event] = asyncio.Queue(QUEUE_LIMIT)
        self._subscribers.add(queue)
        try:
            while True:
                yield await queue.get()
        finally:
            self._subscribers.discard(queue)
