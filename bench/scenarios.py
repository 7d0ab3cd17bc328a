"""The six scenarios of issue 6, each against Corral, llama.cpp's router and (where it applies)
a direct child, in one run.

Targets take turns within each scenario (request by request where requests are short, run by
run where a run is the unit), with the first place rotating: on a shared, noisy machine a
burst of load then lands on every target alike instead of on whichever ran during it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import aiohttp

from bench.client import (
    RequestFailed,
    complete,
    fresh_session,
    keepalive_session,
    model_states,
    stream,
    unload,
)
from bench.fleet import (
    MEDIUM,
    REAL,
    SMALL,
    TINY,
    Bench,
    Fleet,
    rotation,
    warm_page_cache,
)
from bench.procs import DIRECT, ROUTERS, TARGETS, Server
from bench.results_model import (
    Goal,
    Metric,
    ScenarioResult,
    median,
    p99,
    scaled,
)
from node_agent.real_model import HOW_TO_GET

MS = 1000.0


def _per_target(values: dict[str, list[float]], stat: Callable[[list[float]], float | None],
                factor: float = 1.0) -> dict[str, float | None]:  # fmt: skip
    return {t: scaled(stat(v), factor) for t, v in values.items()}


async def s1_overhead(bench: Bench) -> ScenarioResult:
    n = bench.sizes.s1_requests
    result = ScenarioResult(
        "S1",
        "Overhead: sequential non-streamed completions (max_tokens 1), warm ~1 MB model, "
        "one keep-alive connection per target",
        {"requests": n, "model": TINY, "models_max": 2},
        TARGETS,
    )
    latencies: dict[str, list[float]] = {}
    with Fleet(result) as fleet:
        await fleet.start_routers(bench, "S1", bench.models.dir, 2)
        await fleet.start_direct(bench, "S1", TINY)
        sessions = {t: keepalive_session() for t in fleet.names}
        try:
            for target in fleet.names:  # load the model, open the connection, warm the paths
                try:
                    for _ in range(5):
                        await complete(sessions[target], fleet.servers[target].url, TINY)
                except RequestFailed as exc:
                    fleet.fail(target, exc)
            latencies = {t: [] for t in fleet.names}
            fleet.mark()
            for i in range(n):
                for target in rotation(fleet.names, i):
                    try:
                        url = fleet.servers[target].url
                        latencies[target].append(await complete(sessions[target], url, TINY))
                    except RequestFailed as exc:
                        fleet.fail(target, exc)
            fleet.measure()
        finally:
            for session in sessions.values():
                await session.close()
    for target, values in latencies.items():
        result.add_samples(target, "latency_s", values)
    direct = latencies.get(DIRECT, [])
    added: dict[str, float | None] = {}
    for target in ROUTERS:
        values = latencies.get(target, [])
        if values and direct:
            if len(values) == len(direct):
                # Paired by round: both ran back to back, so the difference cancels drift.
                added[target] = median([a - b for a, b in zip(values, direct, strict=True)])
            else:
                added[target] = (median(values) or 0.0) - (median(direct) or 0.0)
    result.metrics += [
        Metric("latency, median", "ms", _per_target(latencies, median, MS)),
        Metric("latency, p99", "ms", _per_target(latencies, p99, MS)),
        Metric(
            "added latency (router − direct), median",
            "ms",
            {t: scaled(v, MS) for t, v in added.items()},
            (Goal("peer", "<=", 1.0), Goal("abs", "<", 1.0)),
        ),
    ]
    return result


async def s2_streaming(bench: Bench) -> ScenarioResult:
    n, tokens = bench.sizes.s2_streams, bench.sizes.s2_tokens
    return await _streaming(bench, "S2", f"{tokens}-token streamed completions, ~5 MB model",
                            SMALL, n, tokens)  # fmt: skip


async def s2_real_model(bench: Bench) -> ScenarioResult:
    """S2 on the real SmolLM2-135M-Instruct (98 MB, Q4_1): decode speed as a user sees it."""
    n, tokens = bench.sizes.s2r_streams, bench.sizes.s2r_tokens
    description = f"{tokens}-token streamed completions, the real SmolLM2-135M-Instruct (Q4_1)"
    if not bench.models.path(REAL).exists():
        result = ScenarioResult("S2R", description, {"model": REAL}, TARGETS)
        result.errors = {t: HOW_TO_GET for t in TARGETS}
        return result
    return await _streaming(bench, "S2R", description, REAL, n, tokens)


async def _streaming(
    bench: Bench, name: str, description: str, model: str, n: int, tokens: int
) -> ScenarioResult:
    result = ScenarioResult(
        name,
        f"Streaming: {description}",
        {"streams": n, "tokens": tokens, "model": model, "models_max": 2},
        TARGETS,
    )
    rates: dict[str, list[float]] = {}
    ttfts: dict[str, list[float]] = {}
    with Fleet(result) as fleet:
        await fleet.start_routers(bench, name, bench.models.dir, 2)
        await fleet.start_direct(bench, name, model)
        sessions = {t: fresh_session() for t in fleet.names}
        try:
            for target in fleet.names:
                try:
                    await stream(sessions[target], fleet.servers[target].url, model, 8)
                except RequestFailed as exc:
                    fleet.fail(target, exc)
            rates = {t: [] for t in fleet.names}
            ttfts = {t: [] for t in fleet.names}
            fleet.mark()
            for i in range(n):
                for target in rotation(fleet.names, i):
                    try:
                        url = fleet.servers[target].url
                        timing = await stream(sessions[target], url, model, tokens)
                    except RequestFailed as exc:
                        fleet.fail(target, exc)
                        continue
                    rates[target].append(timing.tokens / timing.total)
                    ttfts[target].append(timing.ttft)
            fleet.measure()
        finally:
            for session in sessions.values():
                await session.close()
    for target in rates:
        result.add_samples(target, "tokens_per_s", rates[target])
        result.add_samples(target, "ttft_s", ttfts[target])
    result.metrics += [
        Metric(
            "tokens/s, median",
            "tok/s",
            _per_target(rates, median),
            (Goal("direct", ">=", 0.98),),
        ),
        Metric("time to first token, median", "ms", _per_target(ttfts, median, MS)),
    ]
    return result


async def _wait_unloaded(session: aiohttp.ClientSession, server: Server, model: str) -> None:
    """Until the router says ``unloaded`` and its child for the model has really exited."""
    deadline = time.perf_counter() + 60
    while time.perf_counter() < deadline:
        states = await model_states(session, server.url)
        alive = [pid for pid in server.children() if f"/{model}.gguf".encode() in _cmdline(pid)]
        if states.get(model) == "unloaded" and not alive:
            return
        await asyncio.sleep(0.02)
    raise RequestFailed(f"{model} still not unloaded after 60 s")


def _cmdline(pid: int) -> bytes:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read()
    except OSError:
        return b""


async def s3_cold_start(bench: Bench) -> ScenarioResult:
    n = bench.sizes.s3_loads
    result = ScenarioResult(
        "S3",
        "Cold start: time to first token of a request naming an unloaded ~50 MB model "
        "(page cache warm; direct = spawn to first token)",
        {"loads": n, "model": MEDIUM, "models_max": 2},
        TARGETS,
    )
    warm_page_cache(bench.models.path(MEDIUM))
    ttfts: dict[str, list[float]] = {}
    with Fleet(result) as fleet:
        await fleet.start_routers(bench, "S3", bench.models.dir, 2)
        session = fresh_session()
        try:
            for target in fleet.names:  # the router's own code paths warm; tiny stays loaded
                try:
                    await complete(session, fleet.servers[target].url, TINY)
                except RequestFailed as exc:
                    fleet.fail(target, exc)
            names = [*fleet.names, *([DIRECT] if DIRECT in bench.targets else [])]
            ttfts = {t: [] for t in names}
            fleet.mark()
            for i in range(n):
                for target in rotation(names, i):
                    if target == DIRECT:
                        await _direct_cold_start(bench, result, session, ttfts[DIRECT])
                        continue
                    if target not in fleet.servers:
                        continue
                    server = fleet.servers[target]
                    try:
                        timing = await stream(session, server.url, MEDIUM, 1)
                        ttfts[target].append(timing.ttft)
                        await unload(session, server.url, MEDIUM)
                        await _wait_unloaded(session, server, MEDIUM)
                    except RequestFailed as exc:
                        fleet.fail(target, exc)
            fleet.measure()
        finally:
            await session.close()
    for target, values in ttfts.items():
        result.add_samples(target, "ttft_s", values)
    result.metrics += [
        Metric(
            "cold time to first token, median",
            "ms",
            _per_target(ttfts, median, MS),
            (Goal("peer", "<=", 0.9),),
        ),
        Metric("cold time to first token, max", "ms", _per_target(ttfts, max_or_none, MS)),
    ]
    return result


def max_or_none(values: list[float]) -> float | None:
    return max(values) if values else None


async def _direct_cold_start(
    bench: Bench, result: ScenarioResult, session: aiohttp.ClientSession, into: list[float]
) -> None:
    """The floor: spawn a child, poll /health every 2 ms, stream; seconds from the spawn."""
    if DIRECT in result.errors:
        return
    server = bench.launcher.direct("S3", bench.models.path(MEDIUM), MEDIUM)
    try:
        await server.wait_healthy()
        sent = time.perf_counter()
        timing = await stream(session, server.url, MEDIUM, 1)
        into.append(sent - server.started + timing.ttft)
    except (RequestFailed, RuntimeError) as exc:
        result.errors[DIRECT] = f"{type(exc).__name__}: {exc}"
    finally:
        server.stop()
