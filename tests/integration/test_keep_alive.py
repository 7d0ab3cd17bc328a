"""A request's ``keep_alive`` governs what happens after that request only (issue 49, item 1).

Ollama's API says of ``keep_alive``: "how long the model will stay loaded into memory following
the request (default: 5m)" — the request's. A later request that gives none gets the default:
here the model's own idle time (its preset's ``ttl``, else ``--models-ttl``; never, without
either). A run that ends takes its last ``keep_alive`` with it: the next load starts from the
default. Driven by the real ``ollama`` Python client and plain OpenAI-style requests.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import ollama
import pytest

from tests.integration.harness import AgentProcess, chat

MODEL = "demo-tiny"
SHORT = {"num_predict": 2}
HI = [{"role": "user", "content": "hi"}]


@pytest.fixture
def agent(start_agent: Any, demo_dir: Path) -> AgentProcess:
    started: AgentProcess = start_agent("--models-dir", str(demo_dir), "-c", "512")
    return started


@pytest.fixture
def client(agent: AgentProcess) -> Iterator[ollama.Client]:
    client = ollama.Client(host=agent.url, timeout=60)
    yield client
    client.close()


def running(agent: AgentProcess) -> dict[str, dict[str, Any]]:
    """``/api/ps`` by name: each running model's pid and idle time (``corral.ttl``)."""
    status, body = agent.get("/api/ps")
    assert status == 200, body
    return {m["name"]: m["corral"] for m in body["models"]}


def test_keep_alive_0_unloads_once_and_the_next_requests_keep_the_model(
    agent: AgentProcess, client: ollama.Client
) -> None:
    client.generate(model=MODEL, prompt="")  # Ollama's way to load a model
    agent.wait_state(MODEL, "loaded")
    assert client.generate(model=MODEL, prompt="", keep_alive=0).done_reason == "unload"
    agent.wait_state(MODEL, "unloaded")
    # An OpenAI-style request gives no keep_alive: the model loads and stays.
    status, body = agent.post("/v1/chat/completions", chat(MODEL, 2))
    assert status == 200, body
    after_openai = running(agent)
    assert MODEL in after_openai, "unloaded after a request that gave no keep_alive"
    assert after_openai[MODEL]["ttl"] is None, after_openai[MODEL]  # the default: never
    # An Ollama request without keep_alive: the same child serves it, and it stays too.
    client.chat(model=MODEL, messages=HI, options=SHORT)
    after_ollama = running(agent)
    assert after_ollama[MODEL]["pid"] == after_openai[MODEL]["pid"]
    assert after_ollama[MODEL]["ttl"] is None


def test_a_keep_alive_lasts_until_the_next_request_says_otherwise(
    agent: AgentProcess, client: ollama.Client
) -> None:
    client.chat(model=MODEL, messages=HI, options=SHORT, keep_alive="1h")
    assert running(agent)[MODEL]["ttl"] == 3600
    client.chat(model=MODEL, messages=HI, options=SHORT, keep_alive=-1)
    assert running(agent)[MODEL]["ttl"] is None  # forever
    client.chat(model=MODEL, messages=HI, options=SHORT, keep_alive="10m")
    assert running(agent)[MODEL]["ttl"] == 600
    status, body = agent.post("/v1/chat/completions", chat(MODEL, 2))
    assert status == 200, body
    assert running(agent)[MODEL]["ttl"] is None  # back to the default


def test_a_run_that_ends_takes_its_keep_alive_with_it(
    agent: AgentProcess, client: ollama.Client
) -> None:
    client.chat(model=MODEL, messages=HI, options=SHORT, keep_alive="1s")
    agent.wait_state(MODEL, "unloaded")  # its idle second is up
    status, body = agent.post("/models/load", {"model": MODEL})  # `corral load`
    assert status == 200, body
    agent.wait_state(MODEL, "loaded")
    assert running(agent)[MODEL]["ttl"] is None
