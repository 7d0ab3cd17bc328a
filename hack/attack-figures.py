#!/usr/bin/env python3
"""Acceptance 16.3 and 26: /health latency and the agent's memory under the issues' attacks,
with the agent's default limits (``--client-timeout 30``, ``--max-connections`` from
``ulimit -n``, here 512 as in issue 16).

Usage: ``hack/attack-figures.py [--models DIR] [ATTACK ...]`` (default: generate the demo models
in a temporary folder; run every attack). Prints one line per attack; issue 26's rows end with
the worst /health time and the RSS growth during the attack (the goal: under 250 ms and 64 MiB).
The attacks are ``tests/integration/attacks.py`` (the integration tests run them with short
limits and assert the outcome).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from node_agent.demo_models import write_demo_models
from node_agent.llama_server.binary import find_llama_server
from tests.integration.attacks import (
    Probe,
    big_body,
    conversation_ids,
    huge_host,
    huge_model,
    huge_origin,
    is_open,
    noisy_llama_server,
    post_raw,
    send_raw,
    shutdown_with_everything_open,
    slot_paths,
    slow_connections,
    stalled_stream,
    status_kib,
    ui_paths,
)
from tests.integration.harness import AgentProcess, chat, http
from tests.integration.hf_server import start_hub
from tests.integration.model_attacks import LEDGER, crafted_gguf
from tests.kubelet import write_configmap_volume

NOFILE = 512
KEY = "attack-figures-key"


def agent(models: Path, *extra: str) -> AgentProcess:
    # The agent inherits this process's descriptor limit: the issue's `ulimit -n 512`.
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (NOFILE, hard))
    try:
        return AgentProcess(["--models-dir", str(models), *extra])
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def slowloris(models: Path) -> None:
    a = agent(models)
    try:
        probe = Probe(a.port, a.proc.pid, interval=0.5)
        with probe.running():
            socks = slow_connections(a.port, idle=300, slow_head=300, slow_body=300)
            start = time.monotonic()
            time.sleep(2)
            open_at_2s = sum(map(is_open, socks))
            while any(map(is_open, socks)) and time.monotonic() - start < 120:
                time.sleep(1)
            gone = time.monotonic() - start
            left = sum(map(is_open, socks))
        print(
            f"slowloris (900 connections tried, {len(socks)} opened, ulimit -n {NOFILE}, "
            f"default limits): {open_at_2s} still open after 2 s, {left} after {gone:.0f} s; "
            f"{probe.summary()}"
        )
        for s in socks:
            s.close()
    finally:
        a.proc.terminate()
        a.proc.wait()


def non_readers(models: Path) -> None:
    a = agent(models, "-np", "2", "-c", "8192", "--queue-timeout", "5", "--max-queue", "1")
    try:
        assert a.post("/v1/chat/completions", chat("demo-tiny"))[0] == 200
        probe = Probe(a.port, a.proc.pid, interval=0.5)
        with probe.running():
            socks = [stalled_stream(a.port, "demo-tiny", 4000) for _ in range(2)]
            time.sleep(1)
            queued_seen = 0
            start = time.monotonic()
            status, _ = a.post("/v1/chat/completions", chat("demo-tiny"))
            normal = time.monotonic() - start
            while a.models()["demo-tiny"]["corral"]["in_flight"] and time.monotonic() < start + 120:
                queued_seen = max(queued_seen, a.models()["demo-tiny"]["corral"]["queued"])
                time.sleep(0.5)
            freed = time.monotonic() - start
        print(
            f"non-readers (-np 2, 2 streams never read, --queue-timeout 5 --max-queue 1): "
            f"a normal request got {status} after {normal:.1f} s; the slots were free again "
            f"{freed:.0f} s later; {probe.summary()}"
        )
        for s in socks:
            s.close()
    finally:
        a.proc.terminate()
        a.proc.wait()


def large_body(models: Path) -> None:
    a = agent(models, "--no-models-autoload")
    try:
        body = big_body("demo-tiny", 60 * 1000 * 1000)
        probe = Probe(a.port, a.proc.pid, interval=0.05)
        with probe.running():
            status, took = post_raw(a.port, "/v1/chat/completions", body)
        print(
            f"60 MB body of {{}} items (--max-body-size 64MiB): answered {status} in "
            f"{took:.1f} s; {probe.summary()}"
        )
    finally:
        a.proc.terminate()
        a.proc.wait()


# -- issue 26 ---------------------------------------------------------------------------------


def row(
    number: str, what: str, *extra: str
) -> Callable[[Callable[[AgentProcess], str]], Callable[[Path], None]]:
    """An issue 26 row: ``attack(agent)`` runs against a fresh agent (``extra`` its options)
    under a probe, and says what the attacker got; the line adds the probe's figures."""

    def wrap(attack: Callable[[AgentProcess], str]) -> Callable[[Path], None]:
        def run(models: Path) -> None:
            a = agent(models, *extra)
            try:
                probe = Probe(a.port, a.proc.pid, interval=0.1)
                with probe.running():
                    time.sleep(0.3)  # the first samples: the baseline
                    start = time.monotonic()
                    try:
                        outcome = attack(a)
                    except OSError as exc:  # e.g. no answer within the client's timeout
                        took = time.monotonic() - start
                        outcome = f"the attack failed after {took:.0f} s: {exc!r}"
                print(f"row {number} ({what}): {outcome}; {probe.figures()}", flush=True)
            finally:
                a.proc.terminate()
                a.proc.wait()

        run.__name__ = f"row{number}"
        return run

    return wrap


