"""HTTP/1.1 towards a child or a peer agent: the proxy's own client (issue 30).

aiohttp's client cost the agent about 0.3 ms of CPU per proxied request, and each streamed
event woke a task to carry it on. Measured side by side behind the same aiohttp server, with a
child played by a paced script: 100-104 µs of the agent's CPU per streamed event with aiohttp's
client, 46-53 µs with this one; 0.41-0.52 ms against 0.21-0.27 ms per request with a length.
Here llhttp (the ``httptools`` binding) parses the answer, and a streamed body is handed to a
*sink* from the protocol's callbacks: no task runs per event.

One request per connection at a time. A connection goes back to its pool only after an answer
with a length (llama-server closes its socket after a chunked answer without saying so, and a
request sent on it in that moment failed), and is reused only while idle less than
:data:`IDLE_REUSE`. Everything the other side sends is bounded before it is kept: the status
line, headers and chunk framing by :data:`MAX_HEAD`, a streamed body by the sink's own
back-pressure.
"""

from __future__ import annotations

import asyncio
import enum
import functools
import logging
import select
import socket
import ssl
import struct
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import cast

import httptools

from node_agent.core import stream_pace
from node_agent.core.stream_pace import StreamPace

log = logging.getLogger(__name__)

# llama-server closes a keep-alive connection idle for 5 s (measured with the pinned binary).
# A pooled connection reused just as the child closes it fails with "Server disconnected"
# (aiohttp#2682; the soak hit it: a 502 for a healthy model), so ours never idle that long.
IDLE_REUSE = 2.0
CONNECT_TIMEOUT = 10.0
# A child's status line and headers are a few hundred bytes, a chunk's size line a few: more
# than this read in a row without a piece of body is no answer of theirs.
MAX_HEAD = 64 * 1024
MAX_HEADERS = 100
_JOIN_UP_TO = 64 * 1024  # a body up to this size goes out in one write with its head
# While a stream gathers (core/stream_pace.py), its socket wakes the loop only once this much
# waits in it, or the other side closes: a read is bounded by size, not by event. Linux wakes
# a waiting reader when the mark is lowered again (the end of a gathering). (The mark also
# caps the connection's TCP window at it: no matter for a stream of events.)
GATHER_MARK = 64 * 1024


@functools.cache
def lowered_mark_wakes() -> bool:
    """Whether this kernel holds a socket's reader until its mark is reached, and wakes it as
    soon as the mark is lowered below what waits (tried once, on loopback, with epoll as the
    loops use it; well under a millisecond). Linux 6.x does; an old kernel, or a look-alike
    such as a sandbox's, may not, and a gathering there would last until the child's next
    write."""
    try:
        with (
            socket.create_server(("127.0.0.1", 0)) as server,
            socket.create_connection(server.getsockname()[:2], timeout=1.0) as writer,
            server.accept()[0] as reader,
            select.epoll() as poller,
        ):
            reader.setsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT, GATHER_MARK)
            poller.register(reader.fileno(), select.EPOLLIN)
            writer.sendall(b"x")
            deadline = time.monotonic() + 1.0
            while _waiting(reader) < 1 and time.monotonic() < deadline:
                time.sleep(0.001)  # (loopback delivers within the send: not seen looping)
            if _waiting(reader) < 1 or poller.poll(0):
                return False  # lost, or a reader woken below its mark: nothing would gather
            reader.setsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT, 1)
            return bool(poller.poll(0))
    except (OSError, AttributeError):  # no loopback, or no epoll
        return False


def _waiting(sock: socket.socket) -> int:
    """Bytes in ``sock``'s receive queue."""
    import fcntl  # (Unix only: imported where the probe runs)
    import termios

    (count,) = struct.unpack("i", fcntl.ioctl(sock.fileno(), termios.FIONREAD, b"\0" * 4))
    return int(count)


