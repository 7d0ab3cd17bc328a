"""The child package's small parts: the log ring, the orphan scan (on a fake /proc), ports."""

from __future__ import annotations

import array
import asyncio
import fcntl
import os
import termios
from pathlib import Path
from typing import Any

import pytest

from node_agent.child.logs import LogRing, failure_line
from node_agent.child.orphans import AGENT_PID_ENV, TAG_ENV, find_orphans
from node_agent.child.ports import release_port, reserve_port
from node_agent.child.streams import BUSY, TRICKLE, LogPace
from tests.waiting import until


class TestLogRing:
    def test_keeps_the_last_lines(self) -> None:
        ring = LogRing(3)
        for i in range(5):
            ring.append(f"line {i}")
        assert ring.snapshot() == ["line 2", "line 3", "line 4"]
        assert ring.tail(2) == ["line 3", "line 4"]
        assert ring.tail(0) == [] and ring.tail(10) == ring.snapshot()
        stats = ring.statistics()
        assert (stats.held, stats.appended, stats.capacity) == (3, 5, 3)

    def test_lines_since_skips_what_was_dropped(self) -> None:
        ring = LogRing(2)
        for i in range(4):
            ring.append(str(i))
        assert ring.lines_since(0) == (4, ["2", "3"])
        assert ring.lines_since(3) == (4, ["3"])
        assert ring.lines_since(4) == (4, [])

    def test_lines_are_masked_and_cut_when_read(self) -> None:
        ring = LogRing(4)
        ring.append("GET http://user:pw@host/x?api_key=sekret1234")
        ring.append("x" * 100_000)
        masked, long_line = ring.snapshot()
        assert "pw" not in masked and "sekret1234" not in masked
        assert len(long_line) < 5_000 and "100000" in long_line.replace(",", "")
        assert ring.tail(1) == [long_line] and ring.lines_since(0)[1] == [masked, long_line]

    def test_closed_ring_takes_no_more_lines(self) -> None:
        ring = LogRing(2)
        ring.close()
        ring.append("late")
        assert ring.snapshot() == [] and ring.closed

    def test_capacity_must_be_positive(self) -> None:
        with pytest.raises(ValueError):
            LogRing(0)

    async def test_follow_gives_the_backlog_then_new_lines_until_closed(self) -> None:
        ring = LogRing(10)
        for line in ["old 1", "old 2", "old 3"]:
            ring.append(line)
        seen: list[str] = []

        async def follow() -> None:
            async for line in ring.follow(backlog=2):
                seen.append(line)

        follower = asyncio.create_task(follow())
        await asyncio.sleep(0)
        assert seen == ["old 2", "old 3"]
        ring.append("new 1")
        ring.append("new 2")
        await asyncio.sleep(0)
        assert seen[2:] == ["new 1", "new 2"]
        ring.close()
        await asyncio.wait_for(follower, 1)

    async def test_followers_that_wait_or_lag_each_see_every_line(self) -> None:
        """A follower is woken by the first line after it began waiting, another one that was
        busy elsewhere when lines came reads them without waiting, and neither misses one."""
        ring = LogRing(100)
        seen: dict[str, list[str]] = {"waiting": [], "lagging": []}

        async def follow(name: str, lag: int) -> None:
            async for line in ring.follow():
                seen[name].append(line)
                for _ in range(lag):  # elsewhere while the next lines come
                    await asyncio.sleep(0)

        followers = [
            asyncio.create_task(follow("waiting", 0)),
            asyncio.create_task(follow("lagging", 3)),
        ]
        await asyncio.sleep(0)
        expected = []
        for burst in range(5):
            for i in range(burst + 1):
                expected.append(f"{burst}.{i}")
                ring.append(expected[-1])
            for _ in range(burst):
                await asyncio.sleep(0)
        ring.close()
        await asyncio.wait_for(asyncio.gather(*followers), 1)
        assert seen == {"waiting": expected, "lagging": expected}


