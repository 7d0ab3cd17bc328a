"""Fixtures for every tier."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest


@pytest.fixture
async def no_leaked_tasks() -> AsyncIterator[None]:
    """Fail an async test that leaves tasks running behind it (STYLE: every task has a parent).

    Request it in any async test that builds agent parts in-process.
    """
    before = asyncio.all_tasks()
    yield
    await asyncio.sleep(0)  # let tasks that were just cancelled finish
    leaked = [t for t in asyncio.all_tasks() - before if not t.done()]
    leaked = [t for t in leaked if t is not asyncio.current_task()]
    for task in leaked:
        task.cancel()
    assert not leaked, f"tasks leaked: {[t.get_name() for t in leaked]}"
