"""S9: the next turn of a long conversation after its model was swapped out and back (issue
28's warm swaps).

On the real model (SmolLM2-135M-Instruct) with ``--models-max 1``: a first turn of about 2,000
prompt tokens, one request to another model (which evicts the real one), then the second
turn, whose prompt is the first turn, its answer and a short new question. Measured on the
second turn: the prompt tokens the child evaluated (``timings.prompt_n``: the whole
conversation again when its cache was lost) and the time to its first token. The direct
child never leaves: the floor. Corral's warm folder is reported too (disk used).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp

from bench.client import CHAT, RequestFailed, complete, fresh_session
from bench.fleet import REAL, TINY, Bench, Fleet, rotation
from bench.procs import CORRAL, DIRECT, TARGETS
from bench.results_model import Goal, Metric, ScenarioResult, median, scaled
from node_agent.real_model import HOW_TO_GET

MS = 1000.0
# One slot, and a context that holds the conversation (the bench's -c is 1,024; the last -c
# given wins, in both routers and the child alike).
CHILD_ARGS = ("-np", "1", "-c", "4096")
# About 2,000 tokens of plain prose for SmolLM2's tokenizer (each sentence is ~16 tokens).
_SENTENCE = "The quick brown fox jumps over the lazy dog near the river bank today. "
_ASK = "Summarise this text in one line. "
NEXT_QUESTION = "And what did the fox do next, in one word?"


@dataclass(frozen=True)
class Turn:
    prompt_n: int  # prompt tokens the child evaluated
    ttft: float  # seconds from send to the first content chunk
    answer: str


async def _turn(session: aiohttp.ClientSession, url: str, messages: list[dict[str, str]]) -> Turn:
    body = {
        "model": REAL,
        "messages": messages,
        "max_tokens": 8,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    start = time.perf_counter()
    first: float | None = None
    prompt_n: int | None = None
    answer = ""
    try:
        async with session.post(url + CHAT, json=body) as response:
            if response.status != 200:
                raise RequestFailed(f"HTTP {response.status}: {(await response.read())[:300]!r}")
            async for raw in response.content:
                line = raw.strip()
                if not line.startswith(b"data: ") or line == b"data: [DONE]":
                    continue
                event: dict[str, Any] = json.loads(line[6:])
                timings = event.get("timings")
                if isinstance(timings, dict) and "prompt_n" in timings:
                    prompt_n = int(timings["prompt_n"])
                for choice in event.get("choices") or ():
                    text = (choice.get("delta") or {}).get("content")
                    if text:
                        answer += text
                        first = first or time.perf_counter()
    except (TimeoutError, aiohttp.ClientError, ValueError) as exc:
        raise RequestFailed(f"{type(exc).__name__}: {exc}") from exc
    if prompt_n is None:
        raise RequestFailed("no timings.prompt_n in the stream")
    return Turn(prompt_n, (first or time.perf_counter()) - start, answer)


def _folder_bytes(folder: Path) -> int:
    return sum(f.stat().st_size for f in folder.iterdir()) if folder.exists() else 0


async def s9_warm_swaps(bench: Bench) -> ScenarioResult:
    description = (
        "Warm swaps: a 2,000-token conversation's next turn after its model was swapped out "
        "and back (--models-max 1; the direct child never leaves)"
    )
    runs, first_turn = bench.sizes.s9_runs, _ASK + _SENTENCE * bench.sizes.s9_sentences
    params = {"model": REAL, "runs": runs, "models_max": 1}
    result = ScenarioResult("S9", description, params, TARGETS)
    if not bench.models.path(REAL).exists():
        result.errors = {t: HOW_TO_GET for t in TARGETS}
        return result
    evaluated: dict[str, list[float]] = {}
    ttfts: dict[str, list[float]] = {}
    first_n: list[float] = []
    with Fleet(result) as fleet:
        # Corral with its defaults: warm swaps are on without a flag (issue 48).
        await fleet.start_routers(bench, "S9", bench.models.dir, 1, CHILD_ARGS)
        await fleet.start_direct(bench, "S9", REAL, CHILD_ARGS)
        evaluated = {t: [] for t in fleet.names}
        ttfts = {t: [] for t in fleet.names}
        session = fresh_session()
        try:
            fleet.mark()
            for run in range(runs):
                for target in rotation(fleet.names, run):
                    url = fleet.servers[target].url
                    # Each run a conversation of its own: the cache of the last one never helps.
                    messages = [{"role": "user", "content": f"Run {run}. {first_turn}"}]
                    try:
                        one = await _turn(session, url, messages)
                        first_n.append(one.prompt_n)
                        if target != DIRECT:
                            await complete(session, url, TINY)  # the swap: REAL is evicted
                        messages += [
                            {"role": "assistant", "content": one.answer},
                            {"role": "user", "content": NEXT_QUESTION},
                        ]
                        two = await _turn(session, url, messages)
                    except RequestFailed as exc:
                        fleet.fail(target, exc)
                        continue
                    evaluated[target].append(two.prompt_n)
                    ttfts[target].append(two.ttft)
            fleet.measure()
        finally:
            await session.close()
        if CORRAL in fleet.servers:
            folder = bench.launcher.state_home("S9") / "corral" / "warm"
            result.params["corral_warm_folder_bytes"] = _folder_bytes(folder)
    for target in evaluated:
        result.add_samples(target, "prompt_n", evaluated[target])
        result.add_samples(target, "ttft_s", ttfts[target])
    result.params["first_turn_prompt_n_median"] = median(first_n)
    result.metrics += [
        Metric(
            "second turn: prompt tokens evaluated, median",
            "tokens",
            {t: median(v) for t, v in evaluated.items()},
        ),
        Metric(
            "second turn: time to first token, median",
            "ms",
            {t: scaled(median(v), MS) for t, v in ttfts.items()},
            (Goal("peer", "<=", 0.2),),
        ),
    ]
    return result
