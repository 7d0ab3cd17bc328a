#!/usr/bin/env python3
"""Acceptance 16.3 and 26: /health latency and the agent's memory under the issues' attacks,
with the agent's default limits (``--client-timeout 30``, ``--max-connections`` from
``ulimit -n``, here 512 as in issue 16).

Usage: ``hack/attack-figures.py [--models DIR] [ATTACK ...]`` (default: generate the demo models
in a temporary folder; run every attack). Prints one line per attack; issue 26's rows end with
the worst /health time and the RSS growth during the attack (the goal: under 250 ms and 64 MiB);
issue 50's row 7 (10,000 model files dropped in, listed by four clients at once, then deleted)
gives the worst and p99 /health time and the RSS at the start, with them, and after them.
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
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

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
    processes_with,
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
            *TOOL_ATTACKS,
            row50_7_many_models,
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


# --- Issue 26, rows 1, 11, 13 and 14: what a tool call sends ----------------------------------
# Each line: the attack's outcome, then the worst /health time another client saw meanwhile and
# the agent's RSS growth (goal: under 250 ms and 64 MiB). tests/integration/test_tools_attacks.py
# runs the same attacks and asserts the outcome.


def _stop_hard(a: AgentProcess) -> None:
    """SIGTERM, then SIGKILL after 15 s (a frozen loop never handles SIGTERM)."""
    a.proc.terminate()
    try:
        a.proc.wait(15)
    except subprocess.TimeoutExpired:
        a.proc.kill()
        a.proc.wait()


def _tool(a: AgentProcess, name: str, params: dict[str, Any]) -> tuple[str, float]:
    """The answer (cut to 100 characters) and how many seconds it took; 70 s at most."""
    start = time.monotonic()
    try:
        _, body = http("POST", f"{a.url}/tools", {"tool": name, "params": params}, timeout=70)
        answer = json.dumps(body)[:100]
    except OSError as exc:
        answer = f"no answer ({exc})"
    return answer, time.monotonic() - start


def _probed(a: AgentProcess, *calls: tuple[str, dict[str, Any]]) -> str:
    """Tool calls, one after the other, while a probe times /health every 100 ms: their
    answers and the figures, as one line."""
    before = status_kib(a.proc.pid, "VmRSS")
    probe = Probe(a.port, a.proc.pid, interval=0.1)
    with probe.running():
        answers = [_tool(a, name, params) for name, params in calls]
    failed = sum(1 for x in probe.latencies if x == float("inf"))
    worst = max(probe.latencies) * 1000
    growth = (max(probe.rss_kib) - before) / 1024
    said = "; ".join(f"answered {answer} in {took:.1f} s" for answer, took in answers)
    return (
        f"{said}; worst /health {worst:.0f} ms ({failed} of {len(probe.latencies)} probes "
        f"failed), RSS growth {growth:.1f} MiB"
    )


def tool_grep_backtracking(models: Path) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        Path(tmp, "a.txt").write_text("a" * 40 + "\n")
        a = agent(models, "--tools", "all")
        try:
            figures = _probed(a, ("grep_search", {"path": tmp, "pattern": "(a+)+$b"}))
        finally:
            _stop_hard(a)
    print(f"row 1, grep_search (a+)+$b over a line of 40 a: {figures}")


def tool_edits_and_glob(models: Path) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        big = Path(tmp, "big.txt")
        line = "x" * 90 + "\n"
        big.write_text("".join(f"<m{i}>{line}" if i % 500 == 0 else line for i in range(110_000)))
        edits = [{"old_text": f"<m{i}>", "new_text": f"<M{i}>"} for i in range(0, 100_000, 500)]
        files = Path(tmp, "files")
        files.mkdir()
        for i in range(1400):
            (files / f"file-{i:04d}-{'y' * 40}.txt").touch()
        a = agent(models, "--tools", "all")
        try:
            edited = _probed(a, ("edit_file", {"path": str(big), "edits": edits}))
            include = "*a" * 300
            globbed = _probed(a, ("file_glob_search", {"path": str(files), "include": include}))
        finally:
            _stop_hard(a)
    print(f"row 14, edit_file with 200 edits on a 10 MB file: {edited}")
    print(f"row 14, file_glob_search with a 600-token glob over 1,400 files: {globbed}")


def tool_setsid_children(models: Path) -> None:
    a = agent(models, "--tools", "all")
    timed, stopped = b"sleep\x00777.5\x00", b"sleep\x00777.6\x00"
    try:
        params = {"command": "setsid sleep 777.5 & echo x", "timeout": 2}
        figures = _probed(a, ("exec_shell_command", params))
        time.sleep(1)
        after_timeout = len(processes_with(timed))
        command = "setsid sleep 777.6 </dev/null >/dev/null 2>&1 & sleep 60"
        params = {"command": command, "timeout": 60}
        caller = threading.Thread(target=_tool, args=(a, "exec_shell_command", params))
        caller.start()
        deadline = time.monotonic() + 20
        while not processes_with(stopped) and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        _stop_hard(a)
    time.sleep(1)
    after_shutdown = len(processes_with(stopped))
    for pid in processes_with(timed) + processes_with(stopped):
        os.kill(pid, signal.SIGKILL)
    caller.join()
    print(
        f"row 13, exec_shell_command 'setsid sleep 777 &': {after_timeout} left after the "
        f"tool's timeout, {after_shutdown} after the agent's shutdown; {figures}"
    )


LOUD_MCP = """\
import json, sys
loud = True
for line in sys.stdin:
    msg = json.loads(line)
    if "id" not in msg:
        continue
    if msg["method"] == "initialize":
        result = {"protocolVersion": "2024-11-05", "capabilities": {"tools": {}}}
    elif msg["method"] == "tools/list":
        result = {"tools": [{"name": "ping", "description": "pong", "inputSchema": {}}]}
    else:
        if loud:  # one line over the agent's 8 MiB, then more than a pipe and a buffer hold
            sys.stderr.write("x" * (9 * 1024 * 1024) + "\\n")
            for i in range(20_000):
                sys.stderr.write(f"line {i} " + "y" * 1000 + "\\n")
            loud = False
        sys.stderr.write("z" * 100_000 + "\\n")
        result = {"content": [{"type": "text", "text": "pong"}]}
    print(json.dumps({"jsonrpc": "2.0", "id": msg["id"], "result": result}), flush=True)
