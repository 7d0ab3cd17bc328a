"""Ollama's API through the real ``ollama`` Python client, against a real agent serving the real
model (SmolLM2) and pulling from the local Hugging Face hub (``hf_server``): issue 29."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import ollama
import pytest

from node_agent.real_model import MODEL_NAME
from tests.integration.harness import AgentProcess, http
from tests.integration.hf_server import HubServer, start_hub

QUESTION = [
    {"role": "system", "content": "You are a helpful assistant."},
    {"role": "user", "content": "What is the capital of France?"},
]
GREEDY = {"temperature": 0, "num_predict": 24}
REPO = "corral-test/tiny"


@pytest.fixture(scope="module")
def hub(demo_dir: Path) -> Iterator[HubServer]:
    server = start_hub()
    server.add(REPO, {"tiny-Q8_0.gguf": (demo_dir / "demo-tiny.gguf").read_bytes()})
    yield server
    server.close()


@pytest.fixture(scope="module")
def agent(
    real_model: Path, hub: HubServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[AgentProcess]:
    folder = tmp_path_factory.mktemp("ollama")
    os.link(real_model, folder / f"{MODEL_NAME}.gguf")
    env = {
        "HF_HOME": str(folder / "hf"),
        "MODEL_ENDPOINT": hub.url + "/",
        "LLAMA_CACHE": "",
    }
    agent = AgentProcess(["--models-dir", str(folder), "--models-max", "2", "-c", "2048"], env)
    yield agent
    agent.stop()


@pytest.fixture
def client(agent: AgentProcess) -> Iterator[ollama.Client]:
    client = ollama.Client(host=agent.url, timeout=120)
    yield client
    client.close()


def test_list_names_the_agents_models(client: ollama.Client) -> None:
    listed = {m.model: m for m in client.list().models}
    assert MODEL_NAME in listed, listed
    entry = listed[MODEL_NAME]
    assert entry.size is not None and entry.size > 90_000_000  # the 98 MB file
    assert entry.details is not None and entry.details.format == "gguf"


def test_chat(client: ollama.Client) -> None:
    answer = client.chat(model=MODEL_NAME, messages=QUESTION, options=GREEDY)
    assert answer.done is True and answer.message.role == "assistant"
    assert "Paris" in (answer.message.content or ""), answer
    assert answer.eval_count and answer.prompt_eval_count  # the child's own counts


def test_streaming_chat(client: ollama.Client) -> None:
    parts = list(client.chat(model=MODEL_NAME, messages=QUESTION, options=GREEDY, stream=True))
    assert len(parts) > 3  # streamed, not one piece
    assert [p.done for p in parts] == [False] * (len(parts) - 1) + [True]
    assert "Paris" in "".join(p.message.content or "" for p in parts)
    assert parts[-1].done_reason in ("stop", "length") and parts[-1].eval_count


def test_generate(client: ollama.Client) -> None:
    answer = client.generate(
        model=MODEL_NAME,
        system="You are a helpful assistant.",
        prompt="What is the capital of France?",
        options=GREEDY,
    )
    assert answer.done is True and "Paris" in answer.response, answer
    streamed = list(
        client.generate(
            model=MODEL_NAME, prompt="What is the capital of France?", stream=True, options=GREEDY
        )
    )
    assert streamed[-1].done is True and len(streamed) > 3


def test_ps_show_and_a_latest_tag(client: ollama.Client) -> None:
    client.chat(model=f"{MODEL_NAME}:latest", messages=QUESTION, options={"num_predict": 1})
    running = {m.model: m for m in client.ps().models}
    assert MODEL_NAME in running, running
    assert running[MODEL_NAME].size and running[MODEL_NAME].size > 50_000_000  # its memory
    shown = client.show(MODEL_NAME)
    assert shown.details is not None and shown.details.family == "llama"
    assert shown.details.quantization_level == "Q4_1"  # from the GGUF's general.file_type
    assert "im_start" in (shown.template or "")


@pytest.mark.parametrize(
    ("request_options", "says"),
    [
        ({"num_ctx": 8192}, "set ctx-size in the model's preset"),
        ({"penalize_newline": True}, "has no equivalent in llama-server"),
        ({"no_such": 1}, "is not an option Corral knows"),
    ],
)
def test_an_option_that_does_not_map_is_a_400(
    client: ollama.Client, request_options: dict[str, Any], says: str
) -> None:
    with pytest.raises(ollama.ResponseError) as caught:
        client.chat(model=MODEL_NAME, messages=QUESTION, options=request_options)
    assert caught.value.status_code == 400 and says in caught.value.error


def test_unknown_fields_images_and_models_are_refused(agent: AgentProcess) -> None:
    status, body = http(
        "POST", f"{agent.url}/api/chat", {"model": MODEL_NAME, "messages": [], "mystery": 1}
    )
    assert status == 400 and "'mystery'" in body["error"], body
    images = [{"role": "user", "content": "what is this?", "images": ["aGVsbG8="]}]
    status, body = http("POST", f"{agent.url}/api/chat", {"model": MODEL_NAME, "messages": images})
    assert status == 400 and "images" in body["error"], body
    status, body = http("POST", f"{agent.url}/api/generate", {"model": "nope", "prompt": "x"})
    assert status == 404 and "'nope' not found" in body["error"], body


def test_keep_alive_zero_unloads(client: ollama.Client, agent: AgentProcess) -> None:
    client.generate(model=MODEL_NAME, prompt="hi", options={"num_predict": 1})
    answer = client.generate(model=MODEL_NAME, keep_alive=0)
    assert answer.done_reason == "unload"
    agent.wait_state(MODEL_NAME, "unloaded", timeout=15)


def test_pull_with_progress_from_the_hub(client: ollama.Client, agent: AgentProcess) -> None:
    progress = list(client.pull(f"hf.co/{REPO}:Q8_0", stream=True))
    statuses = [p.status for p in progress]
    assert statuses[0] == "pulling manifest" and statuses[-1] == "success", statuses
    files = [p for p in progress if p.digest == "tiny-Q8_0.gguf"]
    assert files and files[-1].completed == files[-1].total > 0, progress
    assert f"{REPO}:Q8_0" in {m.model for m in client.list().models}
    # Pulled again: already there, nothing downloaded.
    assert [p.status for p in client.pull(f"{REPO}:Q8_0", stream=True)] == [
        "pulling manifest",
        "success",
    ]
    with pytest.raises(ollama.ResponseError) as caught:
        client.pull("llama3.2")
    assert caught.value.status_code == 400 and "Hugging Face" in caught.value.error
    client.delete(f"{REPO}:Q8_0")  # DELETE /models: the model and its files
    assert f"{REPO}:Q8_0" not in {m.model for m in client.list().models}


def test_what_ollama_keeps_in_its_own_store_is_a_clear_501(client: ollama.Client) -> None:
    with pytest.raises(ollama.ResponseError) as caught:
        client.copy(MODEL_NAME, "copy-of-it")
    assert caught.value.status_code == 501 and "alias = NAME" in caught.value.error
