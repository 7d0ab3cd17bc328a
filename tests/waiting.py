"""Waiting in a test for what happens on its own time (a reader, a watcher), without a fixed
sleep that a busy machine outruns."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable


async def until(condition: Callable[[], bool], seconds: float) -> None:
    """Return once ``condition()`` holds, or after ``seconds`` (the caller asserts)."""
    deadline = time.monotonic() + seconds
    while True:
        if condition() or time.monotonic() > deadline:
            return
        await asyncio.sleep(0.02)
