"""What the soak runs against: Corral's agent, or llama.cpp's own router, on one plan.

Both start with the same router flags (``--models-dir D --models-max N -c C`` and the plan's
extra flags), the same binary for their children, on 127.0.0.1 and a free port. Corral runs
through :mod:`tests.integration.task_census`, so its asyncio tasks can be counted; for
llama.cpp's router the leak check counts its threads instead (it serves each request on a
thread). :class:`Hog` is the other work of a busy machine: processes that spin, in a session
of their own, as a build in another terminal would.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tests.integration.harness import REPO, children_of, free_port, http, stop_process

CENSUS = Path(__file__).with_name("task_census.py")
CORRAL, ROUTER = "corral", "llama.cpp"
TARGETS = (CORRAL, ROUTER)


class Target:
    """One router under soak: its process, its log, and what the leak check reads."""

    kind = ""

    def __init__(self, argv: list[str], env: dict[str, str], log_path: Path, port: int) -> None:
        self.port = port
        self.url = f"http://127.0.0.1:{port}"
        self.log_path = log_path
        with log_path.open("wb") as log:
            self.proc = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                cwd=REPO,
                process_group=0,  # killed as one at the end, whatever it left
            )
        deadline = time.monotonic() + 60
        while self._health() != 200:
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"{self.kind} did not start:\n{self.log()[-3000:]}")
            time.sleep(0.05)

    def _health(self) -> int:
        try:
            return http("GET", self.url + "/health", timeout=1)[0]
        except OSError:
            return 0

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def models(self) -> dict[str, dict[str, Any]]:
        status, data = http("GET", self.url + "/models", timeout=30)
        assert status == 200, data
        return {m["id"]: m for m in data["data"]}

    def fds(self) -> int:
        return len(os.listdir(f"/proc/{self.proc.pid}/fd"))

    def tasks(self) -> list[str]:
        """What serves requests inside it, by name (leaks: more than before the load)."""
        raise NotImplementedError

    def unload_all(self) -> None:
        """Unload every running model and wait until the router has no child."""
        deadline = time.monotonic() + 60
        while children_of(self.proc.pid) or any(
            m["status"]["value"] != "unloaded" for m in self.models().values()
        ):
            for name, entry in self.models().items():
                if entry["status"]["value"] in ("loaded", "sleeping"):
                    http("POST", self.url + "/models/unload", {"model": name}, timeout=30)
            if time.monotonic() > deadline:
                raise RuntimeError(f"models did not unload: {self.models()}")
            time.sleep(0.1)

    def stop(self) -> None:
        stop_process(self.proc)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGKILL)  # anything of its group left behind


class Corral(Target):
    kind = CORRAL

    def __init__(self, flags: Sequence[str], binary: str | None, workdir: Path) -> None:
        port = free_port()
        self.census = workdir / "tasks.json"
        args = ["agent", "--host", "127.0.0.1", "--port", str(port), *flags]
        if binary:
            args += ["--llama-server", binary]
        env = {
            **os.environ,
            "CORRAL_TASK_CENSUS": str(self.census),
            # A state folder of its own (warm swaps' caches): the soak's, not the user's.
            "XDG_STATE_HOME": str(workdir / "state"),
        }
        super().__init__([sys.executable, str(CENSUS), *args], env, workdir / "agent.log", port)

    def tasks(self) -> list[str]:
        self.census.unlink(missing_ok=True)
        self.proc.send_signal(signal.SIGUSR1)
        deadline = time.monotonic() + 5
        while not self.census.exists():
            if time.monotonic() > deadline:
                raise RuntimeError("the agent wrote no task census")
            time.sleep(0.02)
        names: list[str] = json.loads(self.census.read_text())
        return names


class Router(Target):
    """llama.cpp's own router: the same llama-server binary, started without a model."""

    kind = ROUTER

    def __init__(self, flags: Sequence[str], binary: str, workdir: Path) -> None:
        port = free_port()
        argv = [binary, "--host", "127.0.0.1", "--port", str(port), *flags]
        super().__init__(argv, dict(os.environ), workdir / "router.log", port)

    def tasks(self) -> list[str]:
        names = []
        for task in Path(f"/proc/{self.proc.pid}/task").iterdir():
            try:
                names.append((task / "comm").read_text().strip())
            except OSError:
                continue  # the thread ended meanwhile
        return sorted(names)


def start(kind: str, flags: Sequence[str], binary: str | None, workdir: Path) -> Target:
    if kind == CORRAL:
        return Corral(flags, binary, workdir)
    if kind == ROUTER:
        if binary is None:
            from node_agent.llama_server.binary import find_llama_server

            binary = str(find_llama_server(None, os.environ))
        return Router(flags, binary, workdir)
    raise ValueError(f"unknown target {kind!r}; known: {', '.join(TARGETS)}")


class Hog:
    """``count`` processes that spin, each a core's worth, in a session of their own (with
    Linux's autogroups a session shares the cores as one: other work on the machine)."""

    def __init__(self, count: int) -> None:
        spin = "while True: pass"
        self.procs = [
            subprocess.Popen([sys.executable, "-c", spin], start_new_session=True)
            for _ in range(count)
        ]

    def __enter__(self) -> Hog:
        return self

    def __exit__(self, *exc: object) -> None:
        for proc in self.procs:
            proc.kill()
            proc.wait()
