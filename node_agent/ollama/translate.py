"""Ollama's request and answer shapes, translated to and from the child's OpenAI-style API.

Pure: dictionaries in, dictionaries out; no I/O. Every field of Ollama's requests is either
mapped or refused with a 400 that names it and says what to do instead: a client must never
believe a setting took effect when it did not (issue 29).

Ollama's API as its ``ollama`` Python client (0.6) sends it: ``/api/chat``,
``/api/generate``, ``/api/embed`` with ``options`` (sampling settings and load-time settings
mixed), ``format``, ``keep_alive``, ``think``; answers carry durations in nanoseconds.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Final

from node_agent.clip import clip
from node_agent.errors import ApiError

# Ollama option -> the child's field (llama-server reads these in /v1/chat/completions and
# /v1/completions as well as in its own /completion).
SAMPLING: Final = {
    "temperature": "temperature",
    "top_p": "top_p",
    "top_k": "top_k",
    "min_p": "min_p",
    "typical_p": "typical_p",
    "seed": "seed",
    "num_predict": "max_tokens",
    "stop": "stop",
    "repeat_penalty": "repeat_penalty",
    "repeat_last_n": "repeat_last_n",
    "presence_penalty": "presence_penalty",
    "frequency_penalty": "frequency_penalty",
    "mirostat": "mirostat",
    "mirostat_tau": "mirostat_tau",
    "mirostat_eta": "mirostat_eta",
    "num_keep": "n_keep",
}
# Ollama options that size or place the model: a llama-server child takes them at its start,
# so they belong in the model's preset, never in one request.
LOAD_TIME: Final = {
    "num_ctx": "ctx-size",
    "num_batch": "batch-size",
    "num_gpu": "n-gpu-layers",
    "main_gpu": "main-gpu",
    "num_thread": "threads",
    "use_mmap": "mmap",
    "use_mlock": "mlock",
    "numa": "numa",
}
# Ollama options llama-server has no equivalent of.
UNSUPPORTED_OPTIONS: Final = frozenset(
    {"low_vram", "f16_kv", "vocab_only", "logits_all", "embedding_only", "penalize_newline"}
)
# The most messages (and tools) one request may carry, and the most options: bounds on the
# work done on the event loop for a client's document (it is at most 1 MiB already).
MAX_ITEMS: Final = 10_000

NS_PER_MS: Final = 1_000_000


@dataclass(frozen=True)
class Translated:
    """A request for the child: its path, its JSON body, and whether the client streams."""

    kind: str  # "chat", "generate" or "embed": the shape of Ollama's answer
    model: str
    path: str
    body: dict[str, Any]
    stream: bool
    keep_alive: object | None  # as given (the registry parses it), None when absent


def now_text() -> str:
    """Ollama's ``created_at``: RFC 3339 in UTC."""
    return datetime.now(UTC).isoformat().replace("+00:00", "Z")


def model_name(body: Mapping[str, Any]) -> str:
    """The ``model`` a request names (Ollama's clients also send the older ``name``)."""
    name = body.get("model", body.get("name"))
    if not isinstance(name, str) or not name:
        raise ApiError(400, "model is required: give the name of a model of GET /api/tags")
    return name


def _check_keys(body: Mapping[str, Any], route: str, known: frozenset[str]) -> None:
    extra = sorted(key for key in body if key not in known)
    if extra:
        shown = clip(", ".join(repr(clip(key, 60)) for key in extra))
        raise ApiError(
            400,
            f"{route} does not take {shown} (Corral maps {', '.join(sorted(known))}); "
            "remove it, or use the OpenAI-style API (/v1/...) for llama-server's own fields",
        )


def _empty(value: object) -> bool:
    return value is None or value == "" or value == [] or value == {}


