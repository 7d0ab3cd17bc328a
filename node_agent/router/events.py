"""The registry's events: llama.cpp's ``/models/sse`` messages, to every subscriber.

Each subscriber (an SSE client, the metrics, the status page) gets its own queue, so a slow
one never holds the others back; a subscriber that goes away is forgotten.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Event:
    """One ``/models/sse`` message: llama.cpp's ``{"model", "event", "data"}``."""

    model: str
    event: str
    data: dict[str, Any] | None


class EventHub:
    """Publishes events to the subscribers of the moment (no history is kept)."""

    def __init__(self) -> None:
        self._subscribers: set[asyncio.Queue[Event]] = set()

    def publish(self, event: Event) -> None:
        for queue in self._subscribers:
            queue.put_nowait(event)

    async def subscribe(self) -> AsyncIterator[Event]:
        """Every event from now on, until the caller stops iterating."""
        queue: asyncio.Queue[Event] = asyncio.Queue()
        self._subscribers.add(queue)
        try:
            while True:
                yield await queue.get()
        finally:
            self._subscribers.discard(queue)
