"""The soak: many clients, few slots, unloads mixed in, a busy machine: nothing lost, nothing
leaked.

``run_soak`` starts a router (Corral's agent, or llama.cpp's own on the same plan:
:mod:`.soak_targets`) on four demo models with ``--models-max 2 -c 512`` (issue 48's plan),
then runs ``clients`` concurrent clients until ``requests`` requests are done. The mix
(:data:`MIX`): chats, streams, streams that the client drops after 1 to 3 events, completions
(streamed or not), clients that hang up while their request waits, admin
``POST /models/unload`` and malformed requests. Which model a request names follows a
popularity (:data:`POPULARITY`) that is reshuffled every ``reshuffle_every`` requests. Each
client gives up after ``client_timeout`` seconds (60: a typical client's), and ``hog``
processes spin beside it, each a core's worth (other work on the machine).

What must hold (SPEC, "Admission"): an unload drains, so no request fails because of one, and
no request waits without an answer until its client gives up: every request that was not hung
up on gets 200 (a malformed one its 4xx), or one of ``DOCUMENTED`` errors. A sampler thread
checks every 50 ms that no more llama-server children than ``--models-max`` are alive (and,
for Corral, that its ledger holds no more than its limit). At the end, with the router idle
and every model unloaded, its open file descriptors, its tasks (Corral's asyncio tasks; the
router's threads) and children must be back where they were before the load, and Corral's log
must show no request sent to a stopping child.

The figures say where time went, for a run that crawled: each request's wait (time to the
first byte of its answer; p99 in the report), the children's own generation speed (the
``timings`` of their answers), the most threads one child ran, and a trace of every request
(``trace.jsonl`` in the work folder: when, which model, which kind, how it ended).

``hack/soak.py`` runs it in full; ``tests/integration/test_soak.py`` in a reduced size.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import random
import shutil
import sys
import tempfile
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from node_agent.demo_models import write_demo_models
from tests.integration.harness import children_of, http
from tests.integration.soak_targets import CORRAL, TARGETS, Hog, Target, start

MODELS = ("demo-tiny", "demo-small", "demo-medium", "demo-medium-b")
# Request kinds and their share of the requests.
MIX: tuple[tuple[str, float], ...] = (
    ("chat", 0.33),
    ("stream", 0.24),
    ("stream-dropped", 0.10),  # the client reads 1 to 3 events, then drops the connection
    ("completion", 0.08),
    ("completion-stream", 0.07),
    ("hangup-waiting", 0.05),  # the client hangs up within 0.3 s, most often while it waits
    ("unload", 0.08),  # admin POST /models/unload of a random model
    ("malformed", 0.05),
)
INFERENCE = frozenset(("chat", "stream", "completion", "completion-stream"))
# The models' popularity: weights, given to the models in an order reshuffled every
# SoakConfig.reshuffle_every requests.
POPULARITY = (8, 4, 2, 1)
# Errors a client may get by design, as (status, start of the message). With the soak's
# options none applies; they are listed so a configuration that enables them (e.g.
# --queue-timeout) counts them apart from failures.
DOCUMENTED: tuple[tuple[int, str], ...] = (
    (503, "too many requests are waiting for model"),  # --max-queue
    (503, "model '"),  # --queue-timeout: "... did not become available within the queue timeout"
)
# Corral's log lines that mean a request met a child that was not there to answer it.
PROXY_FAILURES = ("did not answer", "stopped mid-response", "is not running")
# Corral's lines about a child going, shown when the soak fails (the last STOPS_SHOWN).
STOP_WORDS = ("stopping model=", "exited", "wedged", "killing", "drain", "mid-response")
STOPS_SHOWN = 40
SAMPLE_EVERY = 0.05
GAVE_UP = "no answer within the client's timeout"
STALL = 5.0  # seconds without an event that make a stream count as stalled


@dataclass(frozen=True)
class SoakConfig:
    requests: int = 2000
    clients: int = 64
    models_max: int = 2
    # llama-server's slots share one KV cache of ctx-size cells (issue 48's plan: 512).
    ctx_size: int = 512
    client_timeout: float = 60.0  # a client gives up after this long (a typical client's)
    reshuffle_every: int = 250  # requests between two reshuffles of the models' popularity
    seed: int = 5
    hog: int = 0  # processes that spin beside the soak, each a core's worth
    target: str = CORRAL
    binary: str | None = None
    flags: tuple[str, ...] = ()  # more router flags, for either target (the plan's)
    corral_flags: tuple[str, ...] = ()  # more flags for Corral only (e.g. --memory-limit)


@dataclass
class Figures:
    target: str = CORRAL
    requests: int = 0
    successes: int = 0
    documented_errors: Counter[str] = field(default_factory=Counter)
    errors: Counter[str] = field(default_factory=Counter)
    disconnected: int = 0
    kinds: Counter[str] = field(default_factory=Counter)
    unloads: Counter[str] = field(default_factory=Counter)
    waits: list[float] = field(default_factory=list)  # inference requests' time to first byte
    rates: dict[str, list[float]] = field(default_factory=dict)  # children's own tokens/s
    gaps: list[float] = field(default_factory=list)  # streams' longest time between events
    invariant_samples: int = 0
    max_children: int = 0
    max_child_threads: int = 0
    max_ledger_held: int = 0
    ledger_limit: int = 0
    violations: list[str] = field(default_factory=list)
    error_log: list[str] = field(default_factory=list)  # when, which model, which kind
    agent_stops: list[str] = field(default_factory=list)  # Corral's stop lines, on failure
    leaks: dict[str, Any] = field(default_factory=dict)
    baseline: dict[str, Any] = field(default_factory=dict)  # the idle router's fds and tasks
    seconds: float = 0.0
    load_average: str = ""

    @property
    def failures(self) -> int:
        return sum(self.errors.values())

    @property
    def leaks_found(self) -> int:
        return sum(1 for value in self.leaks.values() if value)

    def p99_wait(self) -> float:
        return percentile(self.waits, 0.99)

    def ok(self) -> bool:
        return not self.errors and not self.violations and not self.leaks_found

    def report(self) -> str:
        rates = ", ".join(
            f"{model} p50 {percentile(r, 0.5):.0f} min {min(r):.1f}"
            for model, r in sorted(self.rates.items())
            if r
        )
        lines = [
            f"target              {self.target} (load average {self.load_average})",
            f"requests            {self.requests} in {self.seconds:.1f} s ({dict(self.kinds)})",
            f"successes           {self.successes}",
            f"disconnected        {self.disconnected} (clients that hung up: no response)",
            f"documented errors   {sum(self.documented_errors.values())} "
            f"{dict(self.documented_errors)}",
            f"failures            {self.failures} {dict(self.errors)}",
            f"wait p50/p99/max    {percentile(self.waits, 0.5):.2f} / {self.p99_wait():.2f} / "
            f"{max(self.waits, default=0.0):.2f} s (time to the first byte, inference)",
            f"children's tokens/s {rates} (their own timings)",
            f"stream gaps         max {max(self.gaps, default=0.0):.2f} s, "
            f"{sum(1 for g in self.gaps if g >= STALL)} of {len(self.gaps)} streams stalled "
            f">= {STALL:.0f} s (no event)",
            f"unload calls        {dict(self.unloads)}",
            f"invariant samples   {self.invariant_samples} (one every "
            f"{1000 * self.seconds / max(1, self.invariant_samples):.0f} ms)",
            f"max children seen   {self.max_children} (most threads in one: "
            f"{self.max_child_threads})",
            f"max ledger held     {self.max_ledger_held / 2**20:.1f} MiB "
            f"(limit {self.ledger_limit / 2**20:.1f} MiB)",
            f"violations          {len(self.violations)} {self.violations[:5]}",
            *(f"  error at {line}" for line in self.error_log[:10]),
            f"leaks found         {self.leaks_found} {self.leaks} (idle baseline: "
            f"{ {k: v if isinstance(v, int) else len(v) for k, v in self.baseline.items()} })",
            *(f"  agent: {line[:240]}" for line in self.agent_stops),
        ]
        return "\n".join(lines)


def percentile(values: list[float], q: float) -> float:
    """The ``q`` quantile of ``values`` (nearest rank); 0 for none."""
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


def prepare_models(folder: Path, cache: Path | None = None) -> Path:
    """The four soak models in ``folder``: the three demo models and a second medium."""
    # Not inside ``folder``: a subfolder of a models dir is a model of its own.
    source = cache or folder.with_name(folder.name + "-cache")
    write_demo_models(source)
    folder.mkdir(parents=True, exist_ok=True)
    for name in MODELS:
        target = folder / f"{name}.gguf"
        if not target.exists():
            shutil.copy(source / f"{name.removesuffix('-b')}.gguf", target)
    return folder


class Sampler(threading.Thread):
    """Checks the invariants every 50 ms, from outside the router (its /proc, its ledger)."""

    def __init__(self, target: Target, config: SoakConfig, figures: Figures) -> None:
        super().__init__(name="soak-sampler", daemon=True)
        self.target, self.config, self.figures = target, config, figures
        self.halt = threading.Event()
        self.ledger = target.kind == CORRAL  # until it answers 404: the ledger is off

    def run(self) -> None:
        figures = self.figures
        due = time.monotonic()
        # Fixed rate: a slow sample (a busy machine) shortens the wait, not the rate.
        while not self.halt.wait(max(0.0, due - time.monotonic())):
            due += SAMPLE_EVERY
            children = router_children(self.target.proc.pid)
            figures.max_children = max(figures.max_children, len(children))
            if len(children) > self.config.models_max:
                figures.violations.append(f"{len(children)} children alive")
            for child in children:
                figures.max_child_threads = max(figures.max_child_threads, threads_of(child))
            if self.ledger:
                self._ledger()
            figures.invariant_samples += 1

    def _ledger(self) -> None:
        figures = self.figures
        try:
            status, ledger = http("GET", self.target.url + "/ledger", timeout=5)
        except OSError as exc:
            figures.violations.append(f"/ledger unreachable: {exc}")
            return
        if status == 404:  # off (no --memory-limit, no --models-memory-margin)
            self.ledger = False
            return
        if status != 200:
            figures.violations.append(f"/ledger answered {status}")
            return
        for device in ledger["devices"]:
            held = sum(device["held"].values())
            limit = device["limit"]
            figures.ledger_limit = limit
            figures.max_ledger_held = max(figures.max_ledger_held, held)
            if held > limit:
                figures.violations.append(f"ledger {device['name']}: held {held} > {limit}")


@dataclass
class Outcome:
    """How one request ended: "ok", "disconnected", or what went wrong."""

    text: str
    wait: float | None = None  # seconds to the first byte of its answer
    rate: float | None = None  # the child's own tokens/s for it (its answer's timings)
    gap: float | None = None  # a stream's longest time between two events


class Load:
    """The clients: each sends one request after another, of the mix's kinds."""

    def __init__(self, target: Target, config: SoakConfig, figures: Figures, trace: Path) -> None:
        self.target, self.config, self.figures = target, config, figures
        self.random = random.Random(config.seed)
        self.issued = 0
        self.popularity: list[int] = list(POPULARITY)
        self.unloads: dict[str, list[float]] = {}  # model -> when it was unloaded (200s)
        self.started = time.monotonic()
        self.trace = trace.open("w")

    async def run(self) -> None:
        timeout = aiohttp.ClientTimeout(total=self.config.client_timeout)
        connector = aiohttp.TCPConnector(limit=0)
        try:
            async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
                await asyncio.gather(*(self._client(session) for _ in range(self.config.clients)))
        finally:
            self.trace.close()

    def _pick(self) -> tuple[str, str]:
        if self.issued % self.config.reshuffle_every == 0:
            self.random.shuffle(self.popularity)
        self.issued += 1
        kinds, shares = zip(*MIX, strict=True)
        kind = self.random.choices(kinds, shares)[0]
        return kind, self.random.choices(MODELS, self.popularity)[0]

    async def _client(self, session: aiohttp.ClientSession) -> None:
        while self.issued < self.config.requests:
            kind, model = self._pick()
            self.figures.kinds[kind] += 1
            self.figures.requests += 1
            began = time.monotonic()
            try:
                outcome = await getattr(self, "_" + kind.replace("-", "_"))(session, model)
            except TimeoutError:
                outcome = Outcome(GAVE_UP, self.config.client_timeout)
            except aiohttp.ClientError as exc:
                outcome = Outcome(f"client error {type(exc).__name__}: {exc}")
            self._count(outcome, model, kind, began)

    def _count(self, outcome: Outcome, model: str, kind: str, began: float) -> None:
        figures, text = self.figures, outcome.text
        if kind in INFERENCE and outcome.wait is not None:
            figures.waits.append(outcome.wait)
        if outcome.rate is not None:
            figures.rates.setdefault(model, []).append(outcome.rate)
        if outcome.gap is not None:
            figures.gaps.append(outcome.gap)
        if text == "ok":
            figures.successes += 1
        elif text == "disconnected":
            figures.disconnected += 1
        elif any(text.startswith(f"{s} {m}") for s, m in DOCUMENTED):
            figures.documented_errors[text[:80]] += 1
        else:
            figures.errors[text[:160]] += 1
            before = [t for t in self.unloads.get(model, ()) if t <= began]
            after = f", {began - before[-1]:.1f} s after its unload" if before else ""
            at = began - self.started
            figures.error_log.append(f"{at:.1f} s {model} {kind}{after}: {text[:200]}")
        record = {
            "t": round(began - self.started, 3),
            "end": round(time.monotonic() - self.started, 3),
            "model": model,
            "kind": kind,
            "outcome": text[:200],
            "wait": outcome.wait,
            "rate": outcome.rate,
            "gap": outcome.gap,
        }
        self.trace.write(json.dumps(record) + "\n")

    def _messages(self) -> list[dict[str, str]]:
        return [{"role": "user", "content": f"soak {self.random.random():.6f}"}]

    async def _chat(self, session: aiohttp.ClientSession, model: str) -> Outcome:
        body = {"model": model, "max_tokens": 8, "messages": self._messages()}
        return await self._plain(session, "/v1/chat/completions", body)

    async def _completion(self, session: aiohttp.ClientSession, model: str) -> Outcome:
        body = {"model": model, "max_tokens": 12, "prompt": f"soak {self.random.random():.6f}"}
        return await self._plain(session, "/v1/completions", body)

    async def _plain(self, session: aiohttp.ClientSession, path: str, body: Any) -> Outcome:
        sent = time.monotonic()
        async with session.post(self.target.url + path, json=body) as response:
            wait = time.monotonic() - sent
            data = await response.json(content_type=None)
            if response.status == 200 and isinstance(data, dict) and data.get("choices"):
                return Outcome("ok", wait, _rate(data.get("timings")))
            return Outcome(_error(response.status, data), wait)

    async def _stream(self, session: aiohttp.ClientSession, model: str) -> Outcome:
        body = {"model": model, "max_tokens": 24, "messages": self._messages(), "stream": True}
        return await self._streamed(session, "/v1/chat/completions", body)

    async def _completion_stream(self, session: aiohttp.ClientSession, model: str) -> Outcome:
        prompt = f"soak {self.random.random():.6f}"
        body = {"model": model, "max_tokens": 24, "prompt": prompt, "stream": True}
        return await self._streamed(session, "/v1/completions", body)

    async def _streamed(self, session: aiohttp.ClientSession, path: str, body: Any) -> Outcome:
        sent = time.monotonic()
        async with session.post(self.target.url + path, json=body) as response:
            if response.status != 200:
                text = (await response.read()).decode(errors="replace")
                return Outcome(
                    _error(response.status, _json_or_text(text)), time.monotonic() - sent
                )
            wait: float | None = None
            events: list[str] = []
            gap, last = 0.0, time.monotonic()
            async for line in response.content:
                now = time.monotonic()
                wait = wait if wait is not None else now - sent
                if line.startswith(b"data: "):
                    events.append(line[6:].decode(errors="replace").strip())
                    if len(events) > 1:
                        gap = max(gap, now - last)
                    last = now
            if not events or events[-1] != "[DONE]" or any('"error"' in e for e in events):
                return Outcome(f"stream ended badly: {events[-3:]!r}", wait, gap=gap)
            rate = None
            for event in reversed(events[:-1]):
                data = _json_or_text(event)
                if isinstance(data, dict) and "timings" in data:
                    rate = _rate(data["timings"])
                    break
            return Outcome("ok", wait, rate, gap)

    async def _stream_dropped(self, session: aiohttp.ClientSession, model: str) -> Outcome:
        body = {
            "model": model,
            "max_tokens": 200,
            "messages": self._messages(),
            "stream": True,
            "ignore_eos": True,
        }
        sent = time.monotonic()
        response = await session.post(self.target.url + "/v1/chat/completions", json=body)
        try:
            if response.status != 200:
                text = (await response.read()).decode(errors="replace")
                return Outcome(_error(response.status, _json_or_text(text)))
            wanted = self.random.randint(1, 3)
            async for line in response.content:
                if line.startswith(b"data: "):
                    wanted -= 1
                    if not wanted:
                        break
            return Outcome("disconnected", time.monotonic() - sent)
        finally:
            response.close()  # drops the connection: the router sees the client go

    async def _hangup_waiting(self, session: aiohttp.ClientSession, model: str) -> Outcome:
        """Hang up before the answer starts (most often while the model loads)."""
        try:
            async with asyncio.timeout(self.random.uniform(0.0, 0.3)):
                return await self._chat(session, model)
        except TimeoutError:
            return Outcome("disconnected")

    async def _unload(self, session: aiohttp.ClientSession, model: str) -> Outcome:
        model = self.random.choice(MODELS)  # the admin's pick, whatever is popular
        url = self.target.url + "/models/unload"
        async with session.post(url, json={"model": model}) as response:
            data = await response.json(content_type=None)
        message = data.get("error", {}).get("message", "") if response.status != 200 else ""
        self.figures.unloads[str(response.status)] += 1
        if response.status == 200:
            self.unloads.setdefault(model, []).append(time.monotonic())
            return Outcome("ok")
        # 400 "model is not running" is the documented answer for an idle model.
        if message == "model is not running":
            return Outcome("ok")
        return Outcome(f"unload: {_error(response.status, data)}")

    async def _malformed(self, session: aiohttp.ClientSession, model: str) -> Outcome:
        """A request a client got wrong: it must get its 4xx, and cost nobody else anything."""
        url = self.target.url + "/v1/chat/completions"
        which = self.random.randrange(3)
        if which == 0:
            response = await session.post(
                url,
                data=b'{"model": "' + model.encode() + b'", "messa',
                headers={"Content-Type": "application/json"},
            )
        elif which == 1:
            body = {"messages": self._messages(), "max_tokens": 4}  # no model
            response = await session.post(url, json=body)
        else:
            body = {"model": "no-such-model", "messages": self._messages(), "max_tokens": 4}
            response = await session.post(url, json=body)
        async with response:
            data = _json_or_text((await response.read()).decode(errors="replace"))
        if 400 <= response.status < 500:
            return Outcome("ok")
        return Outcome(f"malformed request {which}: {_error(response.status, data)}")


