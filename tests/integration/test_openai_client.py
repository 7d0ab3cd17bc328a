"""The official ``openai`` Python client, unchanged, against the agent.

The client only gets ``base_url`` (the agent's ``/v1``) and an API key; everything else is its
defaults. That matters for embeddings: without ``encoding_format`` the client asks for base64
and decodes it itself, so the agent must pass that request through untouched.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import openai
import pytest

from tests.integration.harness import AgentProcess

TINY, EMBED = "demo-tiny", "demo-small"


@pytest.fixture
def agent(start_agent: Any, demo_dir: Path, tmp_path: Path) -> AgentProcess:
    preset = tmp_path / "preset.ini"
    preset.write_text(f"[{EMBED}]\nembeddings = true\n")
    started: AgentProcess = start_agent(
        "--models-dir",
        str(demo_dir),
        "--models-preset",
        str(preset),
        "--models-max",
        "2",
        "-c",
        "1024",
    )
    return started


def client(agent: AgentProcess, key: str = "anything") -> openai.OpenAI:
    return openai.OpenAI(base_url=agent.url + "/v1", api_key=key, max_retries=0, timeout=60)


def test_openai_client_end_to_end(agent: AgentProcess) -> None:
    with client(agent) as api:
        listed = {model.id: model for model in api.models.list()}
        assert {TINY, EMBED} <= set(listed)
        assert listed[TINY].object == "model"
        assert listed[TINY].owned_by == "llamacpp"

        chat = api.chat.completions.create(
            model=TINY,
            messages=[{"role": "user", "content": "hello"}],
            max_tokens=4,
            # The demo models rarely end early (</s> stays possible): ask for all 4 tokens.
            extra_body={"ignore_eos": True},
        )
        assert chat.object == "chat.completion"
        assert chat.model == TINY
        assert chat.choices[0].message.role == "assistant"
        assert chat.choices[0].message.content
        assert chat.usage is not None and chat.usage.completion_tokens == 4

        stream = api.chat.completions.create(
            model=TINY,
            messages=[{"role": "user", "content": "hello"}],
            max_tokens=4,
            stream=True,
        )
        chunks = list(stream)
        assert all(chunk.object == "chat.completion.chunk" for chunk in chunks)
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        assert text
        assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"

        completion = api.completions.create(model=TINY, prompt="Once upon a time", max_tokens=4)
        assert completion.object == "text_completion"
        assert completion.choices[0].text
        assert completion.choices[0].finish_reason == "length"

        embedded = api.embeddings.create(model=EMBED, input=["hello", "world"])
        assert [item.index for item in embedded.data] == [0, 1]
        vectors = [item.embedding for item in embedded.data]
        assert len(vectors[0]) == len(vectors[1]) > 0
        assert vectors[0] != vectors[1]
        assert all(isinstance(x, float) for x in vectors[0])

        # A model started without --embeddings: the client raises the child's 501, typed.
        with pytest.raises(openai.APIStatusError) as refused:
            api.embeddings.create(model=TINY, input="hello")
        assert refused.value.status_code == 501

        with pytest.raises(openai.BadRequestError) as unknown:
            api.chat.completions.create(
                model="no-such-model", messages=[{"role": "user", "content": "hi"}], max_tokens=2
            )
        assert "model 'no-such-model' not found" in str(unknown.value)


def test_openai_client_with_an_api_key(start_agent: Any, demo_dir: Path) -> None:
    agent = start_agent("--models-dir", str(demo_dir), "--api-key", "s3cret", "-c", "1024")
    with client(agent, "s3cret") as api:
        assert TINY in {model.id for model in api.models.list()}
        reply = api.completions.create(model=TINY, prompt="hi", max_tokens=2)
        assert reply.choices[0].text
    with client(agent, "wrong") as api, pytest.raises(openai.AuthenticationError):
        api.models.list()
