"""What the real clients call and found missing or unhelpful (issue 49, items 5 and 6): the
openai SDK's embeddings of a model without them (its fix is a preset key; the SDK must not
retry it), its ``models.retrieve``, and ``/api/ps``'s family and quantization read by the
ollama client."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import ollama
import openai
import pytest

from tests.integration.harness import AgentProcess

TINY = "demo-tiny"


@pytest.fixture(scope="module")
def agent(demo_dir: Path) -> Iterator[AgentProcess]:
    agent = AgentProcess(["--models-dir", str(demo_dir), "-c", "512"])
    yield agent
    agent.stop()


def sdk(agent: AgentProcess, sent: list[str]) -> openai.OpenAI:
    """The openai SDK with its default retries, counting the requests it sends."""

    def count(request: httpx.Request) -> None:
        sent.append(f"{request.method} {request.url.path}")

    http = httpx.Client(event_hooks={"request": [count]})
    return openai.OpenAI(base_url=agent.url + "/v1", api_key="none", http_client=http)


def test_embeddings_without_the_option_say_the_preset_key_and_are_not_retried(
    agent: AgentProcess,
) -> None:
    sent: list[str] = []
    with sdk(agent, sent) as client, pytest.raises(openai.APIStatusError) as raised:
        client.embeddings.create(model=TINY, input="hello")
    error = raised.value
    assert error.status_code == 501  # llama.cpp's own code for it
    assert sent == ["POST /v1/embeddings"], sent  # once: the SDK retries a 5xx otherwise
    message = error.body["message"] if isinstance(error.body, dict) else str(error.body)
    # llama.cpp's words, then the fix a Corral user can apply.
    assert message.startswith("This server does not support embeddings."), message
    assert "`embeddings = true`" in message and TINY in message, message


def test_ollama_embed_without_the_option_says_the_preset_key(agent: AgentProcess) -> None:
    with (
        ollama.Client(host=agent.url, timeout=60) as client,
        pytest.raises(ollama.ResponseError) as raised,
    ):
        client.embed(model=TINY, input="hello")
    assert "`embeddings = true`" in raised.value.error, raised.value.error


def test_models_retrieve(agent: AgentProcess) -> None:
    sent: list[str] = []
    with sdk(agent, sent) as client:
        model = client.models.retrieve(TINY)
        assert (model.id, model.object) == (TINY, "model")
        listed = {m.id: m for m in client.models.list().data}
        assert model.model_dump() == listed[TINY].model_dump()
        with pytest.raises(openai.NotFoundError) as raised:
            client.models.retrieve("nope")
    assert "model 'nope' not found" in str(raised.value)


def test_models_retrieve_takes_a_name_with_slashes(
    start_agent: Any, demo_dir: Path, tmp_path: Path
) -> None:
    ini = tmp_path / "presets.ini"
    ini.write_text(f"[org/tiny:Q8_0]\nmodel = {demo_dir / 'demo-tiny.gguf'}\n")
    agent = start_agent("--models-preset", str(ini), "-c", "512")
    with openai.OpenAI(base_url=agent.url + "/v1", api_key="none") as client:
        model = client.models.retrieve("org/tiny:Q8_0")
    assert model.id == "org/tiny:Q8_0"


def test_api_ps_gives_family_and_quantization(agent: AgentProcess) -> None:
    with ollama.Client(host=agent.url, timeout=60) as client:
        client.generate(model=TINY, prompt="")  # loads it
        shown = client.show(TINY).details
        (running,) = [m for m in client.ps().models if m.model == TINY]
    assert running.details.family == shown.family == "llama"
    assert running.details.quantization_level == shown.quantization_level != ""
