"""The buffers a real llama-server logs at ``-lv 4``, read from its stderr until it is ready.

Shared by the estimator's accuracy test and hack/gpu-check.py (which runs where pytest is not
installed: nothing here imports it).
"""

from __future__ import annotations

import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

from tests.buffers import LoggedBuffers

# Lines after which every buffer has been logged (or the child has failed).
_DONE = ("server is listening", "listening on", "all slots are idle", "exiting due to")


def logged_buffers(
    binary: str, model: Path, args: list[str], private: list[int] | None = None
) -> tuple[LoggedBuffers, str]:
    """Run the child until it is ready and collect its logged buffer sizes (and any error).

    ``private``: gets the child's private dirty bytes (smaps_rollup) once it is ready.
    """
    cmd = [binary, "-m", str(model), "--host", "127.0.0.1", "--port", "0", "-lv", "4"]
    cmd += ["--no-warmup", *args]
    logged = LoggedBuffers()
    error = ""
    proc = subprocess.Popen(
        cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    timer = threading.Timer(60, proc.kill)  # a wedged child must not hang the suite
    timer.start()
    try:
        assert proc.stderr is not None
        lines: Iterator[bytes] = iter(proc.stderr.readline, b"")
        for line in lines:
            logged.feed(line)
            if b" E " in line and not error:
                error = line.decode(errors="replace").strip()
            if any(marker.encode() in line for marker in _DONE):
                if private is not None:
                    private.append(_private_dirty(proc.pid))
                break
    finally:
        timer.cancel()
        proc.kill()
        proc.wait()
        if proc.stderr is not None:
            proc.stderr.close()
    return logged, error


def _private_dirty(pid: int) -> int:
    for row in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
        if row.startswith("Private_Dirty:"):
            return int(row.split()[1]) * 1024
    raise AssertionError(f"no Private_Dirty in /proc/{pid}/smaps_rollup")
