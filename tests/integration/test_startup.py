"""``corral agent`` starting where it cannot listen, on a unix socket, and on empty sources."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from node_agent.client_transport import UnixSocketConnection
from node_agent.startup import port_holder
from tests.integration.harness import REPO, AgentProcess, chat, free_port, stop_process

TINY = "demo-tiny"


def agent_command(*args: str) -> list[str]:
    return [sys.executable, "-m", "node_agent.cli", "agent", *args]


def refused(*args: str) -> str:
    """``corral agent ARGS`` must refuse to start with one line on stderr; that line."""
    run = subprocess.run(agent_command(*args), capture_output=True, text=True, timeout=60, cwd=REPO)
    assert run.returncode == 1, run.stdout + run.stderr
    assert run.stderr.count("\n") == 1, run.stderr  # one line, no traceback
    return run.stderr.strip()


def test_port_in_use_is_one_line_naming_the_holder(tmp_path: Path) -> None:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        message = refused("--port", str(port), "--models-dir", str(tmp_path))
    assert message.startswith(
        f"corral agent: cannot listen on 127.0.0.1:{port}: the port is in use by pid "
        f"{os.getpid()} ("
    )
    assert message.endswith("; choose another --port, or stop what holds it")


def test_a_routing_metrics_port_in_use_is_one_line_too(tmp_path: Path) -> None:
    """The second listener fails after the first listens: the agent still ends in one line."""
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        message = refused(
            "--port", str(free_port()), "--routing-metrics-port", str(port),
            "--models-dir", str(tmp_path),
        )  # fmt: skip
    assert message.startswith(
        f"corral agent: --routing-metrics-port: cannot listen on 127.0.0.1:{port}: the port is "
        f"in use by pid {os.getpid()} ("
    )


def test_port_holder_reads_proc() -> None:
    with socket.socket(socket.AF_INET6) as holder:
        holder.bind(("::1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        assert (port_holder(port) or "").startswith(f"pid {os.getpid()} (")
    assert port_holder(free_port()) is None


def test_unknown_host_is_one_line() -> None:
    message = refused("--host", "no-such-host.invalid", "--port", "0")
    assert message == (
        "corral agent: cannot listen on no-such-host.invalid:0: 'no-such-host.invalid' is not "
        "an address or host name of this machine (check --host)"
    )


def over_unix(path: str, method: str, url: str, body: Any = None) -> tuple[int, Any]:
    connection = UnixSocketConnection(path, "localhost", timeout=60)
    try:
        payload = json.dumps(body).encode() if body is not None else None
        headers = {"Content-Type": "application/json"} if payload else {}
        connection.request(method, url, body=payload, headers=headers)
        response = connection.getresponse()
        return response.status, json.loads(response.read())
    finally:
        connection.close()


def test_unix_socket_host(tmp_path: Path, demo_dir: Path) -> None:
    # llama-server: a --host ending in .sock is a unix socket path and --port is ignored.
    path = str(tmp_path / "agent.sock")
    log = tmp_path / "agent.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            agent_command(
                "--host", path, "--port", "1", "--models-dir", str(demo_dir), "-c", "512"
            ),
            stdout=out,
            stderr=subprocess.STDOUT,
            cwd=REPO,
        )
    try:
        deadline = time.monotonic() + 60
        while not os.path.exists(path):
            assert proc.poll() is None, log.read_text()
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(0.05)
        assert over_unix(path, "GET", "/health") == (200, {"status": "ok"})
        status, body = over_unix(path, "POST", "/v1/chat/completions", chat(TINY, max_tokens=2))
        assert status == 200, body
        assert body["model"] == TINY
        assert f"listening on unix://{path} (3 models; event loop: " in log.read_text()
        assert f"WARNING corral.agent: --port 1 is not used: --host {path} is a unix socket" in (
            log.read_text()
        )
        # The client reaches it at the address the agent logged.
        client = [sys.executable, "-m", "node_agent.cli"]
        url = ["--url", f"unix://{path}"]
        loaded = subprocess.run(
            [*client, "load", "demo-small", *url], capture_output=True, text=True, cwd=REPO
        )
        assert loaded.returncode == 0, loaded.stderr
        assert loaded.stdout.splitlines()[-1].startswith("demo-small loaded in ")
        status = subprocess.run([*client, "status", *url], capture_output=True, text=True, cwd=REPO)
        assert status.returncode == 0, status.stderr
        assert f"agent      unix://{path}" in status.stdout
        assert "instances  2 running of 4 (3 models known)" in status.stdout
        # A second agent on the same path must not take the socket over.
        assert refused("--host", path, "--models-dir", str(demo_dir)) == (
            f"corral agent: cannot listen on unix socket {path}: a server is listening on it "
            "already; stop it or give another --host path"
        )
        assert over_unix(path, "GET", "/health")[0] == 200
    finally:
        stop_process(proc)
    assert proc.returncode == 0, log.read_text()


def test_warns_about_sources_that_give_no_model(tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    (empty / "notes").mkdir(parents=True)
    (empty / "README.txt").write_text("no models here")
    preset = tmp_path / "presets.ini"
    preset.write_text("[*]\nctx-size = 512\n\n[ghost]\nmodel = gone/ghost.gguf\n")
    agent = AgentProcess(["--models-dir", str(empty), "--models-preset", str(preset)])
    try:
        log = agent.log()
    finally:
        agent.stop()
    assert (
        f"WARNING corral.agent: --models-dir {empty} holds no model: no .gguf file at its top "
        "level and no folder (one level down) with one"
    ) in log
    assert (
        f"WARNING corral.agent: {preset}:4: preset [ghost]: its model file gone/ghost.gguf "
        f"(relative to {REPO}) does not exist; loading it will fail until it does"
    ) in log


def test_an_agent_without_the_gpus_it_expects_is_alive_but_not_ready() -> None:
    """Issue 25: a GPU node's pod that cannot see its GPUs (a device plugin without the
    runtime that injects them) served on the CPU and stayed Ready. No machine here has 64."""
    agent = AgentProcess(["--expect-gpus", "64"], wait=False)
    try:
        agent.wait_healthy(path="/livez")
        code, body = agent.get("/health")
        assert code == 503, body
        message = body["error"]["message"]
        assert message.startswith("--expect-gpus 64: NVML ") and "restart it" in message
        assert agent.get("/livez") == (200, {"status": "ok"})
        assert agent.get("/v1/models")[0] == 200  # it serves what it can meanwhile
        assert f"not ready: {message}" in agent.log()
    finally:
        agent.stop()


@pytest.mark.parametrize("choice", ["auto", "asyncio"])
def test_the_event_loop_is_uvloop_unless_asyncios_is_asked_for(choice: str, demo_dir: Path) -> None:
    """Issue 30: uvloop (a dependency) by default; asyncio's own loop one flag away, and an
    agent on it serves a model's child as well (spawned, proxied, stopped)."""
    agent = AgentProcess(["--models-dir", str(demo_dir), "--event-loop", choice])
    try:
        status, body = agent.post("/v1/chat/completions", chat(TINY))
        assert status == 200, body
        expected = "uvloop" if choice == "auto" else "asyncio"
        assert f"event loop: {expected}" in agent.log()
    finally:
        agent.stop()
    assert agent.proc.returncode == 0
    assert not agent.children()


