"""Slow and greedy clients, as issue 16 (rows 6–8) probed the agent with, hostile requests as
issue 26 did, and what to measure while they run: ``/health`` latency and the agent's memory.

Used by ``tests/integration/test_security_connections.py`` and ``test_attacks_http.py`` (short
limits, assertions) and by ``hack/attack-figures.py`` (the default limits, figures printed for
the closing note).
"""

from __future__ import annotations

import json
import signal
import socket
import statistics
import subprocess
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.client import HTTPConnection, HTTPException
from pathlib import Path
from typing import Any


def status_kib(pid: int, key: str) -> int:
    """``VmRSS`` (now) or ``VmHWM`` (peak) of a process, in KiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    raise KeyError(key)


def helpers_kib(pid: int) -> int:
    """RSS of the agent's own helper processes (its JSON worker and forkserver; not its
    llama-server children), in KiB."""
    total = 0
    for child in descendants(pid):
        try:
            cmdline = Path(f"/proc/{child}/cmdline").read_bytes()
            if b"llama-server" not in cmdline:
                total += status_kib(child, "VmRSS")
        except (OSError, KeyError):
            continue  # gone meanwhile
    return total


def descendants(pid: int) -> list[int]:
    """The processes below ``pid``: its children, theirs, and so on."""
    out: list[int] = []
    try:
        tasks = list(Path(f"/proc/{pid}/task").iterdir())
    except OSError:
        return out
    for task in tasks:
        try:
            children = [int(c) for c in (task / "children").read_text().split()]
        except OSError:
            continue
        for child in children:
            out += [child, *descendants(child)]
    return out


def health_once(port: int, timeout: float = 30.0) -> float:
    """Seconds a fresh connection's ``GET /health`` took (inf when it failed)."""
    start = time.monotonic()
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
            s.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
            if not _status_line(s).startswith(b"HTTP/1.1 200"):
                return float("inf")
    except OSError:
        return float("inf")
    return time.monotonic() - start


@dataclass
class Probe:
    """``/health`` latency and the agent's RSS, sampled in a thread while an attack runs."""

    port: int
    pid: int
    interval: float = 0.1
    latencies: list[float] = field(default_factory=list)
    rss_kib: list[int] = field(default_factory=list)
    helpers_kib: list[int] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)

    def _run(self) -> None:
        while not self._stop.is_set():
            latency = health_once(self.port)
            try:
                rss = status_kib(self.pid, "VmRSS")
            except (OSError, KeyError):
                break  # the agent exited (a zombie has no VmRSS): its answers are over
            self.latencies.append(latency)
            self.rss_kib.append(rss)
            self.helpers_kib.append(helpers_kib(self.pid))
            self._stop.wait(self.interval)

    @contextmanager
    def running(self) -> Iterator[Probe]:
        thread = threading.Thread(target=self._run, daemon=True)
        thread.start()
        try:
            yield self
        finally:
            self._stop.set()
            thread.join()

    def worst_ms(self) -> float:
        """The slowest ``/health`` answer, in ms (inf when one failed)."""
        return max(self.latencies, default=0.0) * 1000

    def rss_growth_mib(self) -> float:
        """How far the agent's RSS rose above its first sample, in MiB."""
        return (max(self.rss_kib) - self.rss_kib[0]) / 1024 if self.rss_kib else 0.0

    def figures(self) -> str:
        """The two figures issue 26 asks of every attack."""
        return f"worst /health {self.worst_ms():.0f} ms, RSS growth {self.rss_growth_mib():.1f} MiB"

    def summary(self) -> str:
        lat = sorted(self.latencies)
        ms = [x * 1000 for x in lat]
        failed = sum(1 for x in lat if x == float("inf"))
        ok = [x for x in ms if x != float("inf")]
        return (
            f"/health: {len(lat)} probes, {failed} failed, median "
            f"{statistics.median(ok) if ok else float('nan'):.1f} ms, max "
            f"{max(ok) if ok else float('nan'):.1f} ms; agent RSS max "
            f"{max(self.rss_kib) / 1024:.0f} MiB (its helper processes: max "
            f"{max(self.helpers_kib) / 1024:.0f} MiB)"
        )


def is_open(s: socket.socket, *, drain: bool = True) -> bool:
    """Whether the agent still holds this connection open. ``drain``: read (and drop) what it
    sent first, e.g. a 408, to see whether an end follows; without it nothing is consumed
    (a non-reader stays one) and only a reset counts as closed."""
    try:
        data = s.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT)
    except BlockingIOError:
        return True
    except OSError:
        return False
    if data == b"":
        return False
    if not drain:
        return True
    try:
        while True:
            if not s.recv(65536, socket.MSG_DONTWAIT):
                return False
    except BlockingIOError:
        return True
    except OSError:
        return False


