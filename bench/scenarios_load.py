"""S4–S6: the scenarios where loading, eviction and the size of the catalogue dominate.

These compare the two routers only (a direct child has nothing to evict or list). A run is
the unit here (a whole churn sequence, a whole burst, a whole start), so the targets take
turns run by run, each going first in turn.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import Counter

import aiohttp

from bench.client import RequestFailed, complete, get_json, keepalive_session
from bench.fleet import MEDIUM, SMALL, TINY, TINY_B, Bench, Fleet, rotation, scale_dir
from bench.procs import ROUTERS, Server
from bench.results_model import Goal, Metric, Resources, ScenarioResult, median, p99, scaled

MS = 1000.0


async def s4_churn(bench: Bench) -> ScenarioResult:
    n, reps = bench.sizes.s4_requests, bench.sizes.s4_reps
    models = (TINY, SMALL, MEDIUM)
    result = ScenarioResult(
        "S4",
        "Churn: --models-max 1, sequential requests alternating over 3 models",
        {"requests": n, "runs": reps, "models": list(models), "models_max": 1},
        ROUTERS,
    )
    totals: dict[str, list[float]] = {}
    latencies: dict[str, list[float]] = {}
    with Fleet(result) as fleet:
        await fleet.start_routers(bench, "S4", bench.models.dir, 1)
        session = keepalive_session(300)
        try:
            # Every run starts from the same state: the model the sequence ends on is loaded.
            last = models[(n - 1) % len(models)]
            for target in fleet.names:
                try:
                    await complete(session, fleet.servers[target].url, last)
                except RequestFailed as exc:
                    fleet.fail(target, exc)
            totals = {t: [] for t in fleet.names}
            latencies = {t: [] for t in fleet.names}
            fleet.mark()
            for rep in range(reps):
                for target in rotation(fleet.names, rep):
                    url = fleet.servers[target].url
                    start = time.perf_counter()
                    try:
                        for i in range(n):
                            model = models[i % len(models)]
                            latencies[target].append(await complete(session, url, model))
                    except RequestFailed as exc:
                        fleet.fail(target, exc)
                        continue
                    totals[target].append(time.perf_counter() - start)
            fleet.measure()
        finally:
            await session.close()
    for target in totals:
        result.add_samples(target, "total_s", totals[target])
        result.add_samples(target, "latency_s", latencies[target])
    result.metrics += [
        Metric(
            f"total time for {n} requests, median of runs",
            "s",
            {t: median(v) for t, v in totals.items()},
            (Goal("peer", "<=", 1.0),),
        ),
        Metric(
            "request latency, p99",
            "ms",
            {t: scaled(p99(v), MS) for t, v in latencies.items()},
        ),
    ]
    return result


async def _sample_children(server: Server, peak: list[int], stop: asyncio.Event) -> None:
    """Keep the most llama-server children seen alive at once (every 25 ms)."""
    while not stop.is_set():
        peak[0] = max(peak[0], len(server.children()))
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), 0.025)


async def _burst(bench: Bench, server: Server) -> tuple[float, list[float], Counter[str], int]:
    """S5's load: clients share one counter of requests; (seconds, latencies, errors, peak)."""
    sizes = bench.sizes
    models = (TINY, SMALL, MEDIUM, TINY_B)
    latencies: list[float] = []
    errors: Counter[str] = Counter()
    next_request = iter(range(sizes.s5_requests))
    connector = aiohttp.TCPConnector(limit=sizes.s5_clients)
    timeout = aiohttp.ClientTimeout(total=sizes.s5_deadline_s)

    async def client(session: aiohttp.ClientSession) -> None:
        for i in next_request:
            try:
                latencies.append(await complete(session, server.url, models[i % 4], 4))
            except RequestFailed as exc:
                errors[str(exc)[:120]] += 1

    peak = [0]
    stop = asyncio.Event()
    sampler = asyncio.create_task(_sample_children(server, peak, stop))
    start = time.perf_counter()
    try:
        async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
            clients = [client(session) for _ in range(sizes.s5_clients)]
            try:
                await asyncio.wait_for(asyncio.gather(*clients), sizes.s5_deadline_s)
            except TimeoutError:
                # Bounded in time: whatever did not finish counts as an error.
                unfinished = sizes.s5_requests - len(latencies) - sum(errors.values())
                errors[f"not finished within {sizes.s5_deadline_s:g} s"] += unfinished
    finally:
        elapsed = time.perf_counter() - start
        stop.set()
        await sampler
    return elapsed, latencies, errors, peak[0]