class TestFailureLine:
    def test_prefers_the_last_error_line(self) -> None:
        lines = [
            "0.00.002.452 E srv  load_model: failed to load model",
            "0.00.002.461 I srv  operator(): cleaning up before exit...",
            "corral: exited with code 1",
        ]
        assert failure_line(lines, skip_prefix="corral: ") == lines[0]

    def test_skips_the_echoes_that_follow_a_cause(self) -> None:
        # The pinned llama-server on a GGUF that is not one (stderr as measured, abridged).
        cause = "0.00.004.561 E gguf_init_from_reader: invalid magic characters: '?O??'"
        lines = [
            "0.00.004.391 I srv    load_model: loading model 'junk.gguf'",
            cause,
            "0.00.004.566 E llama_model_load: error loading model: llama_model_loader: "
            "failed to load model from junk.gguf",
            "0.00.004.566 E llama_model_load_from_file_impl: failed to load model",
            "0.00.004.568 E cmn  common_init_: failed to load model 'junk.gguf'",
            "0.00.004.570 E srv    load_model: failed to load model, 'junk.gguf'",
            "0.00.004.571 I srv    operator(): operator(): cleaning up before exit...",
            "0.00.004.939 E srv  llama_server: exiting due to model loading error",
        ]
        assert failure_line(lines) == cause

    def test_falls_back_to_the_last_line(self) -> None:
        assert failure_line(["one", "two", "  "]) == "two"
        assert failure_line([]) is None

    def test_a_banner_line_is_never_the_reason(self) -> None:
        # A child killed while loading on an AMX CPU (issue 29): no error line, and the last
        # line is ggml's AMX banner; what it was doing is the line before.
        loading = "0.00.043.966 I srv    load_model: loading model '/models/demo-medium.gguf'"
        lines = [
            "0.00.002.327 I srv  llama_server: initializing ...",
            loading,
            "AMX is not ready to be used!",
            "corral: exited with code -9",
        ]
        assert failure_line(lines, skip_prefix="corral: ") == loading
        assert failure_line(["AMX is not ready to be used!"]) is None


def fake_proc(
    root: Path, pid: int, *, ppid: int, env: dict[str, str] | None, comm: str = "llama-server"
) -> None:
    folder = root / str(pid)
    folder.mkdir()
    # The command name may hold spaces and parentheses; the parser splits after the last ')'.
    (folder / "stat").write_text(f"{pid} ({comm}) S {ppid} {pid} {pid} 0 -1 4194560 0 0\n")
    if env is not None:
        (folder / "environ").write_bytes(
            b"\0".join(f"{k}={v}".encode() for k, v in env.items()) + b"\0"
        )


class TestFindOrphans:
    def test_only_tagged_children_whose_agent_is_not_their_parent(self, tmp_path: Path) -> None:
        me = os.getpid()
        fake_proc(tmp_path, 100, ppid=1, env={TAG_ENV: "t", AGENT_PID_ENV: "50"})  # orphan
        fake_proc(tmp_path, 101, ppid=60, env={TAG_ENV: "t", AGENT_PID_ENV: "60"})  # live agent
        fake_proc(tmp_path, 102, ppid=1, env={TAG_ENV: "other", AGENT_PID_ENV: "50"})
        fake_proc(tmp_path, 103, ppid=1, env=None)  # unreadable or gone
        fake_proc(tmp_path, 104, ppid=1, env={TAG_ENV: "t"}, comm="a (weird) name")  # no pid
        fake_proc(tmp_path, 105, ppid=me, env={TAG_ENV: "t"})  # ours, tagged by hand
        fake_proc(tmp_path, me, ppid=1, env={TAG_ENV: "t", AGENT_PID_ENV: "1"})  # never self
        (tmp_path / "self").mkdir()
        assert find_orphans("t", proc_root=tmp_path) == [100, 104]
        assert find_orphans("other", proc_root=tmp_path) == [102]
        assert find_orphans("none", proc_root=tmp_path) == []


class TestPorts:
    def test_a_reserved_port_is_not_handed_out_twice(self) -> None:
        ports = [reserve_port() for _ in range(5)]
        try:
            assert len(set(ports)) == 5
            assert all(1024 <= port < 65536 for port in ports)
        finally:
            for port in ports:
                release_port(port)
        release_port(None)  # a child that never got a port


