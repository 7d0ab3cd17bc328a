"""Ollama's shapes to the child's and back: every field mapped or refused (issue 29)."""

from __future__ import annotations

import pytest

from node_agent.errors import ApiError
from node_agent.ollama.pull import repo_name
from node_agent.ollama.translate import (
    answer_piece,
    chat_request,
    durations,
    embed_request,
    generate_request,
)


def test_chat_maps_options_format_think_and_streams_by_default() -> None:
    wanted = chat_request(
        {
            "model": "m",
            "messages": [{"role": "user", "content": "hi"}],
            "options": {"temperature": 0, "num_predict": 8, "stop": ["x"], "num_keep": 4},
            "format": "json",
            "think": False,
            "keep_alive": "5m",
        }
    )
    assert (wanted.path, wanted.stream, wanted.keep_alive) == ("/v1/chat/completions", True, "5m")
    assert wanted.body == {
        "messages": [{"role": "user", "content": "hi"}],
        "temperature": 0,
        "max_tokens": 8,
        "stop": ["x"],
        "n_keep": 4,
        "response_format": {"type": "json_object"},
        "chat_template_kwargs": {"enable_thinking": False},
        "stream": True,
        "stream_options": {"include_usage": True},
    }


def test_no_limit_on_tokens_is_the_childs_default() -> None:
    wanted = chat_request({"model": "m", "messages": [], "options": {"num_predict": -1}})
    assert "max_tokens" not in wanted.body


@pytest.mark.parametrize(
    ("body", "says"),
    [
        ({"model": "m", "messages": [], "options": {"num_ctx": 4096}}, "ctx-size"),
        ({"model": "m", "messages": [], "options": {"low_vram": True}}, "no equivalent"),
        ({"model": "m", "messages": [], "mystery": 1}, "'mystery'"),
        ({"model": "m", "messages": [{"role": "user", "images": ["x"]}]}, "images"),
        ({"model": "m", "messages": [{"role": "robot", "content": "x"}]}, "role"),
        ({"model": "m", "messages": [], "think": "high"}, "think"),
        ({"model": "m", "messages": [], "format": 3}, "format"),
        ({"messages": []}, "model is required"),
    ],
)
def test_what_does_not_map_is_a_400(body: dict[str, object], says: str) -> None:
    with pytest.raises(ApiError) as caught:
        chat_request(body)
    assert caught.value.status == 400 and says in caught.value.message


def test_generate_uses_the_chat_template_unless_raw() -> None:
    templated = generate_request({"model": "m", "system": "be brief", "prompt": "hi"})
    assert templated.path == "/v1/chat/completions"
    assert templated.body["messages"] == [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "hi"},
    ]
    raw = generate_request({"model": "m", "prompt": "hi", "raw": True, "stream": False})
    assert (raw.path, raw.body["prompt"], raw.stream) == ("/v1/completions", "hi", False)
    for key, value in (("suffix", "x"), ("context", [1]), ("template", "t")):
        with pytest.raises(ApiError, match=key):
            generate_request({"model": "m", "prompt": "hi", key: value})


def test_embed_refuses_what_llama_server_decides() -> None:
    assert embed_request({"model": "m", "input": ["a", "b"]}).body == {"input": ["a", "b"]}
    for extra in ({"dimensions": 8}, {"truncate": False}, {"options": {"temperature": 1}}):
        with pytest.raises(ApiError):
            embed_request({"model": "m", "input": "a", **extra})


def test_answers_and_tool_calls_come_back_in_ollamas_shape() -> None:
    wanted = chat_request({"model": "m", "messages": []})
    answer = {
        "choices": [
            {
                "finish_reason": "tool_calls",
                "message": {
                    "content": "",
                    "tool_calls": [{"function": {"name": "f", "arguments": '{"a": 1}'}}],
                },
            }
        ],
        "usage": {"prompt_tokens": 5, "completion_tokens": 2},
        "timings": {"prompt_n": 5, "prompt_ms": 1.5, "predicted_n": 2, "predicted_ms": 3.0},
    }
    assert answer_piece(wanted, answer) == {
        "message": {
            "role": "assistant",
            "content": "",
            "tool_calls": [{"function": {"name": "f", "arguments": {"a": 1}}}],
        }
    }
    assert durations(answer, 10, 1) == {
        "total_duration": 10,
        "load_duration": 1,
        "prompt_eval_count": 5,
        "eval_count": 2,
        "prompt_eval_duration": 1_500_000,
        "eval_duration": 3_000_000,
    }
    generated = generate_request({"model": "m", "prompt": "p"})
    assert answer_piece(generated, {"choices": [{"delta": {"content": "x"}}]}) == {"response": "x"}


def test_pull_names() -> None:
    assert repo_name("hf.co/org/repo:Q4_K_M") == "org/repo:Q4_K_M"
    assert repo_name("org/repo:latest") == "org/repo"
    with pytest.raises(ApiError, match="Hugging Face"):
        repo_name("llama3.2")
