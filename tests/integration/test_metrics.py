"""``GET /metrics``: the agent's own metrics after a scripted workload, counted exactly."""

from __future__ import annotations

import http.client
import json
import time
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from tests.integration.harness import AgentProcess, chat, free_port
from tests.integration.harness import http as fetch

TINY, SMALL, MEDIUM = "demo-tiny", "demo-small", "demo-medium"
CHAT = "/v1/chat/completions"


def scrape(agent: AgentProcess) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    """Every sample as {(name, labels): value}."""
    status, text = agent.get("/metrics")
    assert status == 200, text
    samples = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            samples[(s.name, frozenset(s.labels.items()))] = s.value
    return samples


def value(samples: dict[Any, float], name: str, **labels: str) -> float:
    return samples.get((name, frozenset(labels.items())), 0.0)


def total(samples: dict[Any, float], name: str, **labels: str) -> float:
    """Sum over the samples of ``name`` whose labels include ``labels``."""
    want = set(labels.items())
    return sum(v for (n, ls), v in samples.items() if n == name and want <= ls)


def stream(agent: AgentProcess, body: dict[str, Any]) -> dict[str, Any]:
    """A streamed chat; returns the usage of its last chunk (as the client saw it)."""
    conn = http.client.HTTPConnection("127.0.0.1", agent.port, timeout=60)
    conn.request("POST", CHAT, json.dumps(body), {"Content-Type": "application/json"})
    response = conn.getresponse()
    assert response.status == 200
    usage: dict[str, Any] = {}
    for raw in response:
        line = raw.decode().strip()
        if line.startswith("data: {"):
            usage = json.loads(line[6:]).get("usage") or usage
    conn.close()
    return usage


def test_metrics_match_a_scripted_workload(start_agent: Any, demo_dir: Path) -> None:
    agent = start_agent(
        "--models-dir", str(demo_dir), "--models-max", "1", "-c", "1024", "--metrics"
    )  # fmt: skip
    prompt, generated = {TINY: 0, SMALL: 0}, {TINY: 0, SMALL: 0}

    def complete(model: str, max_tokens: int) -> None:
        # ignore_eos: the demo models may end early (they rarely sample </s>), and the token
        # totals below count on exactly max_tokens each.
        status, body = agent.post(CHAT, chat(model, max_tokens=max_tokens, ignore_eos=True))
        assert status == 200, body
        prompt[model] += body["usage"]["prompt_tokens"]
        generated[model] += body["usage"]["completion_tokens"]

    complete(TINY, 3)  # loads tiny
    complete(TINY, 5)
    usage = stream(
        agent,
        chat(
            TINY,
            max_tokens=4,
            stream=True,
            ignore_eos=True,
            stream_options={"include_usage": True},
        ),
    )
    prompt[TINY] += usage["prompt_tokens"]
    generated[TINY] += usage["completion_tokens"]
    complete(SMALL, 2)  # --models-max 1: evicts tiny (count), loads small
    assert agent.post("/models/unload", {"model": SMALL})[0] == 200  # manual
    agent.wait_state(SMALL, "unloaded")
    assert agent.post(CHAT, chat("no-such-model"))[0] == 400
    assert agent.post(CHAT, {"max_tokens": 1})[0] == 400  # no model named
    assert agent.post(CHAT, chat(MEDIUM), headers={}, raw=b"{not json")[0] == 400

    # Events reach the metrics a moment after the state they describe: wait for the last.
    deadline = time.monotonic() + 10
    samples = scrape(agent)
    while value(samples, "corral_evictions_total", model=SMALL, reason="manual") < 1:
        assert time.monotonic() < deadline, "the manual unload never reached the metrics"
        time.sleep(0.05)
        samples = scrape(agent)

    # Proxied requests by model, endpoint and status.
    assert value(samples, "corral_requests_total", model=TINY, endpoint=CHAT, status="200") == 3
    assert value(samples, "corral_requests_total", model=SMALL, endpoint=CHAT, status="200") == 1
    assert value(samples, "corral_requests_total", model="", endpoint=CHAT, status="400") == 3
    assert total(samples, "corral_requests_total") == 7
    # Every leased request waited once in the queue; refused ones never queued.
    assert value(samples, "corral_queue_wait_seconds_count", model=TINY) == 3
    assert value(samples, "corral_queue_wait_seconds_count", model=SMALL) == 1
    assert total(samples, "corral_queue_wait_seconds_count") == 4
    # Tokens: exactly what the children reported to the clients (the stream's last chunk too).
    for model in (TINY, SMALL):
        assert value(samples, "corral_prompt_tokens_total", model=model) == prompt[model]
        assert value(samples, "corral_generated_tokens_total", model=model) == generated[model]
    assert generated == {TINY: 12, SMALL: 2}
    assert value(samples, "corral_generation_seconds_total", model=TINY) > 0
    assert value(samples, "corral_generation_tokens_per_second_count", model=TINY) == 3
    # Loads, their seconds, evictions by reason.
    for model in (TINY, SMALL):
        assert value(samples, "corral_model_loads_total", model=model, result="loaded") == 1
        assert value(samples, "corral_model_load_seconds_count", model=model) == 1
    assert total(samples, "corral_model_loads_total") == 2
    assert value(samples, "corral_evictions_total", model=TINY, reason="count") == 1
    assert value(samples, "corral_evictions_total", model=SMALL, reason="manual") == 1
    assert total(samples, "corral_evictions_total") == 2
    assert total(samples, "corral_model_crashes_total") == 0
    # Snapshots: states now, nothing in flight or waiting.
    for model in (TINY, SMALL, MEDIUM):
        assert value(samples, "corral_model_state", model=model, state="unloaded") == 1
        assert value(samples, "corral_model_state", model=model, state="loaded") == 0
        assert value(samples, "corral_queue_depth", model=model) == 0
        assert value(samples, "corral_model_in_flight_requests", model=model) == 0
    assert value(samples, "corral_models_max") == 1
    assert value(samples, "corral_models_running") == 0
    # The ledger is off: no memory families carry samples.
    assert total(samples, "corral_memory_total_bytes") == 0


