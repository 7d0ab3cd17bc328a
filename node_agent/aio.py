"""Small asyncio helpers: named tasks with a parent, and a change signal.

Every background task belongs to a :class:`TaskSet` (STYLE: every task has a parent); one that
ends with an exception is logged with its name instead of vanishing with "Task exception was
never retrieved", and one meant to run forever that returns is logged too (kopf's ``guard``).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine
from dataclasses import dataclass
from typing import Any

log = logging.getLogger("corral.aio")


@dataclass(frozen=True)
class TaskStatistics:
    name: str
    running: int
    started: int
    crashed: int
    closed: bool


class TaskSet:
    """Owns background tasks: creates them with a name, logs crashes, cancels them on close."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._tasks: set[asyncio.Task[Any]] = set()
        self._forever: set[asyncio.Task[Any]] = set()
        self._closed = False
        self._started = 0
        self._crashed = 0

    def spawn(
        self, coro: Coroutine[Any, Any, Any], name: str, *, forever: bool = False
    ) -> asyncio.Task[Any]:
        """Run ``coro`` as a task named ``<set>:<name>``. ``forever``: it must only end by
        being cancelled; returning is a bug, logged as an error."""
        if self._closed:
            coro.close()
            raise RuntimeError(f"{self.name}: closed, cannot start {name}")
        task = asyncio.get_running_loop().create_task(coro, name=f"{self.name}:{name}")
        self._tasks.add(task)
        self._started += 1
        if forever:
            self._forever.add(task)
        task.add_done_callback(self._done)
        return task

    def _done(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        forever = task in self._forever
        self._forever.discard(task)
        if task.cancelled():
            return
        exc = task.exception()
        if exc is not None:
            self._crashed += 1
            log.error("task %s crashed", task.get_name(), exc_info=exc)
        elif forever:
            self._crashed += 1
            log.error("task %s returned, but it should run until the agent stops", task.get_name())

    def statistics(self) -> TaskStatistics:
        return TaskStatistics(
            self.name, len(self._tasks), self._started, self._crashed, self._closed
        )

    def __len__(self) -> int:
        return len(self._tasks)

    async def close(self) -> None:
        """Cancel every task and wait for all of them to finish."""
        self._closed = True
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)


class Changed:
    """A broadcast "something changed" signal: wait for the next change after a snapshot.

    Waiters take the current event *before* they look at the state, then wait on it; since
    asyncio does not switch tasks between the two, no change can slip between them.
    """

    def __init__(self) -> None:
        self._event = asyncio.Event()

    def current(self) -> asyncio.Event:
        return self._event

    def notify(self) -> None:
        self._event.set()
        self._event = asyncio.Event()