def slow_connections(port: int, idle: int, slow_head: int, slow_body: int) -> list[socket.socket]:
    """Row 6: connections that send nothing, half a request head, or a head and a few bytes of
    a long body — and then nothing more."""
    out = []
    for i in range(idle + slow_head + slow_body):
        try:
            s = socket.create_connection(("127.0.0.1", port), timeout=5)
        except OSError:
            break  # the agent takes no more (out of descriptors: the attack worked)
        s.settimeout(None)
        if i >= idle + slow_head:
            s.sendall(
                b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                b'Content-Type: application/json\r\nContent-Length: 100000\r\n\r\n{"mod'
            )
        elif i >= idle:
            s.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ")
        out.append(s)
    return out


def stalled_stream(port: int, model: str, max_tokens: int) -> socket.socket:
    """Row 7: a streamed completion from a client that never reads (a tiny receive buffer)."""
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 2048)
    s.connect(("127.0.0.1", port))
    body = json.dumps(
        {
            "model": model,
            "stream": True,
            "max_tokens": max_tokens,
            "ignore_eos": True,
            "n_probs": 50,  # ~4.5 KB a token: more than any socket buffer holds
            "messages": [{"role": "user", "content": "hello"}],
        }
    ).encode()
    s.sendall(
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        b"Content-Type: application/json\r\n"
        + f"Content-Length: {len(body)}\r\n\r\n".encode()
        + body
    )
    return s


def big_body(model: str, size: int) -> bytes:
    """Row 8: a JSON body of about ``size`` bytes of ``{}`` items."""
    head = json.dumps({"model": model, "max_tokens": 1, "messages": []})[:-3].encode()
    count = (size - len(head)) // 3
    return head + b"[" + b"{}," * (count - 1) + b"{}]}"


def post_raw(port: int, path: str, body: bytes, timeout: float = 120.0) -> tuple[int, float]:
    """POST ``body``; (HTTP status, seconds to the answer)."""
    start = time.monotonic()
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        s.sendall(
            f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode()
        )
        s.sendall(body)
        line = _status_line(s)
    return int(line.split()[1]) if line else 0, time.monotonic() - start


def _status_line(s: socket.socket) -> bytes:
    """The answer's first line (empty when the connection closed first)."""
    data = b""
    while b"\r\n" not in data:
        chunk = s.recv(4096)
        if not chunk:
            break
        data += chunk
    return data.partition(b"\r\n")[0]


@dataclass(frozen=True)
class Answer:
    status: int
    head: bytes
    body: bytes  # as sent (chunked framing left in)
    seconds: float


def send_raw(
    port: int,
    method: str,
    target: str,
    headers: dict[str, str] | None = None,
    body: bytes = b"",
    timeout: float = 120.0,
) -> Answer:
    """One request exactly as given (no encoding of the target, any header size), read to the
    end of the connection."""
    all_headers = {"Host": "127.0.0.1", **(headers or {})}
    head = f"{method} {target} HTTP/1.1\r\n" + "".join(
        f"{k}: {v}\r\n" for k, v in all_headers.items()
    )
    head += f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    start = time.monotonic()
    data = b""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        s.sendall(head.encode() + body)
        while chunk := s.recv(65536):
            data += chunk
    answer_head, _, answer_body = data.partition(b"\r\n\r\n")
    status = int(answer_head.split()[1]) if answer_head else 0
    return Answer(status, answer_head, answer_body, time.monotonic() - start)