def sampling(options: object) -> dict[str, Any]:
    """Ollama's ``options`` as the child's sampling fields; 400 for anything else."""
    if _empty(options):
        return {}
    if not isinstance(options, dict):
        raise ApiError(400, 'options must be an object of settings (e.g. {"temperature": 0})')
    out: dict[str, Any] = {}
    for key, value in options.items():
        if key in LOAD_TIME:
            raise ApiError(
                400,
                f"options.{key} is set when a model starts, not per request: set "
                f"{LOAD_TIME[key]} in the model's preset (a [name] section of --models-preset)",
            )
        if key in UNSUPPORTED_OPTIONS:
            raise ApiError(400, f"options.{key} has no equivalent in llama-server; remove it")
        if key not in SAMPLING:
            raise ApiError(
                400,
                f"options.{clip(key, 60)!r} is not an option Corral knows (known: "
                f"{', '.join(sorted(SAMPLING))})",
            )
        if value is None:
            continue
        if key == "num_predict":
            if not isinstance(value, int) or isinstance(value, bool):
                raise ApiError(400, "options.num_predict must be a whole number")
            if value < 0:  # Ollama: -1 is "no limit", -2 "fill the context": the child's own
                continue
        out[SAMPLING[key]] = value
    return out


def response_format(value: object) -> dict[str, Any]:
    """Ollama's ``format``: ``"json"`` or a JSON schema, as OpenAI's ``response_format``."""
    if _empty(value):
        return {}
    if value == "json":
        return {"response_format": {"type": "json_object"}}
    if isinstance(value, dict):
        schema = {"name": "response", "schema": value}
        return {"response_format": {"type": "json_schema", "json_schema": schema}}
    raise ApiError(400, 'format must be "json" or a JSON schema object')


def thinking(value: object) -> dict[str, Any]:
    """Ollama's ``think`` (true/false) as the chat template's ``enable_thinking``."""
    if value is None:
        return {}
    if isinstance(value, bool):
        return {"chat_template_kwargs": {"enable_thinking": value}}
    raise ApiError(
        400, 'think must be true or false (levels such as "high" are not mapped to llama-server)'
    )


def _stream(body: Mapping[str, Any]) -> bool:
    value = body.get("stream", True)  # Ollama streams unless told not to
    if not isinstance(value, bool):
        raise ApiError(400, "stream must be true or false")
    return value


def _message(index: int, message: object) -> dict[str, Any]:
    if not isinstance(message, dict):
        raise ApiError(400, f"messages[{index}] must be an object with a role and content")
    known = {"role", "content", "images", "thinking", "tool_calls", "tool_name"}
    extra = sorted(key for key in message if key not in known)
    if extra:
        raise ApiError(400, f"messages[{index}] has fields Corral does not map: {clip(str(extra))}")
    role, content = message.get("role"), message.get("content", "")
    if role not in ("system", "user", "assistant", "tool"):
        raise ApiError(
            400, f"messages[{index}].role must be system, user, assistant or tool, not {role!r}"
        )
    if content is None:
        content = ""
    if not isinstance(content, str):
        raise ApiError(400, f"messages[{index}].content must be text")
    if not _empty(message.get("images")):
        raise ApiError(
            400,
            f"messages[{index}].images: images are not mapped to llama-server yet; send them "
            "to /v1/chat/completions as image_url parts",
        )
    out: dict[str, Any] = {"role": role, "content": content}
    if not _empty(message.get("thinking")):
        out["reasoning_content"] = message["thinking"]
    if message.get("tool_name"):
        out["name"] = message["tool_name"]
    calls = message.get("tool_calls")
    if not _empty(calls):
        if not isinstance(calls, list) or len(calls) > MAX_ITEMS:
            raise ApiError(400, f"messages[{index}].tool_calls must be a list of calls")
        out["tool_calls"] = [_call_to_openai(index, i, call) for i, call in enumerate(calls)]
    return out


def _call_to_openai(index: int, number: int, call: object) -> dict[str, Any]:
    function = call.get("function") if isinstance(call, dict) else None
    if not isinstance(function, dict) or not isinstance(function.get("name"), str):
        raise ApiError(400, f"messages[{index}].tool_calls[{number}] needs a function name")
    arguments = function.get("arguments", {})
    return {
        "id": f"call_{index}_{number}",
        "type": "function",
        "function": {"name": function["name"], "arguments": json.dumps(arguments)},
    }


