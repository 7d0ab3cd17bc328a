"""Which event loop runs the agent (``--event-loop``): uvloop wherever it is installed (a
dependency on the platforms it has wheels for), else asyncio's own.

uvloop's transports and loop are libuv's, in C: measured side by side on this project's bench
(issue 30, docs/benchmarks.md), the agent's CPU per streamed chunk fell by about a fifth
with it, and a little per request; each child it spawns costs about 3 ms more (libuv's spawn
of a large process). Nothing in the agent depends on which loop runs it; asyncio's stays one
flag away.
"""

from __future__ import annotations

import asyncio
import importlib.util
from collections.abc import Callable

EVENT_LOOPS = ("auto", "uvloop", "asyncio")


def uvloop_installed() -> bool:
    return importlib.util.find_spec("uvloop") is not None


def check_event_loop(choice: str) -> str:
    """``--event-loop``'s value, refused when it names a loop that cannot run here."""
    choice = choice.strip().lower()
    if choice not in EVENT_LOOPS:
        raise ValueError("not one of them")
    if choice == "uvloop" and not uvloop_installed():
        raise ValueError("uvloop is not installed here (pip install uvloop), or give asyncio")
    return choice


def loop_factory(choice: str) -> Callable[[], asyncio.AbstractEventLoop] | None:
    """For ``asyncio.Runner``: uvloop's loop, or None for asyncio's own."""
    if choice == "asyncio" or (choice == "auto" and not uvloop_installed()):
        return None
    import uvloop

    return uvloop.new_event_loop


def running_asyncio_loop() -> bool:
    """asyncio's own loop (not uvloop's, which watches its children through libuv)."""
    return isinstance(asyncio.get_running_loop(), asyncio.BaseEventLoop)
