"""A fast stream gathers its events (core/stream_pace.py, api/wire.py): against a scripted
child on loopback, under asyncio's loop and uvloop's (the agent's default), whose readers
both must wake when the socket's mark is lowered or the child closes."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any
from unittest import mock

import pytest

from node_agent.api import wire
from node_agent.api.wire import Pool, Target, Wait, gather_window, lowered_mark_wakes
from node_agent.core import stream_pace
from node_agent.core.stream_pace import StreamPace
from tests.unit.test_wire import Upstream, ask, chunked

pytestmark = [
    pytest.mark.timeout(20),
    pytest.mark.skipif(not stream_pace.SUPPORTED, reason="gathers on Linux only"),
]


def on_each_loop(test: Callable[[Upstream], Coroutine[Any, Any, None]]) -> Callable[[str], None]:
    """Run ``test`` once on each loop, with a child playing the answers it sets."""

    @pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
    def run(loop: str) -> None:
        factory = asyncio.new_event_loop
        if loop == "uvloop":
            factory = pytest.importorskip("uvloop").new_event_loop

        async def main() -> None:
            child = Upstream(close_after_each=True)
            server = await asyncio.start_server(child.handle, "127.0.0.1", 0)
            child.port = server.sockets[0].getsockname()[1]
            async with server:
                await test(child)

        with asyncio.Runner(loop_factory=factory) as runner:
            runner.run(main())

    run.__name__, run.__doc__ = test.__name__, test.__doc__  # (not wraps: pytest would
    return run  # read the test's own arguments as fixtures)


def event(i: int) -> bytes:
    return b"data: %d\n\n" % i


def framed(*events: bytes) -> bytes:
    return b"".join(b"%x\r\n%s\r\n" % (len(e), e) for e in events)


@dataclass
class Timed:
    """What a sink got, and when (the loop's clock)."""

    pieces: list[tuple[float, bytes]] = field(default_factory=list)
    ended = 0.0  # when the connection said the answer was done

    def __call__(self, data: bytes) -> bool:
        self.pieces.append((asyncio.get_running_loop().time(), data))
        return True

    def when(self, data: bytes) -> float:
        """When the piece that ends ``data`` came."""
        return next(t for t, piece in self.pieces if piece.endswith(data))


def events_with_pauses(
    pauses: list[float], written: dict[bytes, float]
) -> Callable[[asyncio.StreamWriter], Coroutine[Any, Any, None]]:
    """A child's stream: event i, then ``pauses[i]`` seconds; the time each was written goes
    into ``written`` (the end's under the key b"")."""

    async def answer(writer: asyncio.StreamWriter) -> None:
        loop = asyncio.get_running_loop()
        writer.write(chunked(end=False))
        await asyncio.sleep(0.1)  # the sink is in place by now
        for i, pause in enumerate(pauses):
            writer.write(framed(event(i)))
            await writer.drain()
            written[event(i)] = loop.time()
            await asyncio.sleep(pause)
        writer.write(b"0\r\n\r\n")
        await writer.drain()
        written[b""] = loop.time()  # the child closes its side next (Upstream)

    return answer


async def read_stream(upstream: Upstream, read_timeout: float, gather: float) -> Timed:
    """The whole stream the upstream answers, handed to a sink; it ends when it is done."""
    conn, _ = await ask(Pool(Target("127.0.0.1", upstream.port), read_timeout, gather=gather))
    sink = Timed()
    conn.stream(sink)
    assert await asyncio.wait_for(conn.wait(), 5.0) is Wait.DONE
    sink.ended = asyncio.get_running_loop().time()
    conn.finish()
    return sink


@on_each_loop
async def test_a_fast_stream_gathers_its_events_and_its_end_passes_at_once(
    upstream: Upstream,
) -> None:
    """Ten events 5 ms apart, in a 2 s window: one read after the first three (the third piece
    in a window starts the gathering), when the child closes after its last event (as
    llama-server does), not when the window is over."""
    written: dict[bytes, float] = {}
    upstream.answers = [events_with_pauses([0.05, 0.05] + [0.005] * 10, written)]
    sink = await read_stream(upstream, 5.0, gather=2.0)
    got = [piece for _, piece in sink.pieces]
    assert b"".join(got) == b"".join(event(i) for i in range(12))
    assert got[:3] == [event(0), event(1), event(2)]  # the first three as each came
    assert len(got) <= 5, got  # the other nine in one read or two (each its own without)
    assert sink.ended - written[b""] < 1.0  # the end woke the reader: no wait for the window


@on_each_loop
async def test_a_gathering_ends_with_its_window_and_a_slower_stream_is_read_as_it_comes(
    upstream: Upstream,
) -> None:
    written: dict[bytes, float] = {}
    upstream.answers = [events_with_pauses([0.01, 0.01, 0.01, 1.5, 0.0], written)]
    sink = await read_stream(upstream, 5.0, gather=0.5)
    # Event 3 came 10 ms after the third read (the third piece in a window): it waited for
    # the window's end, and was handed on then, long before event 4 was written.
    assert 0.3 <= sink.when(event(3)) - written[event(3)] < 1.4
    # Event 4 came 1.5 s later, slower than the window: at once.
    assert sink.when(event(4)) - written[event(4)] < 0.3


@on_each_loop
async def test_a_gathering_longer_than_the_read_timeout_is_no_stall(upstream: Upstream) -> None:
    """The events a gathering leaves unread are no silence of the child's: a read timeout
    of 0.4 s, a window of 1 s, the last event read only at the stream's end 0.9 s later."""
    upstream.answers = [events_with_pauses([0.01, 0.01, 0.01, 0.9], {})]
    sink = await read_stream(upstream, 0.4, gather=1.0)
    assert b"".join(piece for _, piece in sink.pieces) == b"".join(event(i) for i in range(4))


@on_each_loop
async def test_the_pace_is_timed_finer_than_a_millisecond(upstream: Upstream) -> None:
    """StreamPace takes a read for the one that ends a gathering when it comes within
    AT_RELEASE (1 ms) of the release, and counts a read in a window when it came less than
    the window (10 ms) before: the times it is given must be finer than a millisecond. uvloop's
    loop.time() is libuv's uv_now, whole milliseconds: a read 0.1 ms after a release may read
    as 1 ms after it (``0.001 < AT_RELEASE`` then turns on the float's rounding), and a
    gathering starts at once, the events the child held back for our acknowledgement waiting
    for a second window."""
    stamps: list[float] = []

    class Stamped(StreamPace):
        def read(self, now: float, pieces: int = 1) -> bool:
            stamps.append(now)
            return super().read(now, pieces)

        def released(self, now: float) -> None:
            stamps.append(now)
            super().released(now)

    upstream.answers = [events_with_pauses([0.05, 0.05] + [0.003] * 20, {})]
    with mock.patch.object(wire, "StreamPace", Stamped):
        await read_stream(upstream, 5.0, gather=0.01)
    assert len(stamps) >= 4
    whole_ms = [s for s in stamps if abs(s * 1000 - round(s * 1000)) < 1e-6]
    assert len(whole_ms) < len(stamps), f"every time the pace saw is a whole ms: {stamps}"


def test_this_kernel_wakes_a_reader_when_its_mark_is_lowered() -> None:
    assert lowered_mark_wakes()


def test_a_kernel_that_does_not_wake_a_reader_gathers_nothing_and_says_so(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    probe = mock.Mock(return_value=False)
    monkeypatch.setattr(wire, "lowered_mark_wakes", probe)
    assert gather_window(0.0) == 0.0
    probe.assert_not_called()  # off: nothing to try
    with caplog.at_level(logging.WARNING, logger=wire.__name__):
        assert gather_window(0.01) == 0.0
    assert "--stream-gather 0.01s: this kernel does not wake" in caplog.text
    probe.return_value = True
    assert gather_window(0.01) == 0.01
