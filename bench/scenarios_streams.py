"""S8: many streams at once through one child (issue 30).

``streams`` clients each stream ``tokens`` tokens at the same moment from one model served
with ``-np 8``: the aggregate tokens/s a client sees, and the router's own CPU seconds per
1,000 streamed chunks (the work a proxy does per token, which a fast GPU model multiplies).
Targets take turns run by run, the first place rotating.
"""

from __future__ import annotations

import asyncio
import time

from bench.client import RequestFailed, StreamTiming, fresh_session, stream
from bench.fleet import SMALL, Bench, Fleet, rotation
from bench.procs import TARGETS
from bench.results_model import Goal, Metric, ScenarioResult, median

RUNS = 3
SLOTS = ("-np", "8")


async def _burst(url: str, streams: int, tokens: int) -> tuple[float, list[StreamTiming]]:
    """Every stream at once; (seconds from the first send to the last token, timings)."""
    session = fresh_session()
    try:
        start = time.perf_counter()
        timings = await asyncio.gather(
            *(stream(session, url, SMALL, tokens) for _ in range(streams))
        )
        return time.perf_counter() - start, list(timings)
    finally:
        await session.close()


async def s8_streams(bench: Bench) -> ScenarioResult:
    streams, tokens = bench.sizes.s8_streams, bench.sizes.s8_tokens
    result = ScenarioResult(
        "S8",
        f"Many streams: {streams} concurrent streams of {tokens} tokens, ~5 MB model, -np 8",
        {"streams": streams, "tokens": tokens, "model": SMALL, "runs": RUNS, "slots": 8},
        TARGETS,
    )
    rates: dict[str, list[float]] = {}
    cpu_per_k: dict[str, list[float]] = {}
    with Fleet(result) as fleet:
        await fleet.start_routers(bench, "S8", bench.models.dir, 2, SLOTS)
        await fleet.start_direct(bench, "S8", SMALL, SLOTS)
        for target in list(fleet.names):
            try:
                await _burst(fleet.servers[target].url, 2, 8)  # load it, warm the paths
            except RequestFailed as exc:
                fleet.fail(target, exc)
        rates = {t: [] for t in fleet.names}
        cpu_per_k = {t: [] for t in fleet.names}
        fleet.mark()
        for run in range(RUNS):
            for target in rotation(fleet.names, run):
                server = fleet.servers.get(target)
                if server is None:
                    continue
                before = server.cpu()
                try:
                    seconds, timings = await _burst(server.url, streams, tokens)
                except RequestFailed as exc:
                    fleet.fail(target, exc)
                    continue
                chunks = sum(t.tokens for t in timings)
                rates[target].append(chunks / seconds)
                cpu_per_k[target].append((server.cpu() - before).own / chunks * 1000)
        fleet.measure()
    for target in rates:
        result.add_samples(target, "tokens_per_s", rates[target])
        result.add_samples(target, "cpu_s_per_1000_chunks", cpu_per_k[target])
    result.metrics += [
        Metric(
            "aggregate tokens/s, median of runs",
            "tok/s",
            {t: median(v) for t, v in rates.items()},
            (Goal("peer", ">=", 1.0),),
        ),
        Metric(
            "router CPU per 1,000 streamed chunks, median of runs",
            "s",
            {t: median(v) for t, v in cpu_per_k.items()},
            (Goal("peer", "<=", 2.0),),
        ),
    ]
    return result