async def test_a_childs_log_is_read_in_gathered_pieces_and_at_once_after_its_exit(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The child's stderr is read once per ``LOG_GATHER`` (not once a line): meanwhile what it
    writes waits in the pipe, unread (the loop woke and read once a line before). But a stop
    waits for this reader: once the child has exited, what is left is read at once. (A plain
    pause after each read made every stop 50 ms longer: bench S4's 60 swaps took 5.1 -> 10.0 s.)"""
    from types import SimpleNamespace

    import node_agent.child.process as process

    monkeypatch.setattr(process, "LOG_GATHER", 30.0)
    child: Any = SimpleNamespace(logs=LogRing(10), _bind_failed=False)
    read_end, write_end = os.pipe()
    probe = os.dup(read_end)  # the same pipe: how much of it is still unread
    exited = asyncio.Event()
    reader = asyncio.ensure_future(
        process.ChildProcess._pump_stderr(child, os.fdopen(read_end, "rb", buffering=0), exited)
    )
    try:
        os.write(write_end, b"one\ntwo\n")
        await until(lambda: child.logs.snapshot() == ["one", "two"], 5)
        os.write(write_end, b"three\n")  # within the gathering time: waits for it, in the pipe
        await asyncio.sleep(0.1)
        assert child.logs.snapshot() == ["one", "two"]
        assert _unread(probe) == len(b"three\n")
        exited.set()  # the child exited: the rest now, then the end
        os.write(write_end, b"couldn't bind\n")
        os.close(write_end)
        await asyncio.wait_for(reader, 5)
    finally:
        reader.cancel()
        os.close(probe)
    assert child.logs.snapshot() == ["one", "two", "three", "couldn't bind"]
    assert child._bind_failed


def _unread(fd: int) -> int:
    count = array.array("i", [0])
    fcntl.ioctl(fd, termios.FIONREAD, count)
    return count[0]


async def test_a_flood_read_in_partial_pieces_is_never_held_back() -> None:
    """uvloop hands a pipe's data over as it finds it: a child writing 64 KB lines was read in
    pieces of 28-64 KB, and a pause after each piece short of a whole chunk held its log back
    by seconds (the last lines came after the model was loaded)."""
    from node_agent.child.streams import LogPace, read_lines

    stream = asyncio.StreamReader()
    pace, reads, pauses = LogPace(0.25), [], []
    loop = asyncio.get_running_loop()

    async def gather(size: int) -> None:
        reads.append(size)
        if pace.gathers_after(size, loop.time()):
            pauses.append(len(reads))

    async def child() -> None:
        for _ in range(20):  # 40 KB at a time, each read as it comes: less than a 64 KB chunk
            stream.feed_data(b"x" * 40_000 + b"\n")
            for _ in range(3):
                await asyncio.sleep(0)
        stream.feed_data(b"last\n")  # a trickle, but right after the flood: not held either
        stream.feed_eof()

    writing = asyncio.ensure_future(child())
    lines = [text async for text in read_lines(stream, gather)]
    await writing
    assert len(lines) == 21 and lines[-1] == "last"
    assert len(reads) == 21 and pauses == []


class TestLogPace:
    """When the reader of a child's log pauses to gather (the clock is the caller's)."""

    def test_a_trickle_is_gathered_after_each_small_read(self) -> None:
        pace = LogPace(0.25)
        assert [pace.gathers_after(size, t) for t, size in enumerate([1, 900, TRICKLE - 1])] == [
            True,
            True,
            True,
        ]

    def test_a_read_between_a_trickle_and_busy_is_followed_at_once_and_no_more(self) -> None:
        pace = LogPace(0.25)
        assert not pace.gathers_after(TRICKLE, 0.0)
        assert pace.gathers_after(100, 0.01)  # not busy: the next small read gathers

    def test_a_busy_writer_is_read_as_it_comes_while_each_window_brings_that_much(self) -> None:
        pace = LogPace(0.25)
        assert not pace.gathers_after(BUSY, 0.0)  # after a pause, the pipe came near full
        times = [0.001 * i for i in range(1, 1000)]  # 1 MB/s in 1 KB reads for a second
        assert not any(pace.gathers_after(1024, t) for t in times)

    def test_a_writer_that_slows_down_is_gathered_again_after_its_window(self) -> None:
        pace = LogPace(0.25)
        assert not pace.gathers_after(BUSY, 0.0)
        assert not pace.gathers_after(1024, 0.1)  # within the busy window
        assert pace.gathers_after(1024, 0.3)  # the window brought 2 KB: a trickle again
        assert pace.gathers_after(1024, 0.31)

    def test_busy_again_from_a_large_read_in_any_window(self) -> None:
        pace = LogPace(0.25)
        assert not pace.gathers_after(BUSY, 0.0)
        assert not pace.gathers_after(BUSY, 0.3)  # its window brought BUSY: still busy
        assert not pace.gathers_after(10, 0.5)
        assert pace.gathers_after(10, 0.6)  # the window from 0.3 brought 10 bytes


_STEADY_WRITER = r"""
import os, sys, time
line = b"x" * 999 + b"\n"
blocked = 0.0
for _ in range(int(sys.argv[1])):
    began = time.monotonic()
    os.write(2, line)
    blocked += time.monotonic() - began
    time.sleep(0.001)  # a line per millisecond of work: 1 MB/s at most, in 1 KB writes
print(blocked)
"""


async def test_a_steady_flood_of_small_writes_waits_at_most_one_gather() -> None:
    """LOG_GATHER's comment: "A child writing more than a pipe holds (64 KB) within it waits at
    most this long". A child writing ~1 MB/s in 1 KB lines (a verbose llama-server with busy
    slots) fills the 64 KB pipe in ~65 ms of each paused 0.25 s; after the pause one large read
    drains it, the next read finds the one line written since (a trickle), and the pipe is
    paused again. The writer is held back again and again (~0.19 s of every 0.25 s), not once;
    at 861fe85 (no pause; the loop buffered into the StreamReader) it waited 0.01-0.02 s."""
    import sys
    from types import SimpleNamespace

    import node_agent.child.process as process

    lines = 600
    child: Any = SimpleNamespace(logs=LogRing(lines), _bind_failed=False)
    read_end, write_end = os.pipe()
    exited = asyncio.Event()
    try:
        writer = await asyncio.create_subprocess_exec(
            sys.executable, "-c", _STEADY_WRITER, str(lines),
            stdout=asyncio.subprocess.PIPE, stderr=write_end,
        )  # fmt: skip
    finally:
        os.close(write_end)
    reader = asyncio.ensure_future(
        process.ChildProcess._pump_stderr(child, os.fdopen(read_end, "rb", buffering=0), exited)
    )
    try:
        out, _ = await asyncio.wait_for(writer.communicate(), 60)
        exited.set()
        await asyncio.wait_for(reader, 5)
    finally:
        reader.cancel()
    assert len(child.logs.snapshot()) == lines
    blocked = float(out)
    assert blocked <= process.LOG_GATHER + 0.25, f"the writer waited {blocked:.2f} s in all"


def test_closing_a_pipe_stream_under_uvloop_closes_no_other_descriptor() -> None:
    """uvloop's connect_read_pipe hands the file's descriptor to libuv, which closes it when the
    transport closes; the file object, attached to the transport, then closes the same number
    again (uvloop issue 763, open; strace: close(13) = 0, close(13) = EBADF). A descriptor that
    another thread opened in between (the loop's default executor, watchfiles, a resolver) is
    closed under it. The probe opens a pipe where that thread would: in the freed number."""
    import io

    uvloop = pytest.importorskip("uvloop")
    from node_agent.child.streams import pipe_stream

    opened: list[int] = []

    class Probe(io.FileIO):
        def close(self) -> None:
            if not self.closed:
                opened.extend(os.pipe())  # another thread's open, at this instant
            super().close()

    async def main() -> None:
        read_end, write_end = os.pipe()
        try:
            async with pipe_stream(Probe(read_end, "rb")) as (stream, _):
                os.write(write_end, b"a line\n")
                assert await stream.readline() == b"a line\n"
        finally:
            os.close(write_end)

    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        runner.run(main())
    closed_under_it = []
    for fd in opened:
        try:
            os.fstat(fd)
            os.close(fd)
        except OSError:
            closed_under_it.append(fd)
    assert closed_under_it == [], f"descriptors {closed_under_it} closed by someone else"