def issue_26_rows(models: Path) -> list[Callable[[Path], None]]:
    key = ("--api-key", KEY)
    auth = {"Authorization": f"Bearer {KEY}"}

    @row("2", "no key: 3 requests with a 32 KB Host of a.a.a…", *key)
    def row2(a: AgentProcess) -> str:
        answers = [huge_host(a.port) for _ in range(3)]
        return f"{answers[0].status} after {max(x.seconds for x in answers):.2f} s at most"

    @row(
        "3",
        "no key, CORS localhost: 3 requests with a 32 KB Origin",
        *key,
        "--cors-origins",
        "localhost",
    )
    def row3(a: AgentProcess) -> str:
        answers = [huge_origin(a.port) for _ in range(3)]
        return f"{answers[0].status} after {max(x.seconds for x in answers):.2f} s at most"

    @row(
        "4",
        "with the key: 3 chat requests for a 40 KB model name",
        *key,
        "--models-dir",
        str(models),
    )
    def row4(a: AgentProcess) -> str:
        answers = [huge_model(a.port, KEY) for _ in range(3)]
        return f"{answers[0].status} after {max(x.seconds for x in answers):.2f} s at most"

    @row("5", "4,000 POST /slots/<8 KB id>, then GET /metrics", *key, "--metrics")
    def row5(a: AgentProcess) -> str:
        scrape = slot_paths(a.port, KEY, 4000)
        size = len(scrape.body) / 1024
        return f"the scrape: {scrape.status}, {size:.0f} KiB in {scrape.seconds:.2f} s"

    @row("7", "no key: 8,000 GET /%3F<n>.js on the chat UI's paths", *key)
    def row7(a: AgentProcess) -> str:
        statuses = ui_paths(a.port, 8000, pad=100)
        return f"statuses {sorted(set(statuses))}"

    @row(
        "15",
        "4,000 chat requests with distinct 30 KB X-Conversation-Ids",
        *key,
        "--models-dir",
        str(models),
    )
    def row15(a: AgentProcess) -> str:
        answers = conversation_ids(a.port, KEY, "demo-tiny", 4000)
        return f"statuses {sorted({x.status for x in answers})}"

    @row(
        "16",
        "a child writes 40 MB to stderr (640 lines of 64 KB) as it loads",
        *key,
        "--models-dir",
        str(models),
        "--llama-server",
        str(noisy_llama_server(Path(tempfile.mkdtemp()), find_llama_server(None, os.environ))),
    )
    def row16(a: AgentProcess) -> str:
        status, _ = a.post("/v1/chat/completions", chat("demo-tiny"), headers=auth)
        return f"the chat request: {status}"

    bound = 30

    @row(
        "17",
        f"SIGTERM with a stream, SSE, a log follow and two tool calls open; --shutdown-timeout "
        f"{bound}",
        "--models-dir",
        str(models),
        "--tools",
        "all",
        "--shutdown-timeout",
        str(bound),
    )
    def row17(a: AgentProcess) -> str:
        out = shutdown_with_everything_open(a.port, a.proc, "demo-tiny")
        # (/health fails from the signal on, by design: the listener closes first.)
        return f"exit {out.returncode} after {out.seconds:.1f} s; the requests got {out.answers}"

    @row("19", "no key: GET /health%3F.x", *key)
    def row19(a: AgentProcess) -> str:
        send_raw(a.port, "GET", "/")  # the chat UI's server is up
        answer = send_raw(a.port, "GET", "/health%3F.x")
        return f"{answer.status} {answer.body[:60]!r}"

    @row(
        "20",
        "CORS localhost: a cross-site <img> GET /props?model=demo-tiny&autoload=1",
        "--models-dir",
        str(models),
        "--cors-origins",
        "localhost",
    )
    def row20(a: AgentProcess) -> str:
        img = {"Sec-Fetch-Site": "cross-site", "Sec-Fetch-Mode": "no-cors"}
        answer = send_raw(a.port, "GET", "/props?model=demo-tiny&autoload=1", img)
        state = a.models()["demo-tiny"]["status"]["value"]
        return f"{answer.status}, the model is {state}"

    return [row2, row3, row4, row5, row7, row15, row16, row17, row19, row20]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", type=Path)
    parser.add_argument("attacks", nargs="*", help="names to run (slowloris, row2…); all if none")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        models = args.models or Path(tmp)
        if args.models is None:
            write_demo_models(models)
        hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))  # the attacker's sockets
        attacks = [
            slowloris,
            non_readers,
            large_body,
            *issue_26_rows(models),
            issue26_model_files,
        ]
        for attack in attacks:
            if not args.attacks or attack.__name__ in args.attacks:
                attack(models)
    return 0


