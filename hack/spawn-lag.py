#!/usr/bin/env python3
"""How long a child's spawn holds the agent's event loop (issue 13's leftovers: "fork_exec
blocks the event loop 6-10 ms per spawn under load").

Usage: ``python hack/spawn-lag.py [SPAWNS]`` (default 40), best with the machine busy (e.g.
two ``python -c "while 1: pass"``). A ticker wakes every 0.5 ms and records how late it is;
three runs: no spawns (the machine's own noise), the agent's own ``child.spawn.spawn``
(``subprocess.Popen`` on the loop thread, which waits there until the child has called
``exec``), and the same ``subprocess.Popen`` in a worker thread (what moving it off the loop
would give; the agent does not: a child's parent-death signal fires when the thread that started
it ends, and the default executor's threads end at its shutdown, not with the agent).
"""

from __future__ import annotations

import asyncio
import statistics
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

from node_agent.child.spawn import ChildConfig, child_argv, spawn

CONFIG = ChildConfig(name="lag", binary=Path("/bin/true"), args=())


async def _ticker(gaps: list[float], stop: asyncio.Event) -> None:
    last = time.perf_counter()
    while not stop.is_set():
        await asyncio.sleep(0.0005)
        now = time.perf_counter()
        gaps.append(now - last)
        last = now


async def _none() -> float:
    await asyncio.sleep(0.02)
    return 0.0


async def _on_loop() -> float:
    started = time.perf_counter()
    spawned = spawn(CONFIG, 0)
    took = time.perf_counter() - started
    await asyncio.sleep(0.02)
    await spawned.process.wait()
    spawned.process.stdout.close()
    spawned.stderr.close()
    return took


async def _in_thread() -> float:
    argv = child_argv(CONFIG, 0)
    started = time.perf_counter()
    proc = await asyncio.to_thread(subprocess.Popen, argv, process_group=0)  # as spawn()'s
    took = time.perf_counter() - started
    await asyncio.sleep(0.02)
    await asyncio.to_thread(proc.wait)
    return took


async def measure(what: str, step: Callable[[], Awaitable[float]], spawns: int) -> None:
    gaps: list[float] = []
    stop = asyncio.Event()
    tick = asyncio.create_task(_ticker(gaps, stop))
    await asyncio.sleep(0.1)
    first = len(gaps)
    spent = [await step() for _ in range(spawns)]
    stop.set()
    await tick
    lag = sorted(g - 0.0005 for g in gaps[first:])
    print(
        f"{what:>24}: loop late p50 {lag[len(lag) // 2] * 1e3:5.2f} ms, "
        f"p99 {lag[int(len(lag) * 0.99)] * 1e3:5.2f} ms, max {lag[-1] * 1e3:6.2f} ms; "
        f"the spawn call: median {statistics.median(spent) * 1e3:5.2f} ms"
    )


async def main(spawns: int) -> None:
    await measure("no spawn", _none, spawns)
    await measure("spawn() on the loop", _on_loop, spawns)
    await measure("Popen in a thread", _in_thread, spawns)


if __name__ == "__main__":
    asyncio.run(main(int(sys.argv[1]) if len(sys.argv) > 1 else 40))