async def s5_concurrency(bench: Bench) -> ScenarioResult:
    sizes = bench.sizes
    result = ScenarioResult(
        "S5",
        "Concurrency: concurrent clients over 4 models with --models-max 2 (max_tokens 4)",
        {
            "clients": sizes.s5_clients,
            "requests": sizes.s5_requests,
            "runs": sizes.s5_reps,
            "models_max": 2,
        },
        ROUTERS,
    )
    throughput: dict[str, list[float]] = {}
    latencies: dict[str, list[float]] = {}
    failed: dict[str, int] = {}
    peaks: dict[str, int] = {}
    examples: dict[str, dict[str, int]] = {}
    with Fleet(result) as fleet:
        await fleet.start_routers(bench, "S5", bench.models.dir, 2)
        throughput = {t: [] for t in fleet.names}
        latencies = {t: [] for t in fleet.names}
        fleet.mark()
        for rep in range(sizes.s5_reps):
            for target in rotation(fleet.names, rep):
                elapsed, lat, errors, peak = await _burst(bench, fleet.servers[target])
                throughput[target].append(len(lat) / elapsed)
                latencies[target] += lat
                failed[target] = failed.get(target, 0) + sum(errors.values())
                peaks[target] = max(peaks.get(target, 0), peak)
                for message, count in errors.items():
                    examples.setdefault(target, {})[message] = count
        fleet.measure()
    for target in throughput:
        result.add_samples(target, "throughput_rps", throughput[target])
        result.add_samples(target, "latency_s", latencies[target])
    result.params["error_messages"] = examples
    result.metrics += [
        Metric(
            "throughput (successful requests/s), median of runs",
            "req/s",
            {t: median(v) for t, v in throughput.items()},
            (Goal("peer", ">=", 1.0),),
        ),
        Metric(
            "errors (all runs)",
            "",
            {t: float(v) for t, v in failed.items()},
            (Goal("abs", "==", 0.0),),
        ),
        Metric("children alive at once, max", "", {t: float(v) for t, v in peaks.items()}),
        Metric(
            "request latency, p99",
            "ms",
            {t: scaled(p99(v), MS) for t, v in latencies.items()},
        ),
    ]
    return result


async def s6_scale(bench: Bench) -> ScenarioResult:
    sizes = bench.sizes
    folder = scale_dir(bench.demo, bench.launcher.workdir / "scale", sizes.s6_models)
    result = ScenarioResult(
        "S6",
        f"Scale: a models directory of {sizes.s6_models} models; "
        "spawn to /health 200, then GET /models",
        {"models": sizes.s6_models, "starts": sizes.s6_starts, "lists": sizes.s6_lists},
        ROUTERS,
    )
    ready: dict[str, list[float]] = {t: [] for t in bench.routers()}
    listing: dict[str, list[float]] = {t: [] for t in bench.routers()}
    listed: dict[str, float] = {}
    used: dict[str, list[Resources]] = {t: [] for t in bench.routers()}
    for rep in range(sizes.s6_starts):
        for target in rotation(bench.routers(), rep):
            if target in result.errors:
                continue
            with Fleet(result) as fleet:
                server = bench.launcher.router(target, "S6", folder, 2)
                started = await fleet.start({target: server})
                if target not in started:
                    continue
                ready[target].append(started[target])
                try:
                    async with aiohttp.ClientSession() as session:
                        for _ in range(sizes.s6_lists):
                            elapsed, data = await get_json(session, server.url + "/models")
                            listing[target].append(elapsed)
                            listed[target] = float(len(data["data"]))
                except (RequestFailed, KeyError, TypeError) as exc:
                    fleet.fail(target, exc)
                    continue
                # Whole-life figures for a start: CPU from the spawn, the process's peak RSS.
                cpu = server.cpu()
                used[target].append(Resources(cpu.own, cpu.children, server.peak_rss_mib()))
    for target in ready:
        result.add_samples(target, "ready_s", ready[target])
        result.add_samples(target, "list_s", listing[target])
        if used[target]:
            result.resources[target] = Resources.combine(used[target])
    result.metrics += [
        Metric(
            "spawn to /health 200, median",
            "ms",
            {t: scaled(median(v), MS) for t, v in ready.items()},
            (Goal("peer", "<=", 1.0),),
        ),
        Metric(
            "GET /models, median",
            "ms",
            {t: scaled(median(v), MS) for t, v in listing.items()},
            (Goal("peer", "<=", 1.0),),
        ),
        Metric("models listed", "", dict(listed)),
    ]
    return result