def _rate(timings: Any) -> float | None:
    """The child's own decode speed for one answer (tokens/s), from its ``timings``."""
    if not isinstance(timings, dict):
        return None
    rate = timings.get("predicted_per_second")
    return float(rate) if isinstance(rate, int | float) and timings.get("predicted_n") else None


def router_children(pid: int) -> list[int]:
    """Live llama-server processes whose parent is ``pid``, straight from its task list.

    Cheaper than ``children_of`` (which scans every process), so the sampler keeps its rate.
    """
    found: list[int] = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            children = (task / "children").read_text().split()
        except OSError:
            continue  # the thread ended meanwhile
        for child in children:
            try:
                stat = Path(f"/proc/{child}/stat").read_text()
                cmdline = Path(f"/proc/{child}/cmdline").read_bytes()
            except OSError:
                continue  # reaped meanwhile
            if stat.rpartition(")")[2].split()[0] != "Z" and b"llama-server" in cmdline:
                found.append(int(child))
    return found


def threads_of(pid: int) -> int:
    try:
        return len(os.listdir(f"/proc/{pid}/task"))
    except OSError:
        return 0


def _json_or_text(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return text


def _error(status: int, data: Any) -> str:
    if isinstance(data, dict) and isinstance(data.get("error"), dict):
        return f"{status} {data['error'].get('message')}"
    return f"{status} {str(data)[:120]}"


def settle(target: Target) -> None:
    """Idle and empty: every model unloaded, no child, no request anywhere."""
    target.unload_all()
    time.sleep(0.5)  # closed keep-alive connections and finished handlers are reaped


def router_flags(config: SoakConfig, models: Path) -> list[str]:
    flags = [
        "--models-dir", str(models), "--models-max", str(config.models_max),
        "-c", str(config.ctx_size), *config.flags,
    ]  # fmt: skip
    if config.target == CORRAL:
        flags += config.corral_flags
    return flags


def load_average() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def run_soak(config: SoakConfig, models: Path, workdir: Path) -> Figures:
    figures = Figures(target=config.target)
    with Hog(config.hog):
        target = start(config.target, router_flags(config, models), config.binary, workdir)
        try:
            _soak(target, config, figures, workdir)
        finally:
            target.stop()
        figures.leaks["children after stop"] = children_of(target.proc.pid)
        figures.load_average = load_average()
    return figures


def _soak(target: Target, config: SoakConfig, figures: Figures, workdir: Path) -> None:
    # Warm-up: load every model once, so that what the first loads allocate for good (log
    # rings, pooled connections' bookkeeping, executor threads) is in the baseline.
    for model in MODELS:
        status, body = http(
            "POST",
            target.url + "/v1/chat/completions",
            {"model": model, "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]},
        )
        if status != 200:
            raise RuntimeError(f"warm-up of {model}: {status} {body}")
    settle(target)
    base_fds, base_tasks = target.fds(), target.tasks()
    figures.baseline = {"fds": base_fds, "tasks": base_tasks}

    sampler = Sampler(target, config, figures)
    sampler.start()
    started = time.monotonic()
    try:
        asyncio.run(Load(target, config, figures, workdir / "trace.jsonl").run())
    finally:
        figures.seconds = time.monotonic() - started
        sampler.halt.set()
        sampler.join()

    # Leaks: with everything idle again, the router must be back at its baseline.
    settle(target)

    def extra_tasks() -> list[str]:
        return sorted((Counter(target.tasks()) - Counter(base_tasks)).elements())

    # Given time, as a busy machine may need: a handler or a child's owner ends a moment
    # after its connection or child did. What is still there after 10 s leaked.
    deadline = time.monotonic() + 10
    while (target.fds() > base_fds or extra_tasks()) and time.monotonic() < deadline:
        time.sleep(0.1)
    figures.leaks = {
        "fds": max(0, target.fds() - base_fds),
        "tasks": extra_tasks(),
        "children": children_of(target.proc.pid),
    }
    if target.kind != CORRAL:
        return
    log = target.log()
    for needle in PROXY_FAILURES:
        if needle in log:
            figures.violations.append(f"agent log: {log.count(needle)}x {needle!r}")
    if figures.errors or figures.violations:
        # Why a child went (the agent's own words), for a failure seen only under load.
        figures.agent_stops = [
            line for line in log.splitlines() if any(w in line for w in STOP_WORDS)
        ][-STOPS_SHOWN:]
    if "Traceback" in log:
        figures.violations.append("agent log: a traceback")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--target", choices=TARGETS, default=CORRAL)
    parser.add_argument("--requests", type=int, default=SoakConfig.requests)
    parser.add_argument("--clients", type=int, default=SoakConfig.clients)
    parser.add_argument("--models-max", type=int, default=SoakConfig.models_max)
    parser.add_argument("-c", "--ctx-size", type=int, default=SoakConfig.ctx_size)
    parser.add_argument("--client-timeout", type=float, default=SoakConfig.client_timeout)
    parser.add_argument("--seed", type=int, default=SoakConfig.seed)
    parser.add_argument(
        "--hog", type=int, default=0, help="processes that spin beside it, a core's worth each"
    )
    parser.add_argument("--llama-server", help="the binary (default: as the agent finds it)")
    parser.add_argument(
        "--flag", action="append", default=[], help="one more router flag, both targets"
    )
    parser.add_argument(
        "--corral-flag", action="append", default=[], help="one more flag for Corral only"
    )
    parser.add_argument(
        "--models", type=Path, help="a folder for the demo models (default: $CORRAL_TEST_MODELS)"
    )
    parser.add_argument("--keep", type=Path, help="copy the log and the trace into this folder")
    args = parser.parse_args(argv)
    config = SoakConfig(
        requests=args.requests,
        clients=args.clients,
        models_max=args.models_max,
        ctx_size=args.ctx_size,
        client_timeout=args.client_timeout,
        seed=args.seed,
        hog=args.hog,
        target=args.target,
        binary=args.llama_server,
        flags=tuple(args.flag),
        corral_flags=tuple(args.corral_flag),
    )
    with tempfile.TemporaryDirectory(prefix="corral-soak-") as tmp:
        workdir = Path(tmp)
        cache = args.models or (
            Path(os.environ["CORRAL_TEST_MODELS"]) if "CORRAL_TEST_MODELS" in os.environ else None
        )
        models = prepare_models(workdir / "models", cache)
        figures = run_soak(config, models, workdir)
        print(figures.report())
        keep = args.keep or (None if figures.ok() else Path(f"/tmp/corral-soak-{os.getpid()}"))
        if keep is not None:
            keep.mkdir(parents=True, exist_ok=True)
            for name in ("agent.log", "router.log", "trace.jsonl"):
                if (workdir / name).exists():
                    shutil.copy(workdir / name, keep / name)
            print(f"log and trace kept in {keep}")
    return 0 if figures.ok() else 1


if __name__ == "__main__":
    sys.exit(main())
