"""The real agent as a process, and a tiny blocking HTTP client, for integration tests."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from http.client import HTTPConnection
from pathlib import Path
from typing import Any, NoReturn

REPO = Path(__file__).resolve().parents[2]


def missing_in_ci_fails(reason: str) -> NoReturn:
    """Skip a test whose counterpart this machine lacks; under CI, where it must be, fail."""
    import pytest

    if os.environ.get("CI"):
        pytest.fail(f"CI must have it: {reason}")
    pytest.skip(reason)


def b11434_path() -> Path:
    """llama-server b11434 as `corral llama-server build` leaves it (hack/setup.sh runs it), in
    the cache outside the checkout; where none is built, the folder it would be in."""
    from node_agent.llama_server.cache import builds, cache_root
    from node_agent.llama_server.plan import LLAMA_CPP_BUILD, SERVER_TARGET

    root = cache_root(os.environ)
    found = [b for b in builds(root) if b.llama_cpp == LLAMA_CPP_BUILD and not b.extra_cmake_args]
    # The CPU build hack/setup.sh makes for the tests first, where a GPU build is cached too.
    found.sort(key=lambda b: b.backends != ("cpu",))
    return found[0].binary if found else root / f"b{LLAMA_CPP_BUILD}-cpu" / SERVER_TARGET


# What the agent says when its --port was taken (startup.bind_failure), and how many ports an
# AgentProcess tries when it chose them.
PORT_TAKEN = "the port is in use"
PORT_TRIES = 3


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def http(
    method: str,
    url: str,
    body: Any = None,
    *,
    headers: dict[str, str] | None = None,
    timeout: float = 60,
    raw: bytes | None = None,
    context: ssl.SSLContext | None = None,
) -> tuple[int, Any]:
    """A tiny blocking HTTP client: (status, parsed JSON or text); ``context``: how an
    HTTPS server's certificate is checked."""
    data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
    request = urllib.request.Request(url, data=data, method=method, headers=headers or {})
    if data is not None:
        request.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(request, timeout=timeout, context=context) as response:
            status, payload = response.status, response.read()
    except urllib.error.HTTPError as err:
        status, payload = err.code, err.read()
    try:
        return status, json.loads(payload)
    except ValueError:
        return status, payload.decode(errors="replace")


def chat(model: str, max_tokens: int = 4, **extra: Any) -> dict[str, Any]:
    return {
        "model": model,
        "max_tokens": max_tokens,
        "messages": [{"role": "user", "content": "hello"}],
        **extra,
    }


