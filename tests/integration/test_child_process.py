"""The child supervisor against the real llama-server and a tiny real model.

Misbehaviour the real binary will not show on demand (never ready, ignoring SIGTERM, losing
its port, crashing while loading) comes from ``hang_server.py`` run as the "binary".
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import aiohttp
import pytest

from node_agent.child.keys import child_key
from node_agent.child.orphans import AGENT_PID_ENV, TAG_ENV, end_orphans, find_orphans
from node_agent.child.process import ChildProcess
from node_agent.child.spawn import ChildConfig
from node_agent.child.state import ChildEvent, ChildState, EventKind
from node_agent.errors import ChildError
from node_agent.llama_server.binary import check_llama_server, find_llama_server

HANG_SERVER = Path(__file__).with_name("hang_server.py")
REPO = Path(__file__).resolve().parents[2]

pytestmark = [pytest.mark.usefixtures("no_leaked_tasks"), pytest.mark.timeout(60)]


@pytest.fixture(scope="module")
def binary() -> Path:
    try:
        return find_llama_server(None, os.environ)
    except Exception as exc:  # no binary on this machine: nothing here can run
        pytest.skip(f"no llama-server: {exc}")


def real_config(binary: Path, model: Path, **kwargs: object) -> ChildConfig:
    # -np 1: one slot is all a test needs and keeps the KV cache small.
    args = ("-m", str(model), "-c", "512", "-np", "1", "--no-warmup")
    return ChildConfig(name="tiny", binary=binary, args=args, **kwargs)  # type: ignore[arg-type]


def hang_config(mode: str, **kwargs: object) -> ChildConfig:
    return ChildConfig(
        name=f"hang-{mode}",
        binary=Path(sys.executable),
        args=(str(HANG_SERVER), mode),
        **kwargs,  # type: ignore[arg-type]
    )


class Recorder:
    def __init__(self) -> None:
        self.events: list[ChildEvent] = []

    def __call__(self, event: ChildEvent) -> None:
        self.events.append(event)

    def kinds(self) -> list[EventKind]:
        return [event.kind for event in self.events]


def alive(pid: int) -> bool:
    """True while ``pid`` exists and is not a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


async def wait_gone(pid: int, within: float) -> float:
    start = time.monotonic()
    while alive(pid):
        if time.monotonic() - start > within:
            pytest.fail(f"pid {pid} still alive after {within} s")
        await asyncio.sleep(0.02)
    return time.monotonic() - start


@pytest.fixture
async def children() -> AsyncIterator[list[ChildProcess]]:
    """Children made by a test; any still running at the end are stopped (and must stop)."""
    made: list[ChildProcess] = []
    yield made
    for child in made:
        await asyncio.wait_for(child.stop(), 15)


async def test_ready_then_graceful_stop(
    binary: Path, tiny_model: Path, children: list[ChildProcess]
) -> None:
    events = Recorder()
    child = ChildProcess(real_config(binary, tiny_model, agent_tag="t-ready"), on_event=events)
    children.append(child)
    started = time.monotonic()
    await child.start()
    took = time.monotonic() - started
    print(f"ready {took * 1000:.0f} ms after start() ({child.snapshot().ready_after})")

    assert child.state is ChildState.READY
    assert child.snapshot().speaks_protocol
    assert child.meta is not None and child.meta["meta"]["n_ctx"] == 512
    # The process exists first (SPAWNED), then it reports loading, then ready.
    kinds = events.kinds()
    assert kinds[:2] == [EventKind.SPAWNED, EventKind.LOADING] and kinds[-1] is EventKind.READY
    assert took < 10
    assert child.port is not None and child.pid is not None
    async with aiohttp.ClientSession() as session, session.get(f"{child.url}/health") as health:
        assert health.status == 200
    # Its own process group (a stop kills the whole group), in the agent's session (where the
    # scheduler counts it with the agent: child/launched.py), and the environment it needs.
    assert os.getpgid(child.pid) == child.pid
    assert os.getsid(child.pid) == os.getsid(0)
    environ = (await asyncio.to_thread(Path(f"/proc/{child.pid}/environ").read_bytes)).split(b"\0")
    for needed in (b"LLAMA_SERVER_ROUTER_PORT=0", b"CUDA_DEVICE_ORDER=PCI_BUS_ID"):
        assert needed in environ
    assert f"{TAG_ENV}=t-ready".encode() in environ
    assert child.pid not in find_orphans("t-ready")  # its agent (this process) is alive
    # Its log is read in gathered pieces (process.LOG_GATHER): the line is there soon.
    for _ in range(100):
        if any("listening on" in line for line in child.logs.snapshot()):
            break
        await asyncio.sleep(0.01)
    assert any("listening on" in line for line in child.logs.snapshot())

    started = time.monotonic()
    code = await child.stop()
    assert code == 0, "\n".join(child.logs.snapshot())  # the exit command: a clean exit
    assert time.monotonic() - started < 2
    assert await child.stop() == 0  # idempotent
    assert child.snapshot().state is ChildState.EXITED
    exited = events.events[-1]
    assert exited.kind is EventKind.EXITED and exited.expected and exited.exit_code == 0
    assert not alive(exited.pid or 0)


