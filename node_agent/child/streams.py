"""Reading a child's pipes line by line, and asking it for ``/health``.

``StreamReader.readline`` raises on a line longer than its buffer limit; a child's stderr is
not ours to bound, so lines are split here and an overlong one comes out in pieces.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import os
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import IO, Final

import aiohttp

from node_agent.event_loop import running_asyncio_loop

MAX_LINE: Final = 64 * 1024
_CHUNK: Final = 64 * 1024
# A read smaller than this is a trickle (llama-server writes ~9 lines, ~1 KB, a request): the
# reader gathers before the next. A flood's reads are larger however the loop cuts them:
# asyncio's are whole chunks, uvloop's what the pipe held at that instant (28-64 KB seen with
# 64 KB lines); pausing after those held a flood to a pipe's worth per pause (issue 30).
TRICKLE: Final = 8 * 1024
# A read this large: the writer is busy (after a pause, the pipe's 64 KB came near full and
# the writer may have waited for it).
BUSY: Final = 32 * 1024


class LogPace:
    """Whether the reader of a child's log gathers after a read, pausing the pipe for
    ``window`` seconds: after a trickle (the lines written meanwhile then come in one read),
    unless the writer is busy. Busy: from a read of :data:`BUSY` bytes, for as long as each
    ``window`` brings that much; meanwhile each read is taken as it comes. So a writer of more
    than a pipe's worth a window waits once, at the pause before it was found busy, not at
    every pause (a steady 1 MB/s in 1 KB lines was held back ~0.19 s of every 0.25 s)."""

    def __init__(self, window: float) -> None:
        self._window = window
        self._busy_until: float | None = None
        self._busy_bytes = 0  # read in the current busy window

    def gathers_after(self, size: int, now: float) -> bool:
        if self._busy_until is not None:
            self._busy_bytes += size
            if now < self._busy_until:
                return False
            still_busy = self._busy_bytes >= BUSY
            self._busy_until = now + self._window if still_busy else None
            self._busy_bytes = 0
            if still_busy:
                return False
        elif size >= BUSY:
            self._busy_until = now + self._window
            return False
        return size < TRICKLE


@contextlib.asynccontextmanager
async def pipe_stream(
    pipe: IO[bytes],
) -> AsyncIterator[tuple[asyncio.StreamReader, asyncio.ReadTransport]]:
    """The read end of a pipe as a stream, with its transport (which can pause it); the pipe
    is closed on leaving, read to its end or not."""
    loop = asyncio.get_running_loop()
    stream = asyncio.StreamReader()
    # asyncio's transport closes the file it is given. uvloop's hands the descriptor to libuv,
    # which closes it, and then closes the file too: the same number twice, the second time
    # perhaps another thread's by then (uvloop issue 763). libuv gets a copy of its own.
    handed = pipe
    if not running_asyncio_loop():
        handed = io.FileIO(os.dup(pipe.fileno()), "rb", closefd=False)
    try:
        transport, _ = await loop.connect_read_pipe(
            lambda: asyncio.StreamReaderProtocol(stream), handed
        )
        try:
            yield stream, transport
        finally:
            transport.close()
    finally:
        pipe.close()


async def read_lines(
    stream: asyncio.StreamReader, gather: Callable[[int], Awaitable[None]] | None = None
) -> AsyncIterator[str]:
    """Yield decoded lines (without line endings) until EOF.

    Decoded with ``errors='replace'``: llama-server's stderr can hold bytes that are not UTF-8
    (a model's raw token pieces), and one bad byte must not end the stream.

    ``gather``: awaited after each read with its size, once its lines are out: it may wait
    (:class:`LogPace` says when), so that the lines written meanwhile come in one read.
    """
    pending = b""
    while True:
        chunk = await stream.read(_CHUNK)
        if not chunk:
            break
        pending += chunk
        *lines, pending = pending.split(b"\n")
        for line in lines:
            yield line.rstrip(b"\r").decode(errors="replace")
        while len(pending) > MAX_LINE:
            yield pending[:MAX_LINE].decode(errors="replace")
            pending = pending[MAX_LINE:]
        if gather is not None:
            await gather(len(chunk))
    if pending:
        yield pending.rstrip(b"\r").decode(errors="replace")


async def health_status(
    session: aiohttp.ClientSession, host: str, port: int, *, limit: float = 1.0
) -> int | None:
    """The status of ``GET /health``, or None when nothing answered (refused, reset, timeout)."""
    try:
        async with session.get(
            f"http://{host}:{port}/health", timeout=aiohttp.ClientTimeout(total=limit)
        ) as response:
            return response.status
    except (aiohttp.ClientError, TimeoutError, OSError):
        return None


def health_session() -> aiohttp.ClientSession:
    """A session for polling one child.

    ``force_close``: an idle keep-alive connection would pin one of llama-server's few HTTP
    threads for as long as it stays open.
    """
    return aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True))


async def watch_health(
    session: aiohttp.ClientSession,
    host: str,
    port: int,
    report: Callable[[int], None],
    *,
    first_delay: float,
    max_delay: float,
) -> None:
    """Report each change of the ``/health`` status, with backoff, until it answers 200.

    Nothing is reported while nothing answers (the child has not bound its port yet).
    """
    last: int | None = None
    delay = first_delay
    while True:
        status = await health_status(session, host, port)
        if status is not None and status != last:
            last = status
            report(status)
            if status == 200:
                return
        await asyncio.sleep(delay)
        delay = min(delay * 1.5, max_delay)