def bearer(key: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"} if key else {}


# Issue 26's hostile texts: `a.a.a…` made the URL user-info pattern try every start.
DOTS_32K = "a." * 16_000
DOTS_40K = "a." * 20_000


def huge_host(port: int) -> Answer:
    """Row 2: no key, a 32 KB ``Host`` (refused by the Host check, before the key)."""
    return send_raw(port, "GET", "/models", {"Host": DOTS_32K})


def huge_origin(port: int) -> Answer:
    """Row 3: no key, a 32 KB ``Origin`` that CORS (``localhost``) skips with a warning."""
    return send_raw(port, "GET", "/health", {"Origin": "http://" + DOTS_32K})


def huge_model(port: int, key: str | None) -> Answer:
    """Row 4: with the key, a chat request for a 40 KB model name."""
    body = json.dumps({"model": DOTS_40K, "messages": [{"role": "user", "content": "hi"}]})
    headers = {"Content-Type": "application/json", **bearer(key)}
    return send_raw(port, "POST", "/v1/chat/completions", headers, body.encode())


def slot_paths(port: int, key: str | None, count: int, length: int = 8000) -> Answer:
    """Row 5: ``count`` slot actions on distinct ``length``-character slot ids (each a 400),
    then the scrape that used to render a label per path; the scrape's answer."""
    for i in range(count):
        send_raw(port, "POST", f"/slots/{i:08d}{'s' * (length - 8)}", bearer(key))
    return send_raw(port, "GET", "/metrics", bearer(key))


def ui_paths(port: int, count: int, pad: int = 0) -> list[int]:
    """Row 7: ``count`` distinct ``/%3F<n><pad>.js`` (a decoded ``%3F`` made them a query on
    the UI server's ``/``, a 200 kept under each path); their statuses."""
    return [send_raw(port, "GET", f"/%3F{i:08d}{'p' * pad}.js").status for i in range(count)]


def conversation_ids(
    port: int, key: str | None, model: str, count: int, length: int = 30_000
) -> list[Answer]:
    """Row 15: ``count`` chat requests, each with a distinct ``length``-character
    ``X-Conversation-Id``; the answers."""
    body = json.dumps(
        {"model": model, "max_tokens": 1, "messages": [{"role": "user", "content": "hi"}]}
    )
    headers = {"Content-Type": "application/json", **bearer(key)}
    return [
        send_raw(
            port,
            "POST",
            "/v1/chat/completions",
            {**headers, "X-Conversation-Id": f"{i:08d}{'c' * (length - 8)}"},
            body.encode(),
        )
        for i in range(count)
    ]


@dataclass
class Shutdown:
    """Row 17: what SIGTERM did with every kind of long-lived request open."""

    seconds: float = 0.0  # from SIGTERM to the agent's exit
    returncode: int | None = None
    answers: dict[str, str] = field(default_factory=dict)  # what each open request got


def shutdown_with_everything_open(
    port: int, proc: subprocess.Popen[bytes], model: str, wait: float = 120.0
) -> Shutdown:
    """A streamed chat, ``/models/sse``, a log follow and two tool calls (one streamed) that
    run ``sleep 50.25``, all open; then SIGTERM."""
    # Its own duration, to find it in the process list.
    tool = {"tool": "exec_shell_command", "params": {"command": "sleep 50.25", "timeout": 60}}
    chat_body = {
        "model": model,
        "stream": True,
        "max_tokens": 100_000,
        "ignore_eos": True,
        "messages": [{"role": "user", "content": "hello"}],
    }
    requests = {
        "stream": ("POST", "/v1/chat/completions", chat_body),
        "sse": ("GET", "/models/sse", None),
        "log follow": ("GET", f"/models/logs?model={model}&follow=1", None),
        "tool": ("POST", "/tools", tool),
        "streamed tool": ("POST", "/tools", {**tool, "stream": True}),
    }
    out = Shutdown()
    answering: set[str] = set()  # the requests whose answers have begun

    def one(name: str, method: str, path: str, body: Any) -> None:
        conn = HTTPConnection("127.0.0.1", port, timeout=wait)
        try:
            data = json.dumps(body).encode() if body is not None else None
            conn.request(method, path, data, {"Content-Type": "application/json"})
            response = conn.getresponse()
            answering.add(name)
            text = response.read().decode(errors="replace")
            out.answers[name] = f"{response.status} {text[-80:]!r}"
        except (OSError, HTTPException) as exc:
            out.answers[name] = f"{type(exc).__name__}: {exc}"
        finally:
            conn.close()

    threads = [
        threading.Thread(target=one, args=(name, *request), daemon=True)
        for name, request in requests.items()
    ]
    earlier = sleeping()  # a run just before may have left its own
    for thread in threads:
        thread.start()
    # All under way: the streams answer (the model loaded), the tools' sleeps started.
    deadline = time.monotonic() + 60
    while not ({"stream", "sse", "log follow"} <= answering and len(sleeping() - earlier) == 2):
        assert time.monotonic() < deadline, (answering, sleeping(), out.answers)
        time.sleep(0.05)
    start = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    try:
        out.returncode = proc.wait(wait)
    except subprocess.TimeoutExpired:
        proc.kill()
    out.seconds = time.monotonic() - start
    for thread in threads:
        thread.join(5)
    return out


def sleeping() -> set[int]:
    """The PIDs of the tools' ``sleep 50.25`` (shutdown_with_everything_open)."""
    return set(processes_with(b"sleep\x0050.25\x00"))


def noisy_llama_server(folder: Path, real: Path, lines: int = 640) -> Path:
    """Row 16: a llama-server that, run as a model's child, first writes ``lines`` lines of
    64 KB to stderr (640: the issue's 40 MB)."""
    script = folder / "llama-server"
    script.write_text(
        "#!/bin/sh\n"
        'case "$*" in *.gguf*)\n'
        f"  yes \"$(head -c 65535 /dev/zero | tr '\\0' x)\" | head -n {lines} >&2 ;;\n"
        "esac\n"
        f'exec {real} "$@"\n'
    )
    script.chmod(0o755)
    return script


def processes_with(argv: bytes) -> list[int]:
    """The pids whose command line is ``argv`` (NUL-separated, as /proc shows it)."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            if (entry / "cmdline").read_bytes() == argv:
                found.append(int(entry.name))
        except OSError:
            continue
    return found
