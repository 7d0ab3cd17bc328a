"""Routing off against on: three real agents on loopback, 64 clients, three models.

Issue 19's acceptance 3. Three ``corral agent`` processes ("nodes"), ``--models-max 1`` each,
each with the same three demo models; 64 closed-loop clients, each asking a random agent (as a
Kubernetes Service would pick one) for a random model, ``max_tokens`` 4. Routing off: the
agents know nothing of each other. Routing on: each one is started with ``--peer`` for the two
others. Loads are summed from every agent's ``/metrics`` (``corral_model_loads_total``, the
loads that ended ready); latency is the client's, from request to the whole answer.

    python -m bench.routing [--requests 640] [--clients 64] [--seed 1]
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

import aiohttp

from bench.procs import REPO, free_port
from node_agent.demo_models import write_demo_models

MODELS = ("demo-tiny", "demo-small", "demo-medium")
NODES = 3
KEY = "bench-routing-key"
AUTH = {"Authorization": f"Bearer {KEY}"}


async def start_agents(folder: Path, routing: bool) -> list[tuple[asyncio.subprocess.Process, str]]:
    ports = [free_port() for _ in range(NODES)]
    urls = [f"http://127.0.0.1:{p}" for p in ports]
    agents = []
    for port, url in zip(ports, urls, strict=True):
        peers = [w for u in urls if u != url for w in ("--peer", u)] if routing else []
        args = ["--models-dir", str(folder), "--models-max", "1", "--api-key", KEY, *peers]
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "node_agent.cli", "agent", "--port", str(port), *args,
            cwd=REPO, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL,
        )  # fmt: skip
        agents.append((proc, url))
    async with aiohttp.ClientSession() as session:
        for _, url in agents:
            for _ in range(300):
                try:
                    async with session.get(url + "/health") as answer:
                        if answer.status == 200:
                            break
                except aiohttp.ClientError:
                    pass
                await asyncio.sleep(0.1)
            else:
                raise SystemExit(f"agent {url} did not become healthy")
    await asyncio.sleep(2.5)  # every peer view has polled its peers at least once
    return agents


async def loads(session: aiohttp.ClientSession, url: str) -> float:
    async with session.get(url + "/metrics", headers=AUTH) as answer:
        text = await answer.text()
    return sum(
        float(line.rpartition(" ")[2])
        for line in text.splitlines()
        if line.startswith("corral_model_loads_total{") and 'result="loaded"' in line
    )


async def run(folder: Path, routing: bool, requests: int, clients: int, seed: int) -> str:
    agents = await start_agents(folder, routing)
    urls = [url for _, url in agents]
    rng = random.Random(seed)
    plan = [(rng.choice(urls), rng.choice(MODELS)) for _ in range(requests)]
    latencies: list[float] = []
    failures = 0
    timeout = aiohttp.ClientTimeout(total=300)
    try:
        async with aiohttp.ClientSession(timeout=timeout) as session:

            async def client() -> None:
                nonlocal failures
                while plan:
                    url, model = plan.pop()
                    body = {
                        "model": model,
                        "messages": [{"role": "user", "content": "hi"}],
                        "max_tokens": 4,
                    }
                    asked = time.monotonic()
                    async with session.post(
                        url + "/v1/chat/completions", json=body, headers=AUTH
                    ) as answer:
                        await answer.read()
                        failures += answer.status != 200
                    latencies.append(time.monotonic() - asked)

            started = time.monotonic()
            await asyncio.gather(*(client() for _ in range(clients)))
            seconds = time.monotonic() - started
            total = sum([await loads(session, url) for url in urls])
    finally:
        for proc, _ in agents:
            proc.terminate()
        for proc, _ in agents:
            await proc.wait()
    cuts = statistics.quantiles(latencies, n=100)
    return (
        f"routing {'on ' if routing else 'off'}: {len(latencies)} requests ({failures} failed), "
        f"{total:.0f} loads, latency p50 {statistics.median(latencies):.3f}s "
        f"p99 {cuts[98]:.3f}s, {seconds:.1f}s"
    )


async def main(requests: int, clients: int, seed: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        write_demo_models(folder)
        for routing in (False, True):
            print(await run(folder, routing, requests, clients, seed), flush=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=640)
    parser.add_argument("--clients", type=int, default=64)
    parser.add_argument("--seed", type=int, default=1)
    options = parser.parse_args()
    asyncio.run(main(options.requests, options.clients, options.seed))
