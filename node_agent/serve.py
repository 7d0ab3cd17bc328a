"""``corral agent``'s process: its options, its log, its signals, and its shutdown's bound.

The signal handler only sets a flag; the agent then stops in order (``agent.Agent.stop``).
The whole of it takes at most ``--shutdown-timeout``; past that, or on a second
SIGTERM/SIGINT, the children left are killed and the agent exits.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import signal
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from node_agent.agent import Agent, download_settings
from node_agent.agent_help import HELP
from node_agent.api.vertex import vertex_from_env
from node_agent.binary_probe import BinaryProbe
from node_agent.config import AgentOptions, parse_agent_args
from node_agent.errors import CorralError
from node_agent.event_loop import loop_factory, running_asyncio_loop
from node_agent.llama_server.binary import build_info
from node_agent.redact import RedactingFilter, add_secret, add_secrets

log = logging.getLogger("corral.agent")


def _watch_children_with_pidfds() -> None:
    """Python 3.11's default child watcher starts a thread per child to wait for it; a pidfd
    is watched by the event loop itself (3.12 does this on its own). Linux 5.3+ only."""
    if sys.version_info >= (3, 12) or not hasattr(os, "pidfd_open") or not running_asyncio_loop():
        return
    try:
        os.close(os.pidfd_open(os.getpid()))
    except OSError:
        return  # an older kernel: keep the threaded watcher
    watcher = asyncio.PidfdChildWatcher()
    watcher.attach_loop(asyncio.get_running_loop())
    asyncio.set_child_watcher(watcher)


# After a forced stop, the cleanup still has this long to reap the killed children.
FORCED_CLEANUP_SECONDS = 5.0


async def serve(
    options: AgentOptions,
    binary: Path,
    build_info: str,
    env: Mapping[str, str],
    devices: tuple[str, ...] | None,
) -> None:
    _watch_children_with_pidfds()
    agent = Agent(options, binary, build_info, env, devices)
    first, second = asyncio.Event(), asyncio.Event()
    loop = asyncio.get_running_loop()

    def on_signal() -> None:
        (second if first.is_set() else first).set()

    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, on_signal)
    # SIGHUP: re-read the sources, as daemons do (it used to end the agent without a word).
    loop.add_signal_handler(signal.SIGHUP, agent.source_watch.request, "SIGHUP")
    await agent.start()
    await first.wait()
    stopping = asyncio.create_task(agent.stop(), name="shutdown")
    forced = asyncio.create_task(second.wait(), name="second-signal")
    done, _ = await asyncio.wait(
        {stopping, forced}, timeout=options.shutdown_timeout, return_when=asyncio.FIRST_COMPLETED
    )
    forced.cancel()
    if stopping in done:
        stopping.result()
        return
    why = (
        "a second signal"
        if second.is_set()
        else f"--shutdown-timeout {options.shutdown_timeout:g}s"
    )
    agent.force_stop(why)
    _, pending = await asyncio.wait({stopping}, timeout=FORCED_CLEANUP_SECONDS)
    for task in pending:
        task.cancel()


def with_vertex(options: AgentOptions, env: Mapping[str, str]) -> AgentOptions:
    """Google Cloud's ``AIP_HTTP_PORT`` replaces ``--port`` (llama.cpp's server-http.cpp)."""
    vertex = vertex_from_env(env)
    if vertex is None or vertex.port == options.port:
        return options
    log.warning(
        "Google Cloud Platform compat: overriding server port %d with AIP_HTTP_PORT %d",
        options.port,
        vertex.port,
    )
    return dataclasses.replace(options, port=vertex.port)


SWITCH_INTERVAL = 0.0005  # seconds (CPython's default: 0.005)


def main(argv: Sequence[str], probe: BinaryProbe | None = None) -> int:
    """``corral agent``; ``probe``: the binary's checks, begun before this module imported
    (``cli``)."""
    env = os.environ
    # The binary first: its own --help says which options the flags and presets may use.
    # Without one, --help still works, and the error waits until the flags are checked.
    probe = probe or BinaryProbe(argv, env)
    binary, binary_version, missing = probe.result()
    try:
        options = parse_agent_args(argv, env)
    except CorralError as exc:
        print(f"corral agent: {exc}", file=sys.stderr)
        return 2
    if options.show_help:
        print(HELP, end="")
        return 0
    if options.show_version:
        from node_agent.version import version_line  # importlib.metadata: only for this

        print(version_line())
        return 0
    logging.basicConfig(
        level=options.log_level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    # What the format does not show is not gathered for each record (a line per proxied
    # request, issue 30): the caller's file and line (a walk up the stack), thread, process.
    logging._srcfile = None
    logging.logThreads = logging.logProcesses = logging.logMultiprocessing = False
    # Secrets never reach the log: the keys and the token by value, the rest by shape.
    add_secrets(options.api_keys)
    add_secrets(options.metrics_keys)
    add_secret(download_settings(options, env).token)
    for handler in logging.getLogger().handlers:
        handler.addFilter(RedactingFilter())
    if missing is not None or binary is None:
        print(f"corral agent: {missing}", file=sys.stderr)
        return 1
    # A thread busy in Python (a model header's estimate, a tool) hands the GIL back every
    # switch interval, and the loop waits that long each time it takes the GIL back after a
    # system call: some twenty times per request. At CPython's 5 ms a /health took 224-288 ms
    # while ten costly estimates ran (issue 26, row 6b); at 0.5 ms the waits stay short.
    sys.setswitchinterval(SWITCH_INTERVAL)
    try:
        options = with_vertex(options, env)
        with asyncio.Runner(loop_factory=loop_factory(options.event_loop)) as runner:
            # (the children's threads and the turns need them: llama_server/cpu_threads.py)
            devices = probe.devices()
            runner.run(serve(options, binary, build_info(binary_version), env, devices))
    except CorralError as exc:
        print(f"corral agent: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    return 0