def gather_window(requested: float) -> float:
    """The ``--stream-gather`` window this machine can keep: ``requested``, or 0 (said in the
    log) when its kernel does not wake a reader as :func:`lowered_mark_wakes` needs."""
    if requested <= 0 or lowered_mark_wakes():
        return requested
    log.warning(
        "--stream-gather %gs: this kernel does not wake a socket's reader when its low mark is "
        "lowered; each stream is read as it comes (--stream-gather 0 skips this check)",
        requested,
    )
    return 0.0


# Methods sent without a body get no Content-Length (as aiohttp's client sends them).
_BODILESS = frozenset(("GET", "HEAD", "OPTIONS", "CONNECT", "TRACE"))

# A sink takes each piece of a streamed body as it is read; False: stop reading until
# :meth:`Connection.resume` (the client's buffer is full, or the client is gone).
Sink = Callable[[bytes], bool]


class WireError(Exception):
    """The other side did not answer, or stopped mid-answer. ``stalled``: it said nothing for
    the read timeout; ``retry``: it closed a reused connection before answering anything
    (nothing was done: the request may be sent once more)."""

    def __init__(self, message: str, *, stalled: bool = False, retry: bool = False) -> None:
        super().__init__(message)
        self.stalled = stalled
        self.retry = retry


@dataclass(frozen=True)
class Target:
    """Where requests go: a child on loopback, or a peer agent (over TLS when ``tls``)."""

    host: str
    port: int
    tls: ssl.SSLContext | None = None
    server_hostname: str | None = None  # the name a peer's certificate is checked against

    @property
    def authority(self) -> str:
        """The ``Host`` header's value: an IPv6 address in brackets, the scheme's own port
        left out (RFC 9110 §7.2)."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return host if self.port == (443 if self.tls else 80) else f"{host}:{self.port}"


@dataclass(frozen=True)
class Answer:
    status: int
    headers: list[tuple[str, str]]
    length: int | None  # Content-Length; None: chunked or until the connection closes


class Wait(enum.Enum):
    """Why :meth:`Connection.wait` returned."""

    DONE = "done"  # the whole body was read
    PAUSED = "paused"  # the sink asked to stop reading


class _Failed(Exception):
    """Raised inside a parser callback to stop parsing (httptools re-raises it as context)."""


def request_head(
    method: str, target: str, host: str, headers: list[tuple[str, str]], body: bytes | None
) -> bytes:
    """The request line and headers, ``Host`` and the body's length added. ``headers`` are the
    client's own (aiohttp's parser let no CR or LF into them) and the agent's: a name or value
    with a line break would split the request, so it is refused all the same."""
    if " " in target or not target.isprintable():
        raise ValueError("a request target with a space or a control character")
    lines = [f"{method} {target} HTTP/1.1", f"Host: {host}"]
    lines += [f"{name}: {value}" for name, value in headers]
    if body is not None or method not in _BODILESS:
        lines.append(f"Content-Length: {len(body or b'')}")
    if any("\r" in line or "\n" in line for line in lines):
        raise ValueError("a header with a line break cannot be forwarded")
    head = "\r\n".join(lines)
    return head.encode("utf-8", "surrogateescape") + b"\r\n\r\n"


class Connection(asyncio.Protocol):
    """One connection and the answer to the request on it; see the module's docstring."""

    def __init__(self, pool: Pool, read_timeout: float, gather: float) -> None:
        self._pool = pool
        self._loop = asyncio.get_running_loop()
        self._read_timeout = read_timeout
        self._gather = gather
        self._transport: asyncio.Transport | None = None
        self._socket: socket.socket | None = None
        self._parser = httptools.HttpResponseParser(self)
        self.reused = False
        self.idle_since = 0.0
        self._reset()

    def _reset(self) -> None:
        self._framing = 0  # bytes read since the last piece of body: the head, chunk sizes
        self._head_size = 0  # the headers' (and trailers') bytes
        self._headers: list[tuple[str, str]] = []
        self._answer: Answer | None = None
        self._interim = False  # a 1xx answer before the real one
        self._pieces: list[bytes] = []  # body read and not yet handed on
        self._sink: Sink | None = None
        self._paused = False
        self._done = False
        self._keep_alive = False
        self._error: WireError | None = None
        self._waiter: asyncio.Future[None] | None = None
        self._heard = False  # any byte of the answer came
        self._last_read = 0.0
        self._timer: asyncio.TimerHandle | None = None
        self._pace: StreamPace | None = None
        self._release: asyncio.TimerHandle | None = None  # a gathering's end
        self._head_only = False
        self._sent = False  # a request is out: bytes before that are no answer to anything

    # -- asyncio.Protocol -------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports are not asyncio.Transport subclasses, but are ones.
        self._transport = cast(asyncio.Transport, transport)
        # Only a plain TCP socket's own mark tells when to wake (not TLS's records).
        if stream_pace.SUPPORTED and self._gather > 0 and self._pool.target.tls is None:
            self._socket = transport.get_extra_info("socket")

    def data_received(self, data: bytes) -> None:
        self._heard = True
        self._last_read = self._loop.time()
        if not self._sent:
            self._fail(WireError("it sent an answer to no request"))
            return
        if self._done or self._error is not None:
            self._keep_alive = False  # bytes after the answer: no later answer can be trusted
            return
        self._framing += len(data)
        error: WireError | None = None
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            error = WireError("it switched protocols on a plain request")
        except httptools.HttpParserError as exc:
            reason = exc.__context__ if isinstance(exc.__context__, _Failed) else exc
            error = WireError(f"a malformed answer: {reason}")
        if self._pieces and self._sink is not None:
            self._hand_on()  # what came before an error too: the answer's last piece
        if error is None and self._framing > MAX_HEAD and not self._done:
            # llhttp keeps a header (or a trailer, a chunk's size line) until its line ends.
            error = WireError(f"headers or framing longer than {MAX_HEAD} bytes")
        if error is not None:
            self._fail(error)

    def connection_lost(self, exc: Exception | None) -> None:
        self._transport = None
        self._pool.forget(self)
        if self._done:
            return
        if (
            exc is None
            and self._answer is not None
            and self._answer.length is None
            and not self._chunked()
        ):
            self._done = True  # an answer that ends where its connection does (not a reset)
            self._wake()
            return
        text = "Server disconnected" if exc is None else f"Server disconnected: {exc}"
        self._fail(WireError(text, retry=self.reused and not self._heard))

    # -- the parser's callbacks ---------------------------------------------------------------

    def on_message_begin(self) -> None:
        if self._done:  # a second answer in the same read as the first
            self._keep_alive = False
            raise _Failed("a second answer to one request")

    def on_header(self, name: bytes, value: bytes) -> None:
        # Counted whole here, and in data_received while one is still coming.
        self._head_size += len(name) + len(value) + 4
        if self._head_size > MAX_HEAD:
            raise _Failed(f"headers longer than {MAX_HEAD} bytes")
        if len(self._headers) >= MAX_HEADERS:
            raise _Failed(f"more than {MAX_HEADERS} headers")
        self._headers.append((name.decode("latin-1"), value.decode("latin-1")))

    def on_headers_complete(self) -> None:
        status = self._parser.get_status_code()
        if 100 <= status < 200:
            self._interim = True  # 100 Continue, 103 Early Hints: the real answer follows
            return
        length = next((v for k, v in self._headers if k.lower() == "content-length"), None)
        if length is not None and not length.strip().isdigit():
            raise _Failed(f"Content-Length {length[:40]!r}")
        self._answer = Answer(status, self._headers, int(length) if length is not None else None)
        self._headers = []  # (a trailer after the body goes here, not into the answer)
        if self._head_only:  # a HEAD answer names a length but has no body
            self._done = True
        self._wake()

    def on_body(self, body: bytes) -> None:
        self._framing = 0  # what this read held before the piece was the piece's framing
        self._pieces.append(body)

    def on_message_complete(self) -> None:
        if self._interim:
            self._interim = False
            self._headers, self._head_size = [], 0
            return
        self._done = True
        # Asked now: llhttp forgets it once the message's read is over.
        self._keep_alive = self._parser.should_keep_alive()
        self._wake()  # the waiter runs after this read's pieces were handed on

    # -- the proxy's side ----------------------------------------------------------------------

    def send(self, head: bytes, body: bytes | None, *, head_only: bool = False) -> None:
        """Send one request (``head_only``: a HEAD, whose answer has no body)."""
        assert self._transport is not None
        self._head_only = head_only
        self._sent = True
        if body and len(body) > _JOIN_UP_TO:
            self._transport.writelines((head, body))  # an upload is not copied once more
        else:
            self._transport.write(head + body if body else head)  # one segment
        self._last_read = self._loop.time()
        self._timer = self._loop.call_later(self._read_timeout, self._check_stall)

    async def answer(self) -> Answer:
        """The status and headers, once they came."""
        while self._answer is None:
            await self._wait_change()
        return self._answer

    async def body(self) -> bytes:
        """The whole body (an answer with a length: the proxy answers it in one piece)."""
        while not self._done:
            await self._wait_change()
        body = b"".join(self._pieces)
        self._pieces = []
        return body

    def stream(self, sink: Sink) -> None:
        """Hand the body on to ``sink`` from now on: what was read already, at once. A fast
        stream gathers (core/stream_pace.py) when the connection was made with a window."""
        self._sink = sink
        if self._socket is not None:
            self._pace = StreamPace(self._gather)
        if self._pieces:
            self._hand_on()

    async def wait(self) -> Wait:
        """Until the body has been handed on whole, or the sink asked for a pause."""
        while not self._done and not self._paused:
            await self._wait_change()
        return Wait.DONE if self._done else Wait.PAUSED

    def resume(self) -> None:
        self._paused = False
        self._last_read = self._loop.time()  # the pause was the client's, not the child's
        if self._transport is not None:
            self._transport.resume_reading()

    def finish(self) -> None:
        """Done with the answer: back to the pool when the connection may carry another
        request, else closed."""
        self._cancel_timer()
        self._end_gathering()
        reusable = (
            self._done
            and self._transport is not None
            and not self._head_only
            and self._answer is not None
            and self._answer.length is not None
            and self._keep_alive
        )
        if reusable:
            self._reset()
            self._pool.put_back(self)
        else:
            self.close()

    def close(self) -> None:
        """Drop the connection now (a child stops generating for a client that is gone)."""
        self._cancel_timer()
        self._end_gathering()
        if self._transport is not None:
            self._transport.abort()

    # -- internals -------------------------------------------------------------------------------

    def _chunked(self) -> bool:
        assert self._answer is not None
        return any(
            k.lower() == "transfer-encoding" and "chunked" in v.lower()
            for k, v in self._answer.headers
        )

    def _hand_on(self) -> None:
        assert self._sink is not None
        pieces = self._pieces
        data = pieces[0] if len(pieces) == 1 else b"".join(pieces)
        self._pieces = []
        if not self._sink(data) and not self._done:
            self._paused = True
            if self._transport is not None:
                self._transport.pause_reading()
            self._wake()
        elif (
            self._pace is not None
            and not self._done
            and self._transport is not None
            and self._pace.read(time.monotonic(), len(pieces))
        ):
            self._set_mark(GATHER_MARK)
            self._release = self._loop.call_later(self._pace.window, self._end_gathering)

    def _end_gathering(self) -> None:
        """The window is over (or the answer): the socket wakes the loop for any byte again,
        at once if some wait (Linux signals a lowered mark)."""
        if self._release is None:
            return
        self._release.cancel()  # (a no-op when it is what runs)
        self._release = None
        if self._pace is not None:  # (not the loop's clock: uvloop's counts whole milliseconds)
            self._pace.released(time.monotonic())
        if self._transport is not None:
            self._set_mark(1)

    def _set_mark(self, size: int) -> None:
        """Called only while the transport is there: both loops close the socket after
        connection_lost (which drops the transport), so the number names this socket still."""
        assert self._socket is not None
        self._socket.setsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT, size)

    def _fail(self, error: WireError) -> None:
        if self._error is None and not self._done:
            self._error = error
            self.close()
            self._wake()

    def _check_stall(self) -> None:
        """Every read timeout, not per read: a timer made and cancelled per event is the kind
        of per-event work this module is here to avoid."""
        idle = self._loop.time() - self._last_read
        if self._done or self._error is not None:
            return
        # The client's pause is no silence of the child's, nor a gathering's unread events.
        waiting = self._paused or self._release is not None
        if idle >= self._read_timeout and not waiting:
            self._fail(WireError(f"no answer within {self._read_timeout:g}s", stalled=True))
            return
        wait = self._read_timeout if waiting else self._read_timeout - idle
        self._timer = self._loop.call_later(wait, self._check_stall)

    def _cancel_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    async def _wait_change(self) -> None:
        if self._error is not None:
            raise self._error
        self._waiter = self._loop.create_future()
        try:
            await self._waiter
        finally:
            self._waiter = None
        if self._error is not None:
            raise self._error

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)


