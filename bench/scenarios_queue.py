"""S7: what a deep queue costs the router, per request (issue 27).

One model whose child serves one request at a time (``-np 1``), short completions
(``max_tokens 1``). First one client at a time (a queue of 1), then ``depth`` clients at once
(a queue of ``depth`` on that one slot): the router's own CPU seconds per request served in
each phase, and their ratio. A router whose every change wakes every waiter spends more per
request the deeper the queue; one that hands each freed slot to the next waiter does not.
"""

from __future__ import annotations

import asyncio

import aiohttp

from bench.client import RequestFailed, complete, keepalive_session
from bench.fleet import TINY, Bench, Fleet, rotation
from bench.procs import ROUTERS, CpuTimes
from bench.results_model import Goal, Metric, ScenarioResult

MS = 1000.0


async def _sequential(url: str, requests: int) -> None:
    session = keepalive_session()
    try:
        for _ in range(requests):
            await complete(session, url, TINY)
    finally:
        await session.close()


async def _deep(url: str, requests: int, depth: int) -> None:
    """``requests`` completions by ``depth`` clients at once, each on its own connection."""
    todo = iter(range(requests))
    connector = aiohttp.TCPConnector(limit=0)
    timeout = aiohttp.ClientTimeout(total=600)

    async def client(session: aiohttp.ClientSession) -> None:
        for _ in todo:
            await complete(session, url, TINY)

    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        await asyncio.gather(*(client(session) for _ in range(depth)))


async def s7_queue(bench: Bench) -> ScenarioResult:
    n, depth = bench.sizes.s7_requests, bench.sizes.s7_depth
    result = ScenarioResult(
        "S7",
        f"Queue depth: router CPU per request, one client vs {depth} at once on one slot "
        "(-np 1, max_tokens 1)",
        {"requests": n, "depth": depth, "model": TINY, "models_max": 1},
        ROUTERS,
    )
    per_request: dict[str, dict[int, float]] = {}
    with Fleet(result) as fleet:
        await fleet.start_routers(bench, "S7", bench.models.dir, 1, ("-np", "1"))
        for target in fleet.names:
            try:
                await _sequential(fleet.servers[target].url, 3)  # load it, warm the paths
            except RequestFailed as exc:
                fleet.fail(target, exc)
        per_request = {t: {} for t in fleet.names}
        fleet.mark()
        for i, clients in enumerate((1, depth)):
            for target in rotation(fleet.names, i):
                server = fleet.servers.get(target)
                if server is None:
                    continue
                before: CpuTimes = server.cpu()
                try:
                    if clients == 1:
                        await _sequential(server.url, n)
                    else:
                        await _deep(server.url, n, clients)
                except RequestFailed as exc:
                    fleet.fail(target, exc)
                    continue
                per_request[target][clients] = (server.cpu() - before).own / n
        fleet.measure()
    for target, values in per_request.items():
        result.add_samples(target, "cpu_per_request_s", [values[c] for c in sorted(values)])
    result.metrics += [
        Metric(
            "router CPU per request, queue of 1",
            "ms",
            {t: v.get(1, 0.0) * MS for t, v in per_request.items()},
        ),
        Metric(
            f"router CPU per request, queue of {depth}",
            "ms",
            {t: v.get(depth, 0.0) * MS for t, v in per_request.items()},
        ),
        Metric(
            f"ratio: queue of {depth} ÷ queue of 1",
            "×",
            {
                t: (v[depth] / v[1]) if v.get(1) and depth in v else None
                for t, v in per_request.items()
            },
            (Goal("abs", "<=", 1.5),),
        ),
    ]
    return result