def test_check_llama_server_on_the_real_binary(binary: Path) -> None:
    version = check_llama_server(binary)
    assert "build" in version or version[0].isdigit()


@pytest.mark.parametrize("mode", ["503", "silent"])
async def test_load_timeout_kills_the_child(mode: str, children: list[ChildProcess]) -> None:
    events = Recorder()
    child = ChildProcess(hang_config(mode, load_timeout=1.0), on_event=events)
    children.append(child)
    started = time.monotonic()
    with pytest.raises(ChildError, match="load_timeout"):
        await child.start()
    assert time.monotonic() - started < 3
    assert await child.wait_exited() == -signal.SIGKILL
    assert child.pid is not None and not alive(child.pid)
    exited = events.events[-1]
    assert exited.kind is EventKind.EXITED and not exited.expected
    if mode == "503":  # 503 from /health means loading
        assert EventKind.LOADING in events.kinds()


async def test_stop_with_a_request_in_flight_kills_after_stop_timeout(
    binary: Path, tiny_model: Path, children: list[ChildProcess]
) -> None:
    # --context-shift: the generation below could otherwise end when the context is full.
    config = real_config(binary, tiny_model, stop_timeout=1.0)
    config = ChildConfig(**{**config.__dict__, "args": (*config.args, "--context-shift")})
    child = ChildProcess(config)
    children.append(child)
    await child.start()
    body = {"prompt": "hello", "n_predict": 100000, "ignore_eos": True, "stream": False}
    assert child.port is not None
    key = {"Authorization": f"Bearer {child_key(child.port)}"}  # only /health is open
    async with aiohttp.ClientSession(headers=key) as session:

        async def complete() -> int:
            async with session.post(f"{child.url}/completion", json=body) as response:
                await response.read()
                return response.status

        request = asyncio.create_task(complete())
        try:
            # Wait until the slot is busy, so the stop really finds a request in flight.
            async with asyncio.timeout(10):
                while True:
                    async with session.get(f"{child.url}/slots") as response:
                        slots = await response.json()
                    if any(slot.get("is_processing") for slot in slots):
                        break
                    await asyncio.sleep(0.05)
            started = time.monotonic()
            code = await child.stop()
            took = time.monotonic() - started
        finally:
            request.cancel()
            await asyncio.gather(request, return_exceptions=True)
    print(f"stop with a request in flight: {took:.2f} s, exit code {code}")
    assert code == -signal.SIGKILL
    assert 0.9 < took < 1.0 + 1.0


async def test_a_child_killed_from_outside_is_reported(
    binary: Path, tiny_model: Path, children: list[ChildProcess]
) -> None:
    events = Recorder()
    child = ChildProcess(real_config(binary, tiny_model), on_event=events)
    children.append(child)
    await child.start()
    assert child.pid is not None
    os.kill(child.pid, signal.SIGKILL)
    assert await asyncio.wait_for(child.wait_exited(), 5) == -signal.SIGKILL
    exited = events.events[-1]
    assert exited.kind is EventKind.EXITED
    assert exited.exit_code == -signal.SIGKILL and not exited.expected
    assert exited.reason is not None and "unexpectedly" in exited.reason
    assert child.state is ChildState.EXITED


async def test_stop_while_loading_kills_at_once(children: list[ChildProcess]) -> None:
    loading = asyncio.Event()

    def on_event(event: ChildEvent) -> None:
        if event.kind is EventKind.LOADING:  # /health answered 503
            loading.set()

    child = ChildProcess(hang_config("503", stop_timeout=30), on_event=on_event)
    children.append(child)
    start = asyncio.create_task(child.start())
    await asyncio.wait_for(loading.wait(), 10)
    started = time.monotonic()
    assert await child.stop() == -signal.SIGKILL
    assert time.monotonic() - started < 1  # not the 30 s stop_timeout
    with pytest.raises(ChildError, match="stopped while loading"):
        await start


async def test_cancelling_start_kills_the_child(children: list[ChildProcess]) -> None:
    child = ChildProcess(hang_config("silent"))
    children.append(child)
    start = asyncio.create_task(child.start())
    await asyncio.wait_for(anext(child.logs.follow()), 10)  # "corral: spawned pid …"
    assert child.pid is not None
    start.cancel()
    with pytest.raises(asyncio.CancelledError):
        await start
    assert child.state is ChildState.EXITED
    assert not alive(child.pid)


