"""Each model's file, checked once at start: a broken one is a warning in the agent's log.

Without it a truncated download or a file that is not a GGUF showed up only as a failed load,
on the first request, minutes or days later (issue 29). The check is the GGUF header's own
walk (:func:`~node_agent.memory.gguf_header.read_header`: the magic, the version, every
tensor's data inside the file), bounded in time per file and run off the event loop.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Final

from node_agent.sources.spec import ModelSpec

log = logging.getLogger("corral.agent")

# A header walk that takes longer is stopped (a crafted header can hold millions of keys);
# such a file is reported as unchecked, not as broken.
CHECK_SECONDS: Final = 2.0


def model_file_problem(spec: ModelSpec, *, time_limit: float = CHECK_SECONDS) -> str | None:
    """What is wrong with ``spec``'s model file, or None when it reads as a GGUF (or it has
    none yet: a preset whose file is downloaded before its first load)."""
    given = spec.model_path
    if given is None:
        return None
    path = Path(given)
    if not path.exists():
        # Said already, with the preset's file and line (startup.source_warnings); folder and
        # cache models are listed from files that exist.
        return None
    # Here, in the check's thread: the header reader imports gguf (and numpy), which the
    # agent does not import at its start (224 ms, measured).
    from node_agent.memory.gguf_header import GgufError, read_header

    try:
        read_header(path, time_limit=time_limit)
    except GgufError as exc:
        return f"its model file {given} cannot be loaded: {exc}"
    return None


def check_model_files(
    specs: Iterable[ModelSpec],
    *,
    clock: Callable[[], float] = time.monotonic,
    pause: Callable[[float], object] | None = None,
    stop: threading.Event | None = None,
) -> list[str]:
    """One warning per model whose file is broken; blocking (run it in a thread).

    After each file it pauses as long as that file's walk took. The walk is Python holding the
    GIL, which the event loop needs to answer anyone: with 1,000 models (bench S6) the check
    ran a second or two at start, and every GET /models meanwhile took twice as long (47 ms
    against 25 ms without the check, lab). Pausing gives the loop the GIL alone half of the
    time; the check is background work, and takes twice as long instead.

    ``stop`` set: the check ends at its next file, and a pause ends at once (the agent stops:
    the process would wait its thread out)."""
    stop = stop if stop is not None else threading.Event()
    wait = pause if pause is not None else stop.wait
    warnings = []
    for spec in specs:
        if stop.is_set():
            break
        started = clock()
        problem = model_file_problem(spec)
        wait(clock() - started)
        if problem is not None:
            warnings.append(
                f"model {spec.name}: {problem}; loading it will fail until the file is "
                "replaced (download or copy it again)"
            )
    return warnings


async def log_model_file_problems(
    specs: Iterable[ModelSpec], *, clock: Callable[[], float] = time.monotonic
) -> None:
    """:func:`check_model_files` in a thread, logged (the task the agent starts once it
    listens, and after a reload). Cancelled (the agent stops), the check ends at its next
    file: a thread left walking and pausing kept the process from exiting (asyncio.run waits
    for it), for as long again as its walks."""
    stop = threading.Event()
    try:
        warnings = await asyncio.to_thread(check_model_files, list(specs), clock=clock, stop=stop)
    finally:
        stop.set()
    for warning in warnings:
        log.warning("%s", warning)
