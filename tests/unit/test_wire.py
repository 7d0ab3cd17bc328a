"""The proxy's own HTTP/1.1 client (api/wire.py) against a scripted server on loopback: what a
child or a peer may answer, well or badly, and what the pool reuses."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

import pytest

from node_agent.api import wire
from node_agent.api.wire import Pool, Target, Wait, WireError, request_head

pytestmark = pytest.mark.timeout(20)

Script = Callable[[asyncio.StreamReader, asyncio.StreamWriter], "asyncio.Future[None] | object"]


@dataclass
class Upstream:
    """A server that reads each request head (and its body) and plays ``answer`` for it."""

    answers: list[bytes | Callable[[asyncio.StreamWriter], object]] = field(default_factory=list)
    requests: list[bytes] = field(default_factory=list)
    connections: int = 0
    close_after_each: bool = False
    port: int = 0

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n"):
                    if line.lower().startswith(b"content-length:"):
                        length = int(line.split(b":")[1])
                self.requests.append(head + await reader.readexactly(length))
                answer = self.answers.pop(0)
                if callable(answer):
                    result = answer(writer)
                    if asyncio.iscoroutine(result):
                        await result
                else:
                    writer.write(answer)
                    await writer.drain()
                if self.close_after_each:
                    break
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()


@pytest.fixture
async def upstream() -> AsyncIterator[Upstream]:
    server_side = Upstream()
    server = await asyncio.start_server(server_side.handle, "127.0.0.1", 0)
    server_side.port = server.sockets[0].getsockname()[1]
    async with server:
        yield server_side


def pool_of(upstream: Upstream, read_timeout: float = 5.0) -> Pool:
    return Pool(Target("127.0.0.1", upstream.port), read_timeout)


def get(path: str = "/x") -> bytes:
    return request_head("GET", path, "127.0.0.1:1", [], None)


def sized(body: bytes, *extra: str) -> bytes:
    head = "".join(f"{h}\r\n" for h in extra)
    return b"HTTP/1.1 200 OK\r\n%sContent-Length: %d\r\n\r\n%s" % (head.encode(), len(body), body)


def chunked(*pieces: bytes, end: bool = True) -> bytes:
    body = b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in pieces)
    head = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
    head += b"Transfer-Encoding: chunked\r\n\r\n"
    return head + body + (b"0\r\n\r\n" if end else b"")


async def ask(pool: Pool, head: bytes | None = None) -> tuple[wire.Connection, wire.Answer]:
    conn = await pool.connection()
    conn.send(head or get(), None)
    return conn, await conn.answer()


async def test_an_answer_with_a_length_is_read_whole_and_its_connection_reused(
    upstream: Upstream,
) -> None:
    upstream.answers = [sized(b'{"a":1}', "X-Child: yes"), sized(b"second")]
    pool = pool_of(upstream)
    conn, answer = await ask(pool)
    assert (answer.status, answer.length) == (200, 7)
    assert ("X-Child", "yes") in answer.headers
    assert await conn.body() == b'{"a":1}'
    conn.finish()
    assert pool.statistics() == wire.PoolStatistics(idle=1, busy=0)
    again, _ = await ask(pool)
    assert again is conn and again.reused
    assert await again.body() == b"second"
    again.finish()
    assert upstream.connections == 1


async def test_a_chunked_answer_goes_to_the_sink_as_read_and_is_never_reused(
    upstream: Upstream,
) -> None:
    async def events(writer: asyncio.StreamWriter) -> None:
        writer.write(chunked(b"data: 1\n\n", end=False))
        await writer.drain()
        await asyncio.sleep(0.05)
        writer.write(b"9\r\ndata: 2\n\n\r\n0\r\n\r\n")
        await writer.drain()

    upstream.answers = [events]
    pool = pool_of(upstream)
    conn, answer = await ask(pool)
    assert answer.length is None
    got: list[bytes] = []
    conn.stream(lambda data: got.append(data) or True)
    assert await conn.wait() is Wait.DONE
    assert got == [b"data: 1\n\n", b"data: 2\n\n"]
    conn.finish()
    await asyncio.sleep(0.01)
    assert pool.empty()  # closed, not idle


async def test_a_sink_that_asks_for_a_pause_stops_the_reading_until_resumed(
    upstream: Upstream,
) -> None:
    async def events(writer: asyncio.StreamWriter) -> None:
        writer.write(chunked(b"data: 0\n\n", end=False))
        for i in (1, 2):
            await writer.drain()
            await asyncio.sleep(0.05)
            writer.write(b"9\r\ndata: %d\n\n\r\n" % i)
        writer.write(b"0\r\n\r\n")

    upstream.answers = [events]
    conn, _ = await ask(pool_of(upstream))
    got: list[bytes] = []
    conn.stream(lambda data: got.append(data) or False)  # "full" after every read
    assert await conn.wait() is Wait.PAUSED
    assert got == [b"data: 0\n\n"]
    await asyncio.sleep(0.2)  # the rest has been sent meanwhile
    assert got == [b"data: 0\n\n"]  # and not read
    while True:
        conn.resume()
        if await conn.wait() is Wait.DONE:
            break
    assert b"".join(got) == b"data: 0\n\ndata: 1\n\ndata: 2\n\n"
    conn.finish()


async def test_a_status_line_and_headers_past_the_bound_are_refused(upstream: Upstream) -> None:
    long = "X-Pad: " + "a" * 1000
    upstream.answers = [sized(b"x", *([long] * 70))]  # 70 KB of headers
    pool = pool_of(upstream)
    conn = await pool.connection()
    conn.send(get(), None)
    with pytest.raises(WireError, match=f"longer than {wire.MAX_HEAD} bytes"):
        await conn.answer()


async def test_too_many_headers_are_refused(upstream: Upstream) -> None:
    upstream.answers = [sized(b"x", *(f"X-{i}: y" for i in range(wire.MAX_HEADERS + 1)))]
    conn = await pool_of(upstream).connection()
    conn.send(get(), None)
    with pytest.raises(WireError, match="more than 100 headers"):
        await conn.answer()


@pytest.mark.parametrize(
    "answer",
    [
        b"HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nContent-Length: 1x\r\n\r\n",
        b"HTTP/1.1 2000 OK\r\n\r\n",
        b"NOT HTTP\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
    ],
)
async def test_a_malformed_answer_is_an_error_not_a_hang(upstream: Upstream, answer: bytes) -> None:
    upstream.answers = [answer]
    conn = await pool_of(upstream).connection()
    conn.send(get(), None)
    with pytest.raises(WireError, match="malformed answer"):
        await conn.answer()
        await conn.body()


async def test_an_interim_answer_is_skipped_for_the_real_one(upstream: Upstream) -> None:
    upstream.answers = [b"HTTP/1.1 100 Continue\r\n\r\n" + sized(b"real")]
    conn, answer = await ask(pool_of(upstream))
    assert answer.status == 200
    assert await conn.body() == b"real"


async def test_an_answer_that_ends_with_its_connection_is_whole(upstream: Upstream) -> None:
    upstream.answers = [b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\nall of it"]
    upstream.close_after_each = True
    conn, answer = await ask(pool_of(upstream))
    assert answer.length is None
    got: list[bytes] = []
    conn.stream(lambda data: got.append(data) or True)
    assert await conn.wait() is Wait.DONE
    assert b"".join(got) == b"all of it"


async def test_a_stream_cut_mid_body_is_an_error(upstream: Upstream) -> None:
    upstream.answers = [chunked(b"data: 1\n\n", end=False)]
    upstream.close_after_each = True
    conn, _ = await ask(pool_of(upstream))
    conn.stream(lambda data: True)
    with pytest.raises(WireError, match="Server disconnected") as caught:
        await conn.wait()
    assert not caught.value.retry  # it had answered: nothing may be sent again


async def test_a_silent_upstream_is_stalled_after_the_read_timeout(upstream: Upstream) -> None:
    async def silence(writer: asyncio.StreamWriter) -> None:
        await asyncio.sleep(5)

    upstream.answers = [silence]
    conn = await pool_of(upstream, read_timeout=0.2).connection()
    conn.send(get(), None)
    with pytest.raises(WireError, match=r"no answer within 0\.2s") as caught:
        await conn.answer()
    assert caught.value.stalled


async def test_a_reused_connection_closed_before_answering_may_be_retried(
    upstream: Upstream,
) -> None:
    upstream.answers = [sized(b"one")]
    upstream.close_after_each = True  # as a child whose keep-alive timed out just then
    pool = pool_of(upstream)
    conn, _ = await ask(pool)
    await conn.body()
    conn.finish()
    again = await pool.connection()
    assert again is conn or not again.reused  # the close may already have been seen
    if again is conn:
        again.send(get(), None)
        with pytest.raises(WireError) as caught:
            await again.answer()
        assert caught.value.retry


async def test_a_head_answer_has_no_body_whatever_its_length(upstream: Upstream) -> None:
    upstream.answers = [b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n"]
    conn = await pool_of(upstream).connection()
    conn.send(request_head("HEAD", "/x", "h", [], None), None, head_only=True)
    assert (await conn.answer()).length == 100
    assert await conn.body() == b""


async def test_an_idle_connection_past_the_reuse_age_is_not_reused(upstream: Upstream) -> None:
    upstream.answers = [sized(b"1"), sized(b"2")]
    pool = pool_of(upstream)
    conn, _ = await ask(pool)
    await conn.body()
    conn.finish()
    conn.idle_since -= wire.IDLE_REUSE  # as if it had waited that long
    fresh, _ = await ask(pool)
    assert fresh is not conn and not fresh.reused
    assert await fresh.body() == b"2"


async def test_a_retired_pool_closes_idle_connections_at_once_and_busy_ones_when_done(
    upstream: Upstream,
) -> None:
    upstream.answers = [sized(b"1"), sized(b"2")]
    pool = pool_of(upstream)
    idle, _ = await ask(pool)
    await idle.body()
    idle.finish()
    busy, _ = await ask(pool)
    pool.retire()
    await asyncio.sleep(0.01)
    assert pool.statistics() == wire.PoolStatistics(idle=0, busy=1)
    assert await busy.body() == b"2"  # a request under way is not cut
    busy.finish()
    await asyncio.sleep(0.01)
    assert pool.empty()


@pytest.mark.parametrize("when", ["with the answer", "while idle"])
async def test_bytes_that_answer_no_request_end_the_connection(
    upstream: Upstream, when: str
) -> None:
    """A pooled connection holding bytes nobody asked for would hand them to the next request
    as its answer."""

    async def answer_and_more(writer: asyncio.StreamWriter) -> None:
        if when == "with the answer":
            writer.write(sized(b"1") + sized(b"unasked"))
        else:
            writer.write(sized(b"1"))
            await writer.drain()
            await asyncio.sleep(0.1)
            writer.write(sized(b"unasked"))

    upstream.answers = [answer_and_more, sized(b"2")]
    pool = pool_of(upstream)
    conn, _ = await ask(pool)
    assert await conn.body() == b"1"
    await asyncio.sleep(0.05 if when == "with the answer" else 0)
    conn.finish()
    await asyncio.sleep(0.2)
    assert pool.empty()
    fresh, _ = await ask(pool)
    assert fresh is not conn
    assert await fresh.body() == b"2"


async def test_nothing_listening_is_an_error_naming_the_target() -> None:
    pool = Pool(Target("127.0.0.1", 1), 5.0)
    with pytest.raises(WireError, match=r"Cannot connect to 127\.0\.0\.1:1"):
        await pool.connection()


def test_the_request_head_names_the_host_and_the_bodys_length() -> None:
    head = request_head("POST", "/v1/chat?x=1", "127.0.0.1:9", [("X-A", "b")], b"{}")
    assert head == (
        b"POST /v1/chat?x=1 HTTP/1.1\r\nHost: 127.0.0.1:9\r\nX-A: b\r\nContent-Length: 2\r\n\r\n"
    )
    assert b"Content-Length" not in request_head("GET", "/", "h", [], None)
    assert b"Content-Length: 0" in request_head("POST", "/", "h", [], None)


async def test_a_large_body_goes_out_whole_after_its_head(upstream: Upstream) -> None:
    body = bytes(range(256)) * 4096  # 1 MiB
    upstream.answers = [sized(b"ok")]
    conn = await pool_of(upstream).connection()
    conn.send(request_head("POST", "/upload", "h", [], body), body)
    assert await conn.body() == b"ok"
    head, sent = upstream.requests[0].split(b"\r\n\r\n", 1)
    assert b"Content-Length: 1048576" in head and sent == body


@pytest.mark.parametrize(
    ("target", "headers"),
    [
        ("/x", [("X-A", "b\r\nX-Injected: 1")]),
        ("/x", [("X-A", "b\nc")]),
        ("/x", [("X-A\r\n", "b")]),
        ("/x y", []),
        ("/x\x00", []),
    ],
)
def test_a_line_break_or_a_space_cannot_split_the_request(
    target: str, headers: list[tuple[str, str]]
) -> None:
    with pytest.raises(ValueError, match=r"line break|space or a control"):
        request_head("GET", target, "h", headers, None)


# -- found in review


async def test_one_endless_header_is_refused_at_the_head_bound_not_kept_whole(
    upstream: Upstream,
) -> None:
    """MAX_HEAD is counted in ``on_header``, which httptools calls only once a header is
    whole: a header that never ends is accumulated (``bytes +=``) without bound, and the
    stall timer never fires while bytes keep coming."""

    async def endless_header(writer: asyncio.StreamWriter) -> None:
        writer.write(b"HTTP/1.1 200 OK\r\nX-Pad: ")
        for _ in range(64):  # 4 MiB, 64 times MAX_HEAD, and never a line end
            writer.write(b"a" * 65536)
            await writer.drain()
        # (Upstream.handle then waits for a next request: the connection stays open.)

    upstream.answers = [endless_header]
    conn = await pool_of(upstream, read_timeout=10.0).connection()
    conn.send(get(), None)
    try:
        with pytest.raises(WireError, match=f"longer than {wire.MAX_HEAD} bytes"):
            await asyncio.wait_for(conn.answer(), 3.0)
    finally:
        conn.close()


async def test_the_last_piece_of_a_stream_reaches_the_sink_when_bytes_follow_the_answer(
    upstream: Upstream,
) -> None:
    """Bytes after a complete answer in the same read raise in ``on_message_begin``;
    ``data_received`` then returns before ``_hand_on``, so the answer's last piece (here its
    only event, in a real stream ``data: [DONE]``) never reaches the sink, and ``wait()``
    still says DONE: a silently truncated stream."""

    async def answer_then_junk(writer: asyncio.StreamWriter) -> None:
        writer.write(chunked(end=False))
        await writer.drain()
        await asyncio.sleep(0.1)  # the sink is in place by now
        writer.write(b"9\r\ndata: 1\n\n\r\n0\r\n\r\nHTTP/1.1 200 OK\r\n")
        await writer.drain()

    upstream.answers = [answer_then_junk]
    conn, _ = await ask(pool_of(upstream))
    got: list[bytes] = []
    conn.stream(lambda data: got.append(data) or True)
    assert await conn.wait() is Wait.DONE
    conn.finish()
    assert b"".join(got) == b"data: 1\n\n"
