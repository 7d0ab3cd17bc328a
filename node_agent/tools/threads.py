"""The tools' own threads, for work that would block the event loop (file I/O, a listing, an
edit's matching, a glob over a listing).

A thread protects the loop only from Python code, which hands the GIL over every few
milliseconds; one long C call holds it throughout. So nothing here may run a client's regular
expression (``re`` holds the GIL while it backtracks: issue 26, row 1): ``grep_search``'s runs
in a process of its own (``grep``). Work in these threads is bounded by size and time; the
pool is still the tools' own, so that a slow call stalls only the tools, never asyncio's
default executor.
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