def test_a_second_start_asks_the_binary_nothing_it_already_knows(
    tmp_path: Path, demo_dir: Path, b11434: Path
) -> None:
    """``--version``, ``--help`` and ``--list-devices`` are asked once per binary (issue 49):
    a start that knows the answers spawns no child before it listens. The binary here is a
    wrapper that writes down how it is run, then runs b11434."""
    calls = tmp_path / "calls"
    wrapper = tmp_path / "bin" / "llama-server"
    wrapper.parent.mkdir()
    wrapper.write_text(f'#!/bin/sh\necho "$*" >> {calls}\nexec {b11434} "$@"\n')
    wrapper.chmod(0o755)
    env = {"XDG_CACHE_HOME": str(tmp_path / "cache")}
    args = ["--models-dir", str(demo_dir), "--llama-server", str(wrapper), "-c", "512"]

    def started() -> list[str]:
        calls.write_text("")
        agent = AgentProcess(args, env)
        try:
            assert agent.get("/health")[0] == 200
        finally:
            agent.stop()
        return calls.read_text().splitlines()

    first = started()
    assert sorted(first) == ["--help", "--list-devices", "--version"], first
    assert started() == []
    # A binary that changed is asked again.
    wrapper.write_text(wrapper.read_text() + "# changed\n")
    assert sorted(started()) == ["--help", "--list-devices", "--version"]