async def test_without_the_protocol_health_alone_means_ready_and_sigterm_escalates(
    children: list[ChildProcess],
) -> None:
    events = Recorder()
    child = ChildProcess(hang_config("ok-ignore-term", stop_timeout=0.3), on_event=events)
    children.append(child)
    await child.start()
    assert child.state is ChildState.READY and child.meta is None
    assert not child.snapshot().speaks_protocol
    started = time.monotonic()
    assert await child.stop() == -signal.SIGKILL  # it ignored SIGTERM
    assert 0.25 < time.monotonic() - started < 2
    assert events.events[-1].expected


async def test_a_child_that_speaks_the_protocol_is_not_polled_while_it_loads(
    children: list[ChildProcess],
) -> None:
    # It says when it is ready; polling meanwhile cost the agent and the loading child CPU
    # (bench S4: 30+ probes per load on a busy machine). Only probes sent before its first
    # protocol line, and the one that confirms the ready line, reach it.
    child = ChildProcess(hang_config("protocol-slow"))
    children.append(child)
    await child.start()
    assert child.state is ChildState.READY
    assert child.logs.tail(100).count("probed while loading") <= 2, child.logs.tail(100)


async def test_a_port_taken_before_the_child_binds_is_retried(
    tmp_path: Path, children: list[ChildProcess]
) -> None:
    config = hang_config("bind-fail-first", env={"HANG_STATE": str(tmp_path / "state")})
    child = ChildProcess(config)
    children.append(child)
    await child.start()
    assert child.snapshot().spawn_attempts == 2
    assert child.state is ChildState.READY
    assert any("couldn't bind" in line for line in child.logs.snapshot())


async def test_a_crash_while_loading_says_why(children: list[ChildProcess]) -> None:
    child = ChildProcess(hang_config("crash"))
    children.append(child)
    with pytest.raises(ChildError) as raised:
        await child.start()
    message = str(raised.value)
    assert "exited with code 3 while loading" in message
    assert "failed to load model 'x.gguf'" in message
    assert await child.wait_exited() == 3
    # Bytes that are not UTF-8 are replaced, not fatal.
    assert any("\ufffd" in line for line in child.logs.snapshot())
    assert child.logs.closed  # the ring it made ends with it


# A small "agent": starts a child that never loads (so stdin EOF would not end it) and waits.
AGENT = textwrap.dedent(
    """
    import asyncio, sys
    from pathlib import Path
    from node_agent.child.process import ChildProcess
    from node_agent.child.spawn import ChildConfig

    async def main() -> None:
        config = ChildConfig(name="x", binary=Path(sys.executable),
                             args=(sys.argv[1], "silent"), agent_tag="t-agent")
        child = ChildProcess(config)
        start = asyncio.create_task(child.start())
        while child.pid is None:
            await asyncio.sleep(0.01)
        print(child.pid, flush=True)
        await start

    asyncio.run(main())
    """
)


@pytest.fixture
def agent_process() -> Iterator[subprocess.Popen[str]]:
    with subprocess.Popen(
        [sys.executable, "-c", AGENT, str(HANG_SERVER)],
        stdout=subprocess.PIPE,
        text=True,
        cwd=REPO,
    ) as proc:
        yield proc
        proc.kill()


async def test_children_die_with_a_sigkilled_agent(
    agent_process: subprocess.Popen[str],
) -> None:
    assert agent_process.stdout is not None
    line = await asyncio.wait_for(asyncio.to_thread(agent_process.stdout.readline), 20)
    child_pid = int(line)
    assert alive(child_pid)
    agent_process.kill()  # SIGKILL: no cleanup code of the agent runs
    took = await wait_gone(child_pid, 2.0)
    print(f"child gone {took * 1000:.0f} ms after the agent was SIGKILLed")


async def test_end_orphans_ends_only_orphans(children: list[ChildProcess]) -> None:
    # Ours, alive, tagged the same: not an orphan.
    ours = ChildProcess(hang_config("ok", agent_tag="t-orphans"))
    children.append(ours)
    await ours.start()
    # An orphan: its "agent" (a short-lived Python) spawns it without PDEATHSIG and exits.
    spawner = textwrap.dedent(
        """
        import os, subprocess, sys
        env = {**os.environ, sys.argv[2]: "t-orphans", sys.argv[3]: str(os.getpid())}
        child = subprocess.Popen([sys.executable, sys.argv[1], "silent", "--host", "127.0.0.1",
                                  "--port", "1"], env=env, start_new_session=True,
                                 stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                 stderr=subprocess.DEVNULL)
        print(child.pid, flush=True)
        """
    )
    done = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-c", spawner, str(HANG_SERVER), TAG_ENV, AGENT_PID_ENV],
        capture_output=True,
        text=True,
        check=True,
        timeout=20,
    )
    orphan = int(done.stdout)
    try:
        assert find_orphans("t-orphans") == [orphan]
        assert find_orphans("another-tag") == []
        assert await asyncio.to_thread(end_orphans, "t-orphans") == [orphan]
        assert not alive(orphan)
        assert ours.state is ChildState.READY and ours.pid is not None and alive(ours.pid)
    finally:
        if alive(orphan):
            os.kill(orphan, signal.SIGKILL)