def test_model_query_still_proxies_the_childs_metrics(start_agent: Any, demo_dir: Path) -> None:
    agent = start_agent("--models-dir", str(demo_dir), "--metrics")
    status, text = agent.get(f"/metrics?model={TINY}")
    assert status == 200, text
    assert "llamacpp:prompt_tokens_total" in text
    assert "corral_" not in text
    samples = scrape(agent)  # the GET counts as a proxied request (it is one)
    assert (
        value(samples, "corral_requests_total", model=TINY, endpoint="/metrics", status="200") == 1
    )
    assert value(samples, "corral_model_state", model=TINY, state="loaded") == 1


def test_ledger_per_device(start_agent: Any, demo_dir: Path) -> None:
    agent = start_agent(
        "--models-dir", str(demo_dir), "--models-memory-margin", "16",
        "--memory-limit", "host=2GiB",
    )  # fmt: skip
    assert agent.post(CHAT, chat(SMALL))[0] == 200
    _, ledger = agent.get("/ledger")
    host = next(d for d in ledger["devices"] if d["name"] == "host")
    samples = scrape(agent)
    assert value(samples, "corral_memory_limit_bytes", device="host") == 2 << 30
    assert value(samples, "corral_memory_margin_bytes", device="host") == 16 << 20
    assert (
        value(samples, "corral_memory_held_bytes", device="host", model=SMALL)
        == host["held"][SMALL]
    )
    assert value(samples, "corral_memory_total_bytes", device="host") > 0


def test_metrics_need_the_api_key(start_agent: Any, demo_dir: Path) -> None:
    agent = start_agent("--models-dir", str(demo_dir), "--api-key", "sekret")
    assert agent.get("/metrics")[0] == 401
    status, text = agent.get("/metrics", headers={"Authorization": "Bearer sekret"})
    assert status == 200
    assert "corral_model_state" in text


def test_a_scrape_key_opens_the_metrics_and_nothing_else(demo_dir: Path) -> None:
    """Issue 25: the ServiceMonitor scraped with the full inference key."""
    agent = AgentProcess(
        ["--models-dir", str(demo_dir), "--api-key", "sekret"], env={"CORRAL_METRICS_KEY": "scrape"}
    )
    try:
        scrape = {"Authorization": "Bearer scrape"}
        status, text = agent.get("/metrics", headers=scrape)
        assert status == 200 and "corral_model_state" in text
        # A model's own metrics load it: that takes the API key.
        assert agent.get(f"/metrics?model={TINY}", headers=scrape)[0] == 401
        assert agent.get("/v1/models", headers=scrape)[0] == 401
        assert agent.get("/models", headers=scrape)[0] == 401
        assert agent.post("/models/unload", {"model": TINY}, headers=scrape)[0] == 401
        assert agent.get("/metrics", headers={"Authorization": "Bearer sekret"})[0] == 200
        assert "scrape" not in agent.log()
    finally:
        agent.stop()


def test_the_routing_metrics_are_served_without_a_key_and_say_nothing_else(
    demo_dir: Path,
) -> None:
    """--routing-metrics-port: an InferencePool's endpoint picker scrapes with no credentials;
    only the routing figures are there, the agent's own /metrics stays behind its key."""
    port = free_port()
    agent = AgentProcess(
        ["--models-dir", str(demo_dir), "--api-key", "sekret", "--routing-metrics-port", str(port)]
    )
    routing = f"http://127.0.0.1:{port}"
    try:
        assert agent.get("/metrics")[0] == 401

        def resident() -> dict[str, str]:
            status, text = fetch("GET", routing + "/metrics")
            assert status == 200, text
            families = {f.name: f for f in text_string_to_metric_families(text)}
            assert set(families) == {"corral_queued_requests", "corral_resident_models_info"}
            labels: dict[str, str] = families["corral_resident_models_info"].samples[0].labels
            return labels

        assert resident()["running_lora_adapters"] == ","  # nothing runs yet
        loaded = agent.post(
            "/models/load", {"model": TINY}, headers={"Authorization": "Bearer sekret"}
        )
        assert loaded[0] == 200, loaded
        deadline = time.monotonic() + 20
        while resident()["running_lora_adapters"] != TINY:
            assert time.monotonic() < deadline, resident()
            time.sleep(0.05)
        assert resident()["max_lora"] == "2"  # one told, and room for another (--models-max 4)
        # Nothing else is there: no model's own metrics, no listing, no inference.
        status, text = fetch("GET", f"{routing}/metrics?model={TINY}")
        assert status == 200 and "llamacpp:" not in text and "corral_resident" in text
        for path in ("/models", "/v1/models", "/health", "/v1/chat/completions"):
            assert fetch("GET", routing + path)[0] == 404, path
        assert fetch("POST", routing + "/v1/chat/completions", chat(TINY))[0] == 404
        assert fetch("POST", routing + "/metrics", {})[0] == 405
    finally:
        agent.stop()
