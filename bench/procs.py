"""The benchmark's servers as processes: start, wait until healthy, measure from /proc, stop.

Three kinds of target, started with the same binary, models and flags so that only the router
differs: ``corral`` (our agent), ``llama.cpp`` (the same llama-server binary in router mode)
and ``direct`` (one llama-server child for one model, as a router would start it: the
zero-overhead limit). Every process is started in a process group of its own (in the
benchmark's session: ``Launcher._spawn`` says why) and every child pid seen is remembered,
so :meth:`Server.stop` can leave nothing running even when a router dies or leaves orphans
behind.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp

CORRAL, PEER, DIRECT = "corral", "llama.cpp", "direct"
ROUTERS = (CORRAL, PEER)
TARGETS = (CORRAL, PEER, DIRECT)

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
REPO = Path(__file__).resolve().parents[1]
# Profiling hooks, for the benchmark only (nothing in the agent knows of them):
# CORRAL_BENCH_CPROFILE=DIR runs the agent under cProfile, which writes DIR/<label>-<port>.prof
# when the agent exits (SIGTERM ends it normally). Deterministic but slows Python code ~2×.
# CORRAL_BENCH_PYSPY=DIR attaches `py-spy record` (sampling, little overhead) to the agent and
# writes DIR/<label>-<port>.folded.txt (collapsed stacks, see bench/profile_summary.py) when
# the agent stops; needs py-spy on PATH.
PROFILE_ENV = "CORRAL_BENCH_CPROFILE"
PYSPY_ENV = "CORRAL_BENCH_PYSPY"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@dataclass(frozen=True)
class CpuTimes:
    """CPU seconds of a process itself, and of its llama-server children (live + reaped)."""

    own: float
    children: float

    def __sub__(self, other: CpuTimes) -> CpuTimes:
        return CpuTimes(self.own - other.own, self.children - other.children)


def _stat_fields(pid: int) -> list[str] | None:
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name sits in parentheses and may hold spaces: split after the last ')'.
    # Fields from there: [0] state, [1] ppid, … [11] utime, [12] stime, [13] cutime, [14] cstime.
    return text.rpartition(")")[2].split()


def _cpu_of(fields: list[str]) -> float:
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


def llama_children(pid: int) -> list[int]:
    """Live (not zombie) llama-server processes whose parent is ``pid``."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        fields = _stat_fields(int(entry.name))
        if fields is None or fields[0] == "Z" or int(fields[1]) != pid:
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if b"llama-server" in cmdline:
            found.append(int(entry.name))
    return found


@dataclass
class Server:
    """One target process on 127.0.0.1."""

    kind: str
    proc: subprocess.Popen[bytes]
    url: str
    log_path: Path
    started: float  # time.perf_counter() just before the spawn
    seen_children: set[int] = field(default_factory=set)
    profiler: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int:
        return self.proc.pid

    def children(self) -> list[int]:
        pids = llama_children(self.pid)
        self.seen_children.update(pids)
        return pids

    def cpu(self) -> CpuTimes:
        """CPU seconds so far. Children = reaped children's (cutime+cstime) + live children's."""
        fields = _stat_fields(self.pid)
        if fields is None:
            return CpuTimes(0.0, 0.0)
        reaped = (int(fields[13]) + int(fields[14])) / CLOCK_TICKS
        live = 0.0
        for child in self.children():
            child_fields = _stat_fields(child)
            if child_fields is not None:
                live += _cpu_of(child_fields)
        return CpuTimes(_cpu_of(fields), reaped + live)

    def peak_rss_mib(self) -> float:
        """VmHWM: the process's peak resident set, children excluded."""
        try:
            for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
        except OSError:
            pass
        return 0.0

    def log_tail(self, size: int = 3000) -> str:
        try:
            data = self.log_path.read_bytes()
        except OSError:
            return ""
        return data[-size:].decode(errors="replace")

    async def wait_healthy(self, limit_s: float = 60.0, interval: float = 0.002) -> float:
        """Poll ``/health`` until 200; return seconds since the spawn.

        The interval is short because S6 times exactly this; a refused connection costs
        microseconds, so polling fast does not slow the server down measurably.
        """
        deadline = time.perf_counter() + limit_s
        timeout_one = aiohttp.ClientTimeout(total=2)
        async with aiohttp.ClientSession(timeout=timeout_one) as session:
            while time.perf_counter() < deadline:
                if self.proc.poll() is not None:
                    raise RuntimeError(
                        f"{self.kind} exited with {self.proc.returncode}:\n{self.log_tail()}"
                    )
                try:
                    async with session.get(self.url + "/health") as response:
                        await response.read()
                        if response.status == 200:
                            return time.perf_counter() - self.started
                except (TimeoutError, aiohttp.ClientError):
                    pass
                await asyncio.sleep(interval)
        raise RuntimeError(f"{self.kind} not healthy after {limit_s} s:\n{self.log_tail()}")

    def stop(self, grace: float = 15.0) -> None:
        """SIGTERM, then SIGKILL; then end any child it left behind (by the pids seen)."""
        self.children()  # remember the last children before the parent goes
        if self.profiler is not None and self.profiler.poll() is None:
            # py-spy writes its profile on SIGINT; give it time to do so.
            self.profiler.send_signal(signal.SIGINT)
            try:
                self.profiler.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.profiler.kill()
                self.profiler.wait()
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        # The process group is the one made for this target (pgid = pid): the peer router's
        # children share it. Corral's children have groups of their own, hence the remembered
        # pids too.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.pid, signal.SIGKILL)
        for pid in self.seen_children:
            fields = _stat_fields(pid)
            if fields is None or fields[0] == "Z":
                continue
            try:
                if b"llama-server" in Path(f"/proc/{pid}/cmdline").read_bytes():
                    os.kill(pid, signal.SIGKILL)
            except OSError:
                pass


