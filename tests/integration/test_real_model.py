"""The real SmolLM2-135M-Instruct through the agent: its own tokenizer, chat template, Q4_1.

The generated demo models have random weights, so nothing else checks that a real chat
template, a real BPE vocabulary or a real answer survives the trip through Corral. Greedy
decoding (temperature 0) with a system prompt makes the answer reproducible.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from http.client import HTTPConnection
from pathlib import Path
from typing import Any

import openai
import pytest

from node_agent.demo_models import DEMO_MODELS, write_model
from node_agent.real_model import MODEL_NAME
from tests.integration.harness import AgentProcess

QUESTION = [
    {"role": "system", "content": "You are a helpful assistant."},
    {"role": "user", "content": "What is the capital of France?"},
]


def ask(stream: bool = False) -> dict[str, Any]:
    return {
        "model": MODEL_NAME,
        "max_tokens": 24,
        "temperature": 0,
        "messages": QUESTION,
        "stream": stream,
    }


@pytest.fixture(scope="module")
def models_dir(real_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The real model (a hard link, as `corral demo-models` places it) beside demo-tiny."""
    folder = tmp_path_factory.mktemp("real")
    os.link(real_model, folder / f"{MODEL_NAME}.gguf")
    tiny = next(m for m in DEMO_MODELS if m.file_name == "demo-tiny.gguf")
    write_model(folder / tiny.file_name, tiny)
    return folder


@pytest.fixture(scope="module")
def agent(models_dir: Path) -> Iterator[AgentProcess]:
    agent = AgentProcess(["--models-dir", str(models_dir), "--models-max", "1", "-c", "2048"])
    yield agent
    agent.stop()


def test_chat_answers_with_the_models_own_template(agent: AgentProcess) -> None:
    status, body = agent.post("/v1/chat/completions", ask())
    assert status == 200, body
    assert "Paris" in body["choices"][0]["message"]["content"]
    assert body["model"] == MODEL_NAME
    # the model's own template (SmolLM2's default system prompt is replaced by ours)
    status, applied = agent.post("/apply-template", {"model": MODEL_NAME, "messages": QUESTION})
    assert status == 200
    assert applied["prompt"].startswith("<|im_start|>system\nYou are a helpful assistant.")


def test_streamed_chat_arrives_in_pieces_and_says_the_same(agent: AgentProcess) -> None:
    conn = HTTPConnection("127.0.0.1", agent.port, timeout=60)
    conn.request(
        "POST", "/v1/chat/completions", json.dumps(ask(True)), {"Content-Type": "application/json"}
    )
    response = conn.getresponse()
    assert response.status == 200
    assert response.getheader("Content-Type", "").startswith("text/event-stream")
    pieces = []
    for line in response:
        if line.startswith(b"data: ") and line.strip() != b"data: [DONE]":
            delta = json.loads(line[6:])["choices"][0]["delta"]
            pieces.append(delta.get("content") or "")
    conn.close()
    assert len([p for p in pieces if p]) > 3  # token by token, not one buffered blob
    _, whole = agent.post("/v1/chat/completions", ask())
    assert "".join(pieces) == whole["choices"][0]["message"]["content"]


def test_the_openai_client(agent: AgentProcess) -> None:
    with openai.OpenAI(base_url=agent.url + "/v1", api_key="x", max_retries=0) as api:
        listed = {m.id for m in api.models.list()}
        assert MODEL_NAME in listed
        answer = api.chat.completions.create(
            model=MODEL_NAME,
            messages=QUESTION,  # type: ignore[arg-type]
            max_tokens=24,
            temperature=0,
        )
        assert "Paris" in (answer.choices[0].message.content or "")
        assert answer.usage is not None and answer.usage.completion_tokens > 0


def test_tokenize_detokenize_round_trip(agent: AgentProcess) -> None:
    text = "The capital of France is Paris. Ça va? 東京"
    status, tokens = agent.post("/tokenize", {"model": MODEL_NAME, "content": text})
    assert status == 200, tokens
    ids = tokens["tokens"]
    assert 5 < len(ids) < len(text)  # a real BPE vocabulary merges characters
    status, back = agent.post("/detokenize", {"model": MODEL_NAME, "tokens": ids})
    assert status == 200
    assert back["content"] == text


def test_evicted_by_a_generated_model_and_loaded_again(agent: AgentProcess) -> None:
    # --models-max 1: each request for the other model evicts the idle one
    status, _ = agent.post("/v1/chat/completions", ask())
    assert status == 200
    status, _ = agent.post(
        "/v1/chat/completions",
        {"model": "demo-tiny", "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]},
    )
    assert status == 200
    states = {name: m["status"]["value"] for name, m in agent.models().items()}
    assert states == {"demo-tiny": "loaded", MODEL_NAME: "unloaded"}
    status, body = agent.post("/v1/chat/completions", ask())
    assert status == 200 and "Paris" in body["choices"][0]["message"]["content"]
    assert agent.state("demo-tiny") == "unloaded"
