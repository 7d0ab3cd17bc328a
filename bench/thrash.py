"""Two hot models, one slot: swaps per 100 requests without and with the minimum residency.

A real run of issue 19's acceptance 2 (the deterministic one is ``tests/unit/test_victims.py``):
the agent's registry with real llama-server children, ``--models-max 1``, two copies of the demo
medium model, two closed-loop clients per model (request with ``max_tokens`` 4, think 0.3 s),
100 requests; once with ``residency_factor`` 0 (plain LRU) and once with the agent's default.

    python -m bench.thrash [--requests 100]
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import aiohttp

from node_agent.agent import child_config
from node_agent.child.process import ChildProcess
from node_agent.child.state import ChildEvent
from node_agent.core.victims import RESIDENCY_FACTOR
from node_agent.demo_models import write_demo_models
from node_agent.llama_server.binary import find_llama_server
from node_agent.runtime.registry import Registry
from node_agent.sources.catalog import Catalog
from node_agent.sources.spec import ModelSpec

THINK_SECONDS = 0.3


async def run(folder: Path, binary: Path, factor: float, requests: int) -> dict[str, float]:
    specs = {
        name: ModelSpec(name, "preset", (("model", str(folder / f"{name}.gguf")),))
        for name in ("A", "B")
    }

    def factory(spec: ModelSpec, on_event: Callable[[ChildEvent], None]) -> ChildProcess:
        return ChildProcess(child_config(spec, binary), on_event=on_event)

    registry = Registry(
        Catalog(specs), models_max=1, child_factory=factory, residency_factor=factor
    )
    registry.start()
    loads = 0
    waits: list[float] = []
    done = 0
    events = registry.events()

    async def count_loads() -> None:
        nonlocal loads
        async for event in events:
            if event.event == "model_status" and (event.data or {}).get("status") == "loading":
                loads += 1

    async def client(name: str, session: aiohttp.ClientSession) -> None:
        nonlocal done
        body = {"model": name, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
        while done < requests:
            asked = time.monotonic()
            lease = await registry.acquire(name, autoload=True)
            waits.append(time.monotonic() - asked)
            try:
                url = f"http://127.0.0.1:{registry.port(lease)}/v1/chat/completions"
                async with session.post(url, json=body) as response:
                    await response.read()
            finally:
                registry.release(lease)
            done += 1
            await asyncio.sleep(THINK_SECONDS)

    counter = asyncio.create_task(count_loads())
    started = time.monotonic()
    async with aiohttp.ClientSession() as session:
        await asyncio.gather(*(client(n, session) for n in ("A", "A", "B", "B")))
    seconds = time.monotonic() - started
    await registry.close()
    counter.cancel()
    cuts = statistics.quantiles(waits, n=100)
    return {
        "swaps": float(loads - 1),
        "requests": float(done),
        "p50": statistics.median(waits),
        "p99": cuts[98],
        "seconds": seconds,
    }


async def main(requests: int) -> None:
    binary = find_llama_server(None, {})
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        write_demo_models(folder)
        for name in ("A", "B"):  # copies: two models whose pages are not shared
            shutil.copyfile(folder / "demo-medium.gguf", folder / f"{name}.gguf")
        for factor in (0.0, RESIDENCY_FACTOR):
            r = await run(folder, binary, factor, requests)
            print(
                f"residency factor {factor}: {r['swaps']:.0f} swaps in {r['requests']:.0f} "
                f"requests, wait p50 {r['p50']:.2f}s p99 {r['p99']:.2f}s, {r['seconds']:.1f}s"
            )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=100)
    asyncio.run(main(parser.parse_args().requests))