@dataclass(frozen=True)
class Launcher:
    """What every target shares: the binary, the context size, where logs go."""

    binary: Path
    ctx: int
    workdir: Path
    corral_args: tuple[str, ...] = ()  # --corral-args: on every agent's command line

    def _spawn(self, kind: str, label: str, argv: list[str], env: dict[str, str]) -> Server:
        port = int(argv[argv.index("--port") + 1])
        log_path = self.workdir / "logs" / f"{label}-{kind}-{port}.log"
        log_path.parent.mkdir(parents=True, exist_ok=True)
        with log_path.open("wb") as log:
            started = time.perf_counter()
            proc = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                cwd=REPO,
                # A group of its own (killed as one), in the benchmark's session: Linux's
                # autogroups give each session one share of the cores, so a target in a
                # session of its own competed with the others and the client as a block
                # (time-to-first-token outliers of 100-150 ms for every target, S2).
                process_group=0,
            )
        return Server(kind, proc, f"http://127.0.0.1:{port}", log_path, started)

    def router(
        self,
        kind: str,
        label: str,
        models_dir: Path,
        models_max: int,
        extra: Sequence[str] = (),
        corral_extra: Sequence[str] = (),
    ) -> Server:
        """Corral's agent or llama.cpp's router, with identical router flags (``extra``: more
        of them, which both pass on to their children, e.g. ``-np 1``)."""
        port = free_port()
        flags = [
            "--host", "127.0.0.1", "--port", str(port),
            "--models-dir", str(models_dir), "--models-max", str(models_max),
            "-c", str(self.ctx), *extra,
        ]  # fmt: skip
        # LLAMA_SERVER (not --llama-server) keeps the command lines identical; it is the
        # second place the agent looks for the binary (SPEC, "The llama-server binary").
        env = {**os.environ, "LLAMA_SERVER": str(self.binary)}
        if kind == CORRAL:
            # A state folder (warm swaps' saved caches) of its own per scenario.
            env["XDG_STATE_HOME"] = str(self.state_home(label))
            python = [sys.executable]
            profile_dir = os.environ.get(PROFILE_ENV)
            if profile_dir:
                Path(profile_dir).mkdir(parents=True, exist_ok=True)
                python += ["-m", "cProfile", "-o", f"{profile_dir}/{label}-{port}.prof"]
            argv = [
                *python, "-m", "node_agent.cli", "agent", *flags, *corral_extra, *self.corral_args
            ]  # fmt: skip
        elif kind == PEER:
            argv = [str(self.binary), *flags]
        else:
            raise ValueError(kind)
        server = self._spawn(kind, label, argv, env)
        pyspy_dir = os.environ.get(PYSPY_ENV)
        if kind == CORRAL and pyspy_dir:
            Path(pyspy_dir).mkdir(parents=True, exist_ok=True)
            out = f"{pyspy_dir}/{label}-{port}.folded.txt"
            server.profiler = subprocess.Popen(
                ["py-spy", "record", "--pid", str(server.pid), "--rate", "500",
                 "--format", "raw", "--output", out, "--nonblocking"],
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            )  # fmt: skip
        return server

    def state_home(self, label: str) -> Path:
        return self.workdir / "state" / label

    def direct(self, label: str, model: Path, alias: str, extra: Sequence[str] = ()) -> Server:
        """One child with the arguments llama.cpp's router gives its children (``extra``:
        the routers' own ``extra``, which they pass on)."""
        port = free_port()
        argv = [
            str(self.binary), "--host", "127.0.0.1", "--port", str(port),
            "--alias", alias, "--ctx-size", str(self.ctx), "--model", str(model), *extra,
        ]  # fmt: skip
        return self._spawn(DIRECT, label, argv, dict(os.environ))
