"""What peers cost each agent at rest: N real agents on loopback, each the others' ``--peer``,
no request at all; each agent's CPU seconds over a window, once every agent sees all others.

Issue 25's "each agent's CPU for peer updates". Run it against another checkout (an older
commit, in a worktree) with ``--repo`` to compare.

    python -m bench.peers_at_rest [--agents 8] [--models 40] [--seconds 30] [--repo PATH]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from bench.procs import REPO, free_port
from node_agent.demo_models import write_demo_models

KEY = "bench-peers-key"
TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / TICKS  # utime + stime


def answering(url: str) -> bool:
    try:
        with urllib.request.urlopen(url + "/health", timeout=1) as answer:
            return bool(answer.status == 200)
    except OSError:
        return False


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--agents", type=int, default=8)
    parser.add_argument("--models", type=int, default=40, help="models each agent lists")
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--repo", type=Path, default=REPO, help="the checkout to run")
    args = parser.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="corral-peers-"))
    write_demo_models(folder)
    tiny = folder / "demo-tiny.gguf"
    for i in range(args.models - 1):  # N models listed, one file
        (folder / f"model-{i:03}.gguf").symlink_to(tiny)
    ports = [free_port() for _ in range(args.agents)]
    urls = [f"http://127.0.0.1:{p}" for p in ports]
    logs_dir = Path(tempfile.mkdtemp(prefix="corral-peers-logs-"))  # not watched as models
    logs = [logs_dir / f"agent-{p}.log" for p in ports]
    procs = []
    for port, url, log in zip(ports, urls, logs, strict=True):
        peers = [w for other in urls if other != url for w in ("--peer", other)]
        argv = [sys.executable, "-m", "node_agent.cli", "agent", "--port", str(port)]
        argv += ["--models-dir", str(folder), "--api-key", KEY, "--memory-limit", "host=8GiB"]
        procs.append(
            subprocess.Popen(
                [*argv, *peers],
                cwd=args.repo,
                stdout=log.open("wb"),
                stderr=subprocess.STDOUT,
                env={**os.environ, "PYTHONPATH": str(args.repo)},
            )
        )
    try:
        deadline = time.monotonic() + 120
        while not all(
            answering(u) and log.read_text().count("answers (") >= args.agents - 1
            for u, log in zip(urls, logs, strict=True)
        ):
            if time.monotonic() > deadline:
                print("the agents never all saw each other", file=sys.stderr)
                return 1
            time.sleep(0.5)
        time.sleep(2)  # past the first views
        before = [cpu_seconds(p.pid) for p in procs]
        time.sleep(args.seconds)
        used = [cpu_seconds(p.pid) - b for p, b in zip(procs, before, strict=True)]
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            p.wait(30)
    per_second = sorted(u / args.seconds for u in used)
    print(
        f"{args.agents} agents, {args.models} models each, {args.seconds:g} s at rest: "
        f"CPU per agent median {statistics.median(per_second) * 1000:.1f} ms/s, "
        f"max {per_second[-1] * 1000:.1f} ms/s ({args.repo})"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