def _calls_from_openai(calls: object) -> list[dict[str, Any]]:
    """The child's tool calls (arguments as JSON text) as Ollama's (arguments as an object)."""
    out = []
    for call in calls if isinstance(calls, list) else []:
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict):
            continue
        text = function.get("arguments") or "{}"
        try:
            arguments = json.loads(text) if isinstance(text, str) else text
        except json.JSONDecodeError:
            arguments = {"_raw": text}  # shown as the model wrote it, never dropped
        out.append({"function": {"name": function.get("name", ""), "arguments": arguments}})
    return out


CHAT_KEYS: Final = frozenset(
    {"model", "messages", "stream", "format", "options", "keep_alive", "tools", "think"}
)


def chat_request(body: Mapping[str, Any]) -> Translated:
    """``POST /api/chat`` as a ``/v1/chat/completions`` request."""
    _check_keys(body, "/api/chat", CHAT_KEYS)
    messages = body.get("messages") or []
    if not isinstance(messages, list) or len(messages) > MAX_ITEMS:
        raise ApiError(400, f"messages must be a list of at most {MAX_ITEMS} messages")
    out: dict[str, Any] = {"messages": [_message(i, m) for i, m in enumerate(messages)]}
    tools = body.get("tools")
    if not _empty(tools):
        if not isinstance(tools, list) or len(tools) > MAX_ITEMS:
            raise ApiError(400, "tools must be a list of function tools")
        out["tools"] = tools  # Ollama's tools are OpenAI's shape
    return _generation("chat", body, "/v1/chat/completions", out)


GENERATE_KEYS: Final = frozenset(
    {
        "model",
        "prompt",
        "suffix",
        "system",
        "template",
        "context",
        "stream",
        "raw",
        "format",
        "images",
        "options",
        "keep_alive",
        "think",
    }
)


def generate_request(body: Mapping[str, Any]) -> Translated:
    """``POST /api/generate``: a prompt through the model's chat template (the child's
    ``/v1/chat/completions``), or as it is with ``raw`` (``/v1/completions``)."""
    _check_keys(body, "/api/generate", GENERATE_KEYS)
    refused = {
        "suffix": "fill-in-the-middle is llama-server's /infill",
        "template": "the chat template comes from the GGUF or the preset's chat-template",
        "context": "send the conversation to /api/chat instead",
        "images": "images are not mapped to llama-server yet",
    }
    for key, why in refused.items():
        if not _empty(body.get(key)):
            raise ApiError(400, f"/api/generate does not map {key}: {why}")
    prompt, system = body.get("prompt") or "", body.get("system") or ""
    if not isinstance(prompt, str) or not isinstance(system, str):
        raise ApiError(400, "prompt and system must be text")
    raw = body.get("raw", False)
    if not isinstance(raw, bool):
        raise ApiError(400, "raw must be true or false")
    if raw:
        if system:
            raise ApiError(400, "raw prompts take no system message: put it in the prompt")
        return _generation("generate", body, "/v1/completions", {"prompt": prompt})
    messages = [{"role": "system", "content": system}] if system else []
    messages.append({"role": "user", "content": prompt})
    return _generation("generate", body, "/v1/chat/completions", {"messages": messages})


def _generation(kind: str, body: Mapping[str, Any], path: str, out: dict[str, Any]) -> Translated:
    stream = _stream(body)
    out.update(sampling(body.get("options")))
    out.update(response_format(body.get("format")))
    out.update(thinking(body.get("think")))
    out["stream"] = stream
    if stream:
        out["stream_options"] = {"include_usage": True}  # the counts for the last line
    return Translated(kind, model_name(body), path, out, stream, body.get("keep_alive"))


EMBED_KEYS: Final = frozenset({"model", "input", "truncate", "options", "keep_alive", "dimensions"})