"""


def mcp_long_stderr_line(models: Path) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        script = Path(tmp, "loud.py")
        script.write_text(LOUD_MCP)
        servers = {"loud": {"command": sys.executable, "args": [str(script)], "timeout_ms": 10_000}}
        a = agent(models, "--mcp-servers-json", json.dumps({"mcpServers": servers}))
        try:
            figures = _probed(a, *[("loud_ping", {})] * 3)
        finally:
            _stop_hard(a)
    print(
        f"row 11, an MCP server writes one 9 MiB stderr line at its first call, 3 calls: {figures}"
    )


TOOL_ATTACKS = (
    tool_grep_backtracking,
    mcp_long_stderr_line,
    tool_setsid_children,
    tool_edits_and_glob,
)


# -- issue 50, row 7: 10,000 model files ------------------------------------------------------

MANY_MODELS = 10_000


def row50_7_many_models(models: Path) -> None:
    """Drop 10,000 model files (links of demo-tiny) into a watched folder, list them from four
    clients at once (GET /models, /v1/models, /api/tags, three times each), delete them."""
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        a = agent(folder, "-c", "512")
        try:
            time.sleep(1.0)  # its start-up work settles
            start = status_kib(a.proc.pid, "VmRSS") / 1024
            probe = Probe(a.port, a.proc.pid, interval=0.02)
            with probe.running():
                for i in range(MANY_MODELS):
                    os.link(models / "demo-tiny.gguf", folder / f"m{i:05d}.gguf")
                while f"{MANY_MODELS} added" not in a.log():
                    time.sleep(0.1)
                reloading = list(probe.latencies)

                def lists() -> None:
                    for _ in range(3):
                        for path in ("/models", "/v1/models", "/api/tags"):
                            a.get(path, timeout=120)

                listers = [threading.Thread(target=lists) for _ in range(4)]
                for lister in listers:
                    lister.start()
                for lister in listers:
                    lister.join()
            peak = status_kib(a.proc.pid, "VmRSS") / 1024
            for file in folder.iterdir():
                file.unlink()
            while f"{MANY_MODELS} removed" not in a.log():
                time.sleep(0.1)
            time.sleep(1.0)
            after = status_kib(a.proc.pid, "VmRSS") / 1024
            listing = sorted(probe.latencies[len(reloading) :])
            print(
                f"  (the reload's worst /health {max(reloading, default=0) * 1000:.0f} ms, "
                f"the listings' {max(listing, default=0) * 1000:.0f} ms)"
            )
            latencies = sorted(probe.latencies)
            p99 = latencies[int(len(latencies) * 0.99)] if latencies else float("nan")
            print(
                f"row 50.7 ({MANY_MODELS} model files, 4 listing clients): /health worst "
                f"{latencies[-1] * 1000:.0f} ms, p99 {p99 * 1000:.0f} ms ({len(latencies)} "
                f"probes); RSS {start:.0f} -> {peak:.0f} MiB with them -> {after:.0f} MiB after"
            )
        finally:
            _end(a)


if __name__ == "__main__":
    sys.exit(main())