# -- issue 26, rows 6, 8, 9, 10 and 12: model files, operator presets, hub listings -------------
# Each prints the worst /health time and the agent's RSS growth while its attack runs.

ROW_SECONDS = 5.0  # how long each row hits GET /models
GIVE_UP = 20.0  # a GET /models that takes longer counts as frozen (the row ends there)


def _figures(probe: Probe, rss_before_kib: int) -> str:
    worst = max(probe.latencies, default=float("nan"))
    growth = (max(probe.rss_kib, default=rss_before_kib) - rss_before_kib) / 1024
    return f"worst /health {worst * 1000:.0f} ms, RSS growth {growth:.1f} MiB"


def _hit_models(a: AgentProcess, label: str) -> None:
    """GET /models and /v1/models for ROW_SECONDS under a probe, then print the row."""
    time.sleep(0.5)  # the agent's own start-up work settles
    rss = status_kib(a.proc.pid, "VmRSS")
    probe = Probe(a.port, a.proc.pid, interval=0.1)
    statuses: set[object] = set()
    slowest = 0.0
    with probe.running():
        end = time.monotonic() + ROW_SECONDS
        while time.monotonic() < end:
            for path in ("/models", "/v1/models"):
                start = time.monotonic()
                try:
                    statuses.add(a.get(path, timeout=GIVE_UP)[0])
                except OSError:
                    statuses.add(f"no answer in {GIVE_UP:.0f} s")
                    end = 0.0
                slowest = max(slowest, time.monotonic() - start)
    print(
        f"{label}: GET /models {sorted(map(str, statuses))}, slowest {slowest:.2f} s; "
        f"{_figures(probe, rss)}"
    )


def _end(a: AgentProcess) -> None:
    a.proc.kill()  # a frozen agent ignores SIGTERM (row 6 before the fix)
    a.proc.wait()


def row26_6_huge_layer_count(models: Path) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        shutil.copyfile(models / "demo-tiny.gguf", folder / "demo-tiny.gguf")
        crafted_gguf(folder / "huge.gguf", block_count=20_000_000)
        a = agent(folder, *LEDGER)
        try:
            _hit_models(a, "26.6 a 4 KB GGUF claiming 20,000,000 layers, ledger on")
        finally:
            _end(a)


def row26_6b_costly_estimates(models: Path) -> None:
    """Ten 160 KB headers at llama.cpp's limits (512 layers, a trained context of 2^32 - 1): no
    count is refused, but each estimate is ~0.2 s of arithmetic; no -c, so --fit's whole range
    is searched."""
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        for i in range(10):
            crafted_gguf(
                folder / f"wide{i}.gguf",
                block_count=512,
                layer_tensors=512,
                extra={"context_length": 2**32 - 1 - i, "embedding_length": 2**20},
            )
        a = agent(folder, "--models-memory-margin", "0")
        try:
            _hit_models(a, "26.6b ten GGUFs at llama.cpp's limits (512 layers, 2^32 context)")
        finally:
            _end(a)


