"""The tools' own threads, for work that would block the event loop (file I/O, a regex over a
file, an edit's matching).

A call can hold its thread for good: a catastrophic pattern such as ``(a+)+$`` never ends, and
no thread can be stopped. On asyncio's default executor that would stall every other
``to_thread`` user in the agent; on this small pool it stalls only the tools.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import ParamSpec, TypeVar

TOOL_THREADS = 4

_P = ParamSpec("_P")
_T = TypeVar("_T")

_pool = ThreadPoolExecutor(max_workers=TOOL_THREADS, thread_name_prefix="corral-tools")


async def in_thread(fn: Callable[_P, _T], *args: _P.args, **kwargs: _P.kwargs) -> _T:
    """``asyncio.to_thread`` on the tools' pool."""
    loop = asyncio.get_running_loop()
    return await loop.run_in_executor(_pool, functools.partial(fn, *args, **kwargs))