class AgentProcess:
    """``corral agent`` as a real process, on a free port."""

    def __init__(
        self,
        args: Sequence[str],
        env: dict[str, str] | None = None,
        *,
        port: int | None = None,
        wait: bool = True,
    ) -> None:
        # ``port``: restart an agent where an earlier one listened (its children's tag).
        # A port of our choosing was free a moment ago: another process (a child of another
        # agent, which picks its ports the same way) may bind it before the agent does. The
        # agent then exits saying so, and starts again on another.
        for attempt in range(1, PORT_TRIES + 1):
            self._start(args, env, port or free_port())
            if not wait:  # not over TLS: the wait speaks plain HTTP
                return
            try:
                self._wait_listening()
                return
            except AssertionError:
                if port is not None or attempt == PORT_TRIES or PORT_TAKEN not in self.log():
                    raise
            self.stop()

    def _start(self, args: Sequence[str], env: dict[str, str] | None, port: int) -> None:
        self.port = port
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = Path(os.environ.get("TMPDIR", "/tmp")) / f"corral-agent-{self.port}.log"
        self._log = self.log_path.open("wb")
        full_env = {**os.environ, **(env or {})}
        # Each agent its own state folder (warm swaps' saved caches): a cache one test left
        # must never warm another's model. Removed when it stops (thousands were left in /tmp).
        self._own_state: str | None = None
        if "XDG_STATE_HOME" not in full_env:
            self._own_state = full_env["XDG_STATE_HOME"] = tempfile.mkdtemp(prefix="corral-state-")
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "node_agent.cli",
                "agent",
                "--port",
                str(self.port),
                *args,
            ],
            stdout=self._log,
            stderr=subprocess.STDOUT,
            env=full_env,
            cwd=REPO,
        )

    def wait_healthy(self, timeout: float = 30, path: str = "/health") -> None:
        wait_healthy(self.proc, self.port, self.log, "the agent", timeout, path)

    def _wait_listening(self) -> None:
        """Healthy, and listening on its port: the answer was its own, not that of a server
        that took the port first (the agent exits then, saying so)."""
        self.wait_healthy()
        wait_until(
            lambda: f"listening on {self.url} " in self.log() or self.proc.poll() is not None,
            "the agent's 'listening on' line",
        )
        if self.proc.poll() is not None:
            raise AssertionError(f"the agent exited with {self.proc.returncode}:\n{self.log()}")

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def get(self, path: str, **kw: Any) -> tuple[int, Any]:
        return http("GET", self.url + path, **kw)

    def post(self, path: str, body: Any = None, **kw: Any) -> tuple[int, Any]:
        return http("POST", self.url + path, body, **kw)

    def models(self) -> dict[str, dict[str, Any]]:
        status, data = self.get("/models")
        assert status == 200, data
        return {m["id"]: m for m in data["data"]}

    def state(self, model: str) -> str:
        value: str = self.models()[model]["status"]["value"]
        return value

    def wait_state(self, model: str, state: str, timeout: float = 20) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            entry = self.models()[model]
            if entry["status"]["value"] == state:
                return entry
            time.sleep(0.05)
        raise AssertionError(f"{model} never became {state}: {self.models()[model]['status']}")

    def children(self) -> list[int]:
        """PIDs of llama-server processes started by this agent."""
        return children_of(self.proc.pid)

    def stop(self) -> None:
        stop_process(self.proc)
        self._log.close()
        if self._own_state is not None:
            shutil.rmtree(self._own_state, ignore_errors=True)


def wait_healthy(
    proc: subprocess.Popen[bytes],
    port: int,
    log: Callable[[], str],
    what: str,
    timeout: float = 30,
    path: str = "/health",
) -> None:
    """Wait for ``GET path`` 200 from a server we started; fail with its log if it dies."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"{what} exited with {proc.returncode}:\n{log()}")
        try:
            status, _ = http("GET", f"http://127.0.0.1:{port}{path}", timeout=1)
            if status == 200:
                return
        except OSError:
            pass
        time.sleep(0.05)
    raise AssertionError(f"{what} did not become healthy:\n{log()}")


# The agent's own bound (--shutdown-timeout, 30 s by default) and its forced cleanup (5 s).
STOP_WAIT = 40


def stop_process(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM (the agent drains and stops its children), then SIGKILL after its bound."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=STOP_WAIT)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def wait_until(check: Callable[[], bool], what: str, timeout: float = 60) -> None:
    """Poll ``check`` until it holds; fail after ``timeout`` seconds, naming ``what``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.05)
    raise AssertionError(f"never saw {what}")


def alive(pid: int) -> bool:
    """True while ``pid`` exists and is not a zombie (a zombie holds no memory or port)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rpartition(")")[2].split()[0] != "Z"


def children_of(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        # after the name in parentheses (which may hold spaces): state, then parent pid
        fields = stat.rpartition(")")[2].split()
        if int(fields[1]) == pid and b"llama-server" in cmdline and fields[0] != "Z":
            found.append(int(entry.name))
    return found


def open_stream(
    agent: AgentProcess, model: str, headers: dict[str, str] | None = None
) -> tuple[HTTPConnection, Any]:
    """A long streamed chat (3,000 tokens) that has started flowing: a model kept busy."""
    conn = HTTPConnection("127.0.0.1", agent.port, timeout=120)
    body = chat(model, max_tokens=3000, stream=True, ignore_eos=True)
    conn.request(
        "POST",
        "/v1/chat/completions",
        json.dumps(body),
        {"Content-Type": "application/json", **(headers or {})},
    )
    stream = conn.getresponse()
    assert stream.status == 200
    assert stream.readline().startswith(b"data: ")  # tokens are flowing
    return conn, stream