def row26_8_inf_layer_count(models: Path) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        shutil.copyfile(models / "demo-tiny.gguf", folder / "demo-tiny.gguf")
        crafted_gguf(folder / "inf.gguf", block_count=math.inf)
        a = agent(folder, *LEDGER)
        try:
            _hit_models(a, "26.8 a GGUF whose layer count is the float inf, ledger on")
        finally:
            _end(a)


def row26_9_10_clashing_presets(models: Path) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        folder, volume = Path(tmp, "models"), Path(tmp, "presets")
        folder.mkdir()
        volume.mkdir()
        shutil.copyfile(models / "demo-tiny.gguf", folder / "local.gguf")
        other = models / "demo-small.gguf"
        files = {
            "preset-alias.ini": f"[taker]\nmodel = {other}\nalias = local\n",
            "preset-name.ini": f"[local]\nmodel = {other}\nctx-size = 256\n",
        }
        files["nodes.json"] = json.dumps({"files": sorted(files), "nodes": {"n": [0, 1]}})
        write_configmap_volume(volume, files, "v1")
        os.environ["NODE_NAME"] = "n"
        try:
            a = AgentProcess(["--models-dir", str(folder), "--models-preset", str(volume)])
        except AssertionError as exc:
            print(f"26.9/10 operator presets clashing with a models-dir model: no agent ({exc})")
            return
        finally:
            del os.environ["NODE_NAME"]
        try:
            body = a.get("/models")[1]
            refused = sorted(m for r in body.get("refused", []) for m in r["models"])
            local = next(m for m in body["data"] if m["id"] == "local")
            args = local["status"]["args"]
            file = Path(args[args.index("--model") + 1]).name if "--model" in args else "?"
            print(
                f"26.9/10 operator presets clashing with a models-dir model: refused {refused}; "
                f"'local' is {local['source']} on {file}"
            )
            _hit_models(a, "26.9/10 (the same agent, listed)")
        finally:
            _end(a)


def row26_12_nul_hub_path(models: Path) -> None:
    hub = start_hub()
    tiny = (models / "demo-tiny.gguf").read_bytes()
    hub.add("corral-test/nul", {"nul\x00-Q8_0.gguf": tiny})
    with tempfile.TemporaryDirectory() as tmp:
        env = {"HF_HOME": tmp, "MODEL_ENDPOINT": hub.url + "/", "LLAMA_CACHE": ""}
        a = AgentProcess([], env)
        try:
            rss = status_kib(a.proc.pid, "VmRSS")
            probe = Probe(a.port, a.proc.pid, interval=0.1)
            with probe.running():
                first = a.post("/models", {"model": "corral-test/nul:Q8_0"}, timeout=GIVE_UP)[0]
                time.sleep(1)
                state = a.models().get("corral-test/nul:Q8_0", {}).get("status", {}).get("value")
                try:
                    second = a.post("/models", {"model": "corral-test/nul:Q8_0"}, timeout=5)[1]
                    again = str(second.get("error", {}).get("message", second))[:60]
                except OSError:
                    again = "no answer in 5 s"
                start = time.monotonic()
                try:
                    url = f"{a.url}/models?model=corral-test/nul:Q8_0"
                    deleted = str(http("DELETE", url, timeout=5)[0])
                except OSError:
                    deleted = "no answer"
                took = time.monotonic() - start
            print(
                f"26.12 a hub file path holding NUL: POST {first}, then listed as {state}; "
                f"a second POST: {again!r}; DELETE {deleted} in {took:.1f} s; "
                f"{_figures(probe, rss)}"
            )
        finally:
            _end(a)
            hub.close()


def issue26_model_files(models: Path) -> None:
    for row in (
        row26_6_huge_layer_count,
        row26_6b_costly_estimates,
        row26_8_inf_layer_count,
        row26_9_10_clashing_presets,
        row26_12_nul_hub_path,
    ):
        row(models)


if __name__ == "__main__":
    sys.exit(main())