@dataclass(frozen=True)
class PoolStatistics:
    idle: int
    busy: int


class Pool:
    """Connections to one target: the idle ones to reuse, and every open one (to close)."""

    def __init__(self, target: Target, read_timeout: float, gather: float = 0.0) -> None:
        """``gather``: the window of a fast stream's gatherings (core/stream_pace.py); 0:
        every read as it comes."""
        self.target = target
        self._read_timeout = read_timeout
        self._gather = gather
        self._idle: list[Connection] = []
        self._open: set[Connection] = set()
        self._retired = False

    async def connection(self) -> Connection:
        """An idle connection young enough to reuse, else a new one."""
        loop = asyncio.get_running_loop()
        while self._idle:
            conn = self._idle.pop()
            if loop.time() - conn.idle_since < IDLE_REUSE:
                conn.reused = True
                return conn
            conn.close()
        target = self.target
        try:
            async with asyncio.timeout(CONNECT_TIMEOUT):
                _, conn = await loop.create_connection(
                    lambda: Connection(self, self._read_timeout, self._gather),
                    target.host,
                    target.port,
                    ssl=target.tls,
                    server_hostname=(target.server_hostname or target.host) if target.tls else None,
                )
        except TimeoutError:
            raise WireError(f"no connection to {target.host}:{target.port} within "
                            f"{CONNECT_TIMEOUT:g}s") from None  # fmt: skip
        except (OSError, ssl.SSLError) as exc:
            raise WireError(f"Cannot connect to {target.host}:{target.port}: {exc}") from None
        self._open.add(conn)
        return conn

    def put_back(self, conn: Connection) -> None:
        if self._retired:
            conn.close()
            return
        conn.idle_since = asyncio.get_running_loop().time()
        self._idle.append(conn)

    def forget(self, conn: Connection) -> None:
        """``conn`` closed (either side): it is neither open nor idle any more."""
        self._open.discard(conn)
        if conn in self._idle:
            self._idle.remove(conn)

    def retire(self) -> None:
        """No new requests come: the idle connections close now, the busy ones when done."""
        self._retired = True
        for conn in self._idle:
            conn.close()
        self._idle = []

    def close(self) -> None:
        self.retire()
        for conn in list(self._open):
            conn.close()

    def empty(self) -> bool:
        return not self._open

    def statistics(self) -> PoolStatistics:
        return PoolStatistics(idle=len(self._idle), busy=len(self._open) - len(self._idle))
