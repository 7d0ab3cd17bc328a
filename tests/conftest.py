"""Fixtures for every tier."""

from __future__ import annotations

import asyncio
import gc
import os
from collections.abc import AsyncIterator

import pytest
from hypothesis import settings

# Property tests: hypothesis' 100 examples each by default (the unit tier must stay under 10 s
# on a busy machine; their @example cases pin the known edges). HYPOTHESIS_PROFILE=deep runs
# 2,000 each, e.g. `HYPOTHESIS_PROFILE=deep hack/test.sh tests/unit -k "fuzz or property"`.
settings.register_profile("fast", max_examples=100, deadline=None)
settings.register_profile("deep", max_examples=2000, deadline=None)
PROFILE = os.environ.get("HYPOTHESIS_PROFILE", "fast")
settings.load_profile(PROFILE)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The deep profile runs twenty times the examples: pytest's bound of 120 s a test (made
    for the default run) would cut its machines short (two deep runs on 2 cores did)."""
    if PROFILE == "deep":
        for item in items:
            item.add_marker(pytest.mark.timeout(0))


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


def pytest_collection_finish(session: pytest.Session) -> None:
    """Everything imported and collected so far lives for the whole run: freeze it, so that
    the garbage collector's full passes (frequent in property tests) stop re-scanning it."""
    gc.collect()
    gc.freeze()
