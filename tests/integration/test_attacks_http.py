"""Issue 26's attacks on the agent's HTTP side, against a real agent: nothing a client sends may
freeze the event loop every client shares.

Each test runs an attack from ``attacks.py`` while a :class:`Probe` times ``/health`` and asserts
what the client gets and that ``/health`` kept answering; ``hack/attack-figures.py`` runs the
same attacks at the issue's sizes and prints the figures.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from node_agent.llama_server.binary import find_llama_server
from tests.integration.attacks import (
    Answer,
    Probe,
    conversation_ids,
    huge_host,
    huge_model,
    huge_origin,
    noisy_llama_server,
    send_raw,
    shutdown_with_everything_open,
    slot_paths,
    ui_paths,
)

KEY = "attack-test-key"
# The worst /health the loop may show during an attack here (the goal is 250 ms; a loaded CI
# machine gets slack). Before issue 26 these attacks held it 20-34 s.
WORST_HEALTH_MS = 1000


def message(answer: Answer) -> str:
    return str(json.loads(answer.body)["error"]["message"])


def test_row_2_a_huge_host_is_refused_at_once_and_echoed_short(start_agent: Any) -> None:
    agent = start_agent("--api-key", KEY)
    probe = Probe(agent.port, agent.proc.pid)
    with probe.running():
        answer = huge_host(agent.port)
    assert answer.status == 403
    shown = message(answer)
    assert shown.startswith("Host 'a.a.a.") and "(32000 characters)" in shown
    assert len(shown) < 1000
    assert probe.worst_ms() < WORST_HEALTH_MS, probe.summary()


def test_row_3_a_huge_origin_is_logged_short(start_agent: Any) -> None:
    agent = start_agent("--api-key", KEY, "--cors-origins", "localhost")
    probe = Probe(agent.port, agent.proc.pid)
    with probe.running():
        answer = huge_origin(agent.port)
    assert answer.status == 200
    assert b"Access-Control-Allow-Origin" not in answer.head
    warning = next(line for line in agent.log().splitlines() if "skip non-localhost" in line)
    assert "(32007 characters)" in warning and len(warning) < 1000
    assert probe.worst_ms() < WORST_HEALTH_MS, probe.summary()


def test_row_4_a_huge_model_name_is_not_found_at_once_and_echoed_short(
    start_agent: Any, demo_dir: Path
) -> None:
    agent = start_agent("--api-key", KEY, "--models-dir", str(demo_dir))
    probe = Probe(agent.port, agent.proc.pid)
    with probe.running():
        answer = huge_model(agent.port, KEY)
    assert answer.status == 400
    shown = message(answer)
    assert shown.startswith("model 'a.a.a.") and shown.endswith("(40000 characters)' not found")
    assert len(shown) < 1000
    assert max(map(len, agent.log().splitlines())) < 2000  # no log line echoes it whole
    assert probe.worst_ms() < WORST_HEALTH_MS, probe.summary()


def test_row_5_metrics_label_routes_not_paths(start_agent: Any) -> None:
    agent = start_agent("--api-key", KEY, "--metrics")
    probe = Probe(agent.port, agent.proc.pid)
    with probe.running():
        scrape = slot_paths(agent.port, KEY, 300)
    assert scrape.status == 200
    text = scrape.body.decode()
    assert 'endpoint="/slots/{id_slot}",model="",status="400"} 300.0' in text
    assert "sss" not in text  # no label holds a client's path
    assert len(scrape.body) < 100_000
    assert probe.worst_ms() < WORST_HEALTH_MS, probe.summary()


def test_rows_7_and_19_only_the_ui_files_reach_the_ui_server(start_agent: Any) -> None:
    agent = start_agent("--api-key", KEY)
    assert send_raw(agent.port, "GET", "/").status == 200  # the chat UI (its server started)
    assert send_raw(agent.port, "GET", "/favicon.svg").status == 200
    probe = Probe(agent.port, agent.proc.pid)
    with probe.running():
        statuses = ui_paths(agent.port, 300, pad=1000)
    # The agent's key check, as for any path it does not serve: not the UI's index.html (a
    # 200 kept under each path).
    assert set(statuses) == {401}
    # Row 19: not the UI server's own /health, with a query passed on.
    assert send_raw(agent.port, "GET", "/health%3F.x").status == 401
    assert send_raw(agent.port, "GET", "/_app/..%2F..%2Fhealth").status == 401
    assert probe.worst_ms() < WORST_HEALTH_MS, probe.summary()


def test_row_15_a_conversation_id_is_bounded(start_agent: Any, demo_dir: Path) -> None:
    agent = start_agent("--api-key", KEY, "--models-dir", str(demo_dir))
    assert conversation_ids(agent.port, KEY, "demo-tiny", 1, length=36)[0].status == 200
    probe = Probe(agent.port, agent.proc.pid)
    with probe.running():
        answers = conversation_ids(agent.port, KEY, "demo-tiny", 200)
    # Before: each id was kept (30 KB a conversation, 10,000 of them) and the child refused it.
    assert {message(a) for a in answers} == {
        "conversation id too long: 30000 characters, at most 256"
    }
    answer = send_raw(
        agent.port,
        "GET",
        "/v1/stream?conv_id=" + "c" * 300 + "&from=0",
        {"Authorization": f"Bearer {KEY}"},
    )
    assert answer.status == 400 and "conversation id too long" in message(answer)
    assert probe.worst_ms() < WORST_HEALTH_MS, probe.summary()


def test_row_20_a_cross_site_get_does_not_load_a_model(start_agent: Any, demo_dir: Path) -> None:
    agent = start_agent("--models-dir", str(demo_dir), "--cors-origins", "localhost")
    img = {"Sec-Fetch-Site": "cross-site", "Sec-Fetch-Mode": "no-cors", "Sec-Fetch-Dest": "image"}
    answer = send_raw(agent.port, "GET", "/props?model=demo-tiny&autoload=1", img)
    assert answer.status == 403 and "may load a model" in message(answer)
    assert agent.models()["demo-tiny"]["status"]["value"] == "unloaded"
    # The same GET from curl (no Origin, no Sec-Fetch-Site) loads it, as before.
    assert send_raw(agent.port, "GET", "/props?model=demo-tiny&autoload=1").status == 200


def test_row_17_the_shutdown_timeout_holds_with_everything_open(
    start_agent: Any, demo_dir: Path
) -> None:
    bound = 3
    agent = start_agent(
        "--models-dir", str(demo_dir), "--tools", "all", "--shutdown-timeout", str(bound)
    )
    out = shutdown_with_everything_open(agent.port, agent.proc, "demo-tiny", wait=bound + 30)
    assert out.returncode == 0, agent.log()
    assert out.seconds < bound + 1, out
    # Every request got an answer, not an empty reply: the tool calls say they were cancelled.
    assert out.answers["tool"] == '200 \'{"error":"cancelled"}\'', out.answers
    assert '"error":"cancelled"' in out.answers["streamed tool"], out.answers
    for name in ("stream", "sse", "log follow"):
        assert out.answers[name].startswith("200 "), out.answers


def test_row_16_a_childs_long_stderr_lines_are_kept_cut(
    start_agent: Any, demo_dir: Path, tmp_path: Path
) -> None:
    noisy = noisy_llama_server(tmp_path, find_llama_server(None, os.environ), lines=100)
    agent = start_agent("--models-dir", str(demo_dir), "--llama-server", str(noisy))
    probe = Probe(agent.port, agent.proc.pid)
    with probe.running():
        assert agent.post("/models/load", {"model": "demo-tiny"}) == (200, {"success": True})
        agent.wait_state("demo-tiny", "loaded")
    status, text = agent.get("/models/logs?model=demo-tiny&lines=1000")
    assert status == 200
    long = [line for line in text.splitlines() if line.startswith("xxxx")]
    assert len(long) == 100  # each kept, cut short and saying how long it was
    assert all(len(line) < 5000 and line.endswith("(65535 characters)") for line in long)
    assert probe.worst_ms() < WORST_HEALTH_MS, probe.summary()