def embed_request(body: Mapping[str, Any]) -> Translated:
    """``POST /api/embed`` as ``/v1/embeddings``."""
    _check_keys(body, "/api/embed", EMBED_KEYS)
    text = body.get("input")
    if isinstance(text, list):
        if len(text) > MAX_ITEMS or not all(isinstance(t, str) for t in text):
            raise ApiError(400, f"input must be text or a list of at most {MAX_ITEMS} texts")
    elif not isinstance(text, str):
        raise ApiError(400, "input must be text or a list of texts")
    if body.get("truncate") is False:
        raise ApiError(
            400, "truncate=false is not mapped: llama-server decides how a long input is cut"
        )
    if not _empty(body.get("dimensions")):
        raise ApiError(400, "dimensions is not mapped: llama-server returns the model's own")
    if not _empty(body.get("options")):
        raise ApiError(400, "options are not mapped for embeddings (no sampling happens)")
    keep_alive = body.get("keep_alive")
    return Translated(
        "embed", model_name(body), "/v1/embeddings", {"input": text}, False, keep_alive
    )


def durations(answer: Mapping[str, Any], total_ns: int, load_ns: int) -> dict[str, Any]:
    """Ollama's counts and nanosecond durations from the child's ``usage`` and ``timings``."""
    usage = answer.get("usage") if isinstance(answer.get("usage"), dict) else {}
    timings = answer.get("timings") if isinstance(answer.get("timings"), dict) else {}
    assert isinstance(usage, dict) and isinstance(timings, dict)
    out: dict[str, Any] = {"total_duration": total_ns, "load_duration": load_ns}
    prompt_n = timings.get("prompt_n", usage.get("prompt_tokens"))
    eval_n = timings.get("predicted_n", usage.get("completion_tokens"))
    if isinstance(prompt_n, int):
        out["prompt_eval_count"] = prompt_n
    if isinstance(eval_n, int):
        out["eval_count"] = eval_n
    for field, key in (("prompt_ms", "prompt_eval_duration"), ("predicted_ms", "eval_duration")):
        value = timings.get(field)
        if isinstance(value, (int, float)) and math.isfinite(value):
            out[key] = int(value * NS_PER_MS)
    return out


def done_reason(finish: object) -> str:
    """OpenAI's ``finish_reason`` as Ollama's ``done_reason``."""
    return "length" if finish == "length" else "stop"


def _choice(answer: Mapping[str, Any]) -> dict[str, Any]:
    choices = answer.get("choices")
    if isinstance(choices, list) and choices and isinstance(choices[0], dict):
        return choices[0]
    return {}


def assistant_message(message: Mapping[str, Any]) -> dict[str, Any]:
    """The child's assistant message (or a stream's delta) in Ollama's shape."""
    out: dict[str, Any] = {"role": "assistant", "content": message.get("content") or ""}
    if message.get("reasoning_content"):
        out["thinking"] = message["reasoning_content"]
    if message.get("tool_calls"):
        out["tool_calls"] = _calls_from_openai(message["tool_calls"])
    return out


def answer_piece(request: Translated, piece: Mapping[str, Any]) -> dict[str, Any]:
    """What a whole answer or a stream's chunk says, as Ollama's ``message`` (chat) or
    ``response`` (generate) field."""
    choice = _choice(piece)
    if "text" in choice:  # /v1/completions (raw)
        return {"response": choice.get("text") or ""}
    message = choice.get("message") or choice.get("delta") or {}
    if not isinstance(message, dict):
        message = {}
    said = assistant_message(message)
    if request.kind == "chat":
        return {"message": said}
    out: dict[str, Any] = {"response": said["content"]}
    if "thinking" in said:
        out["thinking"] = said["thinking"]
    return out


def finish_of(piece: Mapping[str, Any]) -> object:
    """The chunk's (or answer's) ``finish_reason``: None until the last one."""
    return _choice(piece).get("finish_reason")
