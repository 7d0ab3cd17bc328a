"""Side by side with llama.cpp's own router: the same requests get the same answers.

Both servers run the same llama-server binary (llama.cpp's router is that binary started
without a model), on the same models folder and preset, with the same flags: b11434 built from
source by `corral llama-server build` (each router is started once per module). A scripted list of
requests goes to each in turn; every answer must agree in status, error body (code, type and
message), JSON shape (keys and value types, recursively; values may differ) and the headers
clients read (``Content-Type``, ``Access-Control-Allow-Origin``). Corral's extra ``corral``
object per model is left out of the shape. The differences we keep on purpose are asserted as
differences, each in its own test, so a change on either side shows up.
"""

from __future__ import annotations

import http.client
import json
import os
import re
import shutil
import signal
import ssl
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests.integration.harness import (
    REPO,
    AgentProcess,
    children_of,
    free_port,
    wait_healthy,
)
from tests.integration.test_tls import certificate  # noqa: F401 (the fixture, one copy)

TINY, EMBED, BROKEN = "demo-tiny", "demo-small", "broken"
KEY = "sekrit-key"
ORIGIN = "http://client.example"
# The same flags for both routers; --metrics reaches the children, so /metrics?model= answers.
FLAGS = ("--models-max", "2", "-c", "1024", "--metrics")
MESSAGES = [{"role": "user", "content": "hello"}]


@dataclass(frozen=True)
class Answer:
    status: int
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


def call(
    port: int,
    method: str,
    path: str,
    body: Any = None,
    *,
    raw: bytes | None = None,
    headers: dict[str, str | None] | None = None,
) -> Answer:
    """One request; a header given as None is not sent (``Origin`` is, unless so)."""
    data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    try:
        sent: dict[str, str | None] = {"Origin": ORIGIN}
        if data is not None:
            sent["Content-Type"] = "application/json"
        sent.update(headers or {})
        given = {k: v for k, v in sent.items() if v is not None}
        conn.request(method, path, body=data, headers=given)
        response = conn.getresponse()
        return Answer(
            response.status, {k.lower(): v for k, v in response.getheaders()}, response.read()
        )
    finally:
        conn.close()


class LlamaRouter:
    """llama.cpp's router (``llama-server`` without a model) as a real process."""

    def __init__(
        self,
        binary: str,
        args: Sequence[str],
        log_path: Path,
        *,
        env: dict[str, str] | None = None,
        port: int | None = None,
        wait: bool = True,
    ) -> None:
        self.port = port or free_port()
        self._log = log_path.open("wb")
        self.log_path = log_path
        self.proc = subprocess.Popen(
            [binary, "--host", "127.0.0.1", "--port", str(self.port), *args],
            stdout=self._log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env={**os.environ, **(env or {})},
        )
        if wait:  # not over TLS: the wait speaks plain HTTP
            wait_healthy(self.proc, self.port, self.log, "llama.cpp's router")

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self) -> None:
        children = children_of(self.proc.pid)
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self._log.close()
        # Its children exit when their stdin (a pipe from the router) closes.
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and any(Path(f"/proc/{p}").exists() for p in children):
            time.sleep(0.05)


@dataclass
class Pair:
    peer: int
    corral: int
    agent: AgentProcess
    router: LlamaRouter
    headers: dict[str, str | None] = field(default_factory=dict)

    def both(self, method: str, path: str, body: Any = None, **kw: Any) -> tuple[Answer, Answer]:
        headers = {**self.headers, **kw.pop("headers", {})}
        return (
            call(self.peer, method, path, body, headers=headers, **kw),
            call(self.corral, method, path, body, headers=headers, **kw),
        )


def models_folder(root: Path, demo_dir: Path) -> tuple[Path, Path]:
    """Two demo models, a corrupt one, and a preset that starts one model with embeddings."""
    folder = root / "models"
    folder.mkdir()
    for name in (TINY, EMBED):
        shutil.copyfile(demo_dir / f"{name}.gguf", folder / f"{name}.gguf")
    # A GGUF cut short: the child fails to load it ("model name=broken failed to load").
    (folder / f"{BROKEN}.gguf").write_bytes((demo_dir / f"{EMBED}.gguf").read_bytes()[:100_000])
    preset = root / "preset.ini"
    preset.write_text(f"[{EMBED}]\nembeddings = true\n")
    return folder, preset


def start_pair(
    tmp: Path,
    llama_server: str,
    args: Sequence[str],
    env_for: Callable[[int], dict[str, str]] | None = None,
) -> Pair:
    """Both routers on the same binary and arguments; ``env_for(port)``: each one's extra
    environment, given the port it listens on."""
    ports = free_port(), free_port()
    envs = [env_for(port) if env_for else None for port in ports]
    router = LlamaRouter(llama_server, args, tmp / "llama-router.log", env=envs[0], port=ports[0])
    try:
        agent = AgentProcess(["--llama-server", llama_server, *args], env=envs[1], port=ports[1])
    except BaseException:
        router.stop()
        raise
    return Pair(router.port, agent.port, agent, router)


def stop_pair(pair: Pair) -> None:
    agent_children = pair.agent.children()
    pair.router.stop()
    pair.agent.stop()
    assert not [p for p in agent_children if Path(f"/proc/{p}").exists()]


@pytest.fixture(scope="module")
def binary(b11434: Path) -> str:
    """The llama-server both routers run: b11434, as `corral llama-server build` makes it."""
    return str(b11434)


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory, demo_dir: Path, binary: str) -> Iterator[Pair]:
    tmp = tmp_path_factory.mktemp("compat")
    folder, preset = models_folder(tmp, demo_dir)
    both = start_pair(
        tmp, binary, ["--models-dir", str(folder), "--models-preset", str(preset), *FLAGS]
    )
    yield both
    stop_pair(both)


@pytest.fixture(scope="module")
def keyed_pair(
    tmp_path_factory: pytest.TempPathFactory, demo_dir: Path, binary: str
) -> Iterator[Pair]:
    tmp = tmp_path_factory.mktemp("compat-key")
    folder, _ = models_folder(tmp, demo_dir)
    both = start_pair(tmp, binary, ["--models-dir", str(folder), *FLAGS, "--api-key", KEY])
    yield both
    stop_pair(both)


# -- comparing ---------------------------------------------------------------------------------


def shape(value: Any) -> Any:
    """Keys and value types, recursively: a list's shape is the set of its elements' shapes."""
    if isinstance(value, dict):
        return {k: shape(v) for k, v in value.items() if k != "corral"}
    if isinstance(value, list):
        shapes: list[Any] = []
        for item in value:
            s = shape(item)
            if s not in shapes:
                shapes.append(s)
        return sorted(shapes, key=repr)
    if isinstance(value, bool) or value is None:
        return type(value).__name__
    if isinstance(value, int | float):
        return "number"  # 0 and 0.5 are one JSON type
    return type(value).__name__


def content_type(answer: Answer) -> str:
    return answer.headers.get("content-type", "").replace(" ", "").lower()


def sse_events(body: bytes) -> list[Any]:
    events = []
    for line in body.decode().splitlines():
        if line.startswith("data: "):
            payload = line[len("data: ") :]
            events.append(payload if payload == "[DONE]" else json.loads(payload))
    return events


def metric_names(body: bytes) -> set[str]:
    return {line.split()[2] for line in body.decode().splitlines() if line.startswith("# TYPE")}


def models_shape(answer: Answer) -> dict[str, Any]:
    """``/models`` by model id (both list the same models; their order is not the contract)."""
    data = answer.json()
    return {
        "top": shape({k: v for k, v in data.items() if k != "data"}),
        "models": {m["id"]: shape(m) for m in data["data"]},
        "states": {m["id"]: m["status"]["value"] for m in data["data"]},
    }


def without_corral(value: Any) -> Any:
    """``value`` without Corral's extras (``corral`` keys), which llama.cpp never sends, and
    without what Corral's messages add after llama.cpp's words, both listed differences in
    docs/compatibility.md: a failed load's cause and what to do (issue 29), and a 501's
    ``(with Corral: …)`` fix (issue 49)."""
    if isinstance(value, dict):
        return {k: without_corral(v) for k, v in value.items() if k != "corral"}
    if isinstance(value, str) and value.startswith("model name="):
        head, said, _ = value.partition(" failed to load: ")
        return f"{head} failed to load" if said else value
    if isinstance(value, str) and value.endswith(" corral agent for every model)"):
        head, said, _ = value.partition(" (with Corral: ")
        return head if said else value
    return value


def assert_same(step: str, peer: Answer, corral: Answer) -> None:
    where = (
        f"{step}\n  llama.cpp: {peer.status} {peer.body[:400]!r}"
        f"\n  corral:    {corral.status} {corral.body[:400]!r}"
    )
    assert corral.status == peer.status, where
    assert content_type(corral) == content_type(peer), where
    assert corral.headers.get("access-control-allow-origin") == peer.headers.get(
        "access-control-allow-origin"
    ), where
    kind = content_type(peer)
    if kind.startswith("text/event-stream"):
        assert [shape(e) for e in sse_events(corral.body)] == [
            shape(e) for e in sse_events(peer.body)
        ], where
    elif kind.startswith("application/json"):
        if peer.status >= 400:  # error bodies must be equal: code, type and message
            assert without_corral(corral.json()) == peer.json(), where
        elif step.split()[1] in ("/models", "/v1/models"):
            assert models_shape(corral) == models_shape(peer), where
        else:
            assert shape(corral.json()) == shape(peer.json()), where
    elif "/metrics" in step:
        assert metric_names(corral.body) == metric_names(peer.body), where
    else:
        assert corral.body == peer.body, where


def wait_settled(pair: Pair, states: dict[str, str]) -> None:
    """Wait until both servers list each model in the given state (loads are asynchronous)."""
    for port in (pair.peer, pair.corral):
        deadline = time.monotonic() + 20
        while True:
            listed = {
                m["id"]: m["status"]["value"]
                for m in call(port, "GET", "/models", headers=pair.headers).json()["data"]
            }
            if all(listed[name] == state for name, state in states.items()):
                break
            assert time.monotonic() < deadline, f"port {port}: {listed} never became {states}"
            time.sleep(0.05)


# -- the script --------------------------------------------------------------------------------

Step = tuple[str, str, Any] | tuple[str, str, Any, bytes] | dict[str, str]


def gen(extra: dict[str, Any]) -> dict[str, Any]:
    """Greedy and short, so both servers generate the same few tokens."""
    return {"model": TINY, "temperature": 0, **extra}


SCRIPT: list[Step] = [
    # the router's own endpoints, before any model runs
    ("GET", "/health", None),
    ("GET", "/v1/health", None),
    ("GET", "/props", None),
    ("GET", "/props?model=", None),  # an empty model is no model: the router's props
    ("GET", "/models", None),
    ("GET", "/v1/models", None),
    # every error a client can cause without a model running
    ("GET", "/no/such/path", None),
    ("POST", "/no/such/path", {}),
    ("GET", "/v1/chat/completions", None),  # known path, wrong method
    ("GET", "/models/load", None),
    ("POST", "/v1/chat/completions", [1, 2]),  # body not an object
    ("POST", "/v1/chat/completions", {"model": 3}),  # model not a string
    ("POST", "/v1/chat/completions", {"messages": MESSAGES}),  # model missing
    ("POST", "/v1/chat/completions", {"model": ""}),
    ("POST", "/v1/chat/completions", {"model": "no-such-model"}),
    ("POST", "/v1/chat/completions", {"model": "../demo-tiny"}),
    ("POST", "/v1/chat/completions?autoload=false", gen({"messages": MESSAGES})),
    ("GET", f"/props?model={TINY}&autoload=false", None),
    ("GET", f"/props?model={TINY}&autoload=yes", None),  # only "true" and "1" mean yes
    ("GET", "/slots", None),  # a proxied GET without ?model=
    ("GET", "/slots?model=no-such-model", None),
    ("POST", "/models/unload", {"model": TINY}),  # not running
    ("POST", "/models/unload", {"model": "no-such-model"}),
    ("POST", "/models/unload", {}),
    # load, then every proxied endpoint
    ("POST", "/models/load", {"model": TINY}),
    {"wait": TINY, "state": "loaded"},
    ("POST", "/models/load", {"model": TINY}),  # already running
    ("POST", "/completion", gen({"prompt": "hi", "n_predict": 3})),
    ("POST", "/completion", gen({"prompt": "hi", "n_predict": 3, "stream": True})),
    ("POST", "/completions", gen({"prompt": "hi", "max_tokens": 3})),
    ("POST", "/v1/completions", gen({"prompt": "hi", "max_tokens": 3})),
    ("POST", "/chat/completions", gen({"messages": MESSAGES, "max_tokens": 3})),
    ("POST", "/v1/chat/completions", gen({"messages": MESSAGES, "max_tokens": 3})),
    ("POST", "/v1/chat/completions", gen({"messages": MESSAGES, "max_tokens": 3, "stream": True})),
    ("POST", "/v1/responses", gen({"input": "hello", "max_output_tokens": 3})),
    ("POST", "/v1/messages", gen({"messages": MESSAGES, "max_tokens": 3})),
    ("POST", "/v1/messages/count_tokens", gen({"messages": MESSAGES})),
    ("POST", "/infill", gen({"input_prefix": "def f(", "input_suffix": "):", "n_predict": 3})),
    ("POST", "/tokenize", gen({"content": "hello world"})),
    ("POST", "/detokenize", gen({"tokens": [300, 301, 302]})),
    ("POST", "/apply-template", gen({"messages": MESSAGES})),
    ("POST", "/v1/embeddings", gen({"input": "hello"})),  # started without --embeddings
    ("POST", "/embedding", {"model": EMBED, "content": "hello"}),
    ("POST", "/embeddings", {"model": EMBED, "content": "hello"}),
    ("POST", "/v1/embeddings", {"model": EMBED, "input": ["hello", "world"]}),
    ("POST", "/rerank", {"model": EMBED, "query": "hello", "documents": ["a", "b"]}),
    ("POST", "/v1/rerank", {"model": EMBED, "query": "hello", "documents": ["a", "b"]}),
    ("GET", f"/props?model={TINY}", None),
    ("GET", f"/metrics?model={TINY}", None),
    ("GET", f"/slots?model={TINY}", None),
    {"wait": EMBED, "state": "loaded"},
    ("GET", "/models", None),
    ("GET", "/v1/models", None),
    # unload both, then a model whose child cannot load it
    ("POST", "/models/unload", {"model": TINY}),
    ("POST", "/models/unload", {"model": EMBED}),
    {"wait": TINY, "state": "unloaded"},
    {"wait": EMBED, "state": "unloaded"},
    ("POST", "/v1/chat/completions", {"model": BROKEN, "messages": MESSAGES, "max_tokens": 2}),
    {"wait": BROKEN, "state": "unloaded"},
    ("GET", "/models", None),
]


def test_scripted_requests_get_the_same_answers(pair: Pair) -> None:
    requests = 0
    for step in SCRIPT:
        if isinstance(step, dict):
            wait_settled(pair, {step["wait"]: step["state"]})
            continue
        method, path, body, *raw = step
        peer, corral = pair.both(method, path, body, raw=raw[0] if raw else None)
        assert_same(f"{method} {path} {json.dumps(body)[:120]}", peer, corral)
        requests += 1
    assert requests >= 25
    failed = {m["id"]: m for m in pair.agent.models().values()}[BROKEN]["status"]
    assert failed["failed"] is True and failed["exit_code"] != 0


def test_the_routers_build_info_is_its_binarys(pair: Pair) -> None:
    # llama.cpp's router reports its own build (b<build>-<commit>); Corral, the binary it runs.
    peer, corral = pair.both("GET", "/props")
    assert peer.json()["build_info"].startswith("b")
    assert corral.json()["build_info"] == peer.json()["build_info"]


def test_cors_preflight_is_answered_like_llama_cpp(pair: Pair) -> None:
    peer, corral = pair.both("OPTIONS", "/v1/chat/completions")
    assert_same("OPTIONS /v1/chat/completions", peer, corral)
    for header in (
        "access-control-allow-credentials",
        "access-control-allow-methods",
        "access-control-allow-headers",
    ):
        assert corral.headers[header] == peer.headers[header]


def read_events(conn: http.client.HTTPResponse, model: str, last: str) -> list[dict[str, Any]]:
    events = []
    while True:
        line = conn.fp.readline()
        assert line, "the event stream ended"
        if line.startswith(b"data: "):
            event = json.loads(line[len(b"data: ") :])
            if event["model"] == model:
                events.append(event)
                if event["event"] == "status_change" and event["data"]["status"] == last:
                    return events


def test_model_events_have_the_same_shape(pair: Pair) -> None:
    streams = []
    for port in (pair.peer, pair.corral):
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=20)
        conn.request("GET", "/models/sse")
        streams.append((conn, conn.getresponse()))
    try:
        shapes = []
        for port, (_, stream) in zip((pair.peer, pair.corral), streams, strict=True):
            assert call(port, "POST", "/models/load", {"model": TINY}).status == 200
            events = read_events(stream, TINY, "loaded")
            assert call(port, "POST", "/models/unload", {"model": TINY}).status == 200
            events += read_events(stream, TINY, "unloaded")
            shapes.append([shape(e) for e in events])
        assert shapes[1] == shapes[0]
    finally:
        for conn, _ in streams:
            conn.close()


def test_api_key_rules_match(keyed_pair: Pair) -> None:
    wrong: dict[str, str | None] = {"Authorization": "Bearer nope"}
    bearer: dict[str, str | None] = {"Authorization": f"Bearer {KEY}"}
    cases: list[tuple[str, str, Any, dict[str, str | None]]] = [
        ("GET", "/health", None, {}),  # load balancers' probe: public
        ("GET", "/v1/health", None, {}),
        ("GET", "/props", None, {}),
        ("GET", "/props", None, wrong),
        ("GET", "/props", None, bearer),
        ("GET", "/props", None, {"Authorization": KEY}),  # a bare key is accepted
        ("GET", "/props", None, {"Authorization": f"bearer {KEY}"}),  # the prefix is exact
        ("GET", "/props", None, {"X-Api-Key": KEY}),  # Anthropic clients' header
        ("GET", "/props", None, {"X-Api-Key": f"Bearer {KEY}"}),
        ("GET", "/props", None, {**wrong, "X-Api-Key": KEY}),  # Authorization wins
        ("GET", f"/props?model={TINY}", None, {}),
        ("GET", f"/slots?model={TINY}", None, wrong),
        ("GET", "/models/sse", None, {}),
        ("GET", "/no/such/path", None, {}),  # the key is checked before the route
        ("GET", "/no/such/path", None, bearer),
        ("POST", "/v1/chat/completions", {"model": TINY}, {}),
        ("POST", "/models/load", {"model": TINY}, wrong),
        ("POST", "/tokenize", {"model": TINY, "content": "hello"}, bearer),
    ]
    for method, path, body, headers in cases:
        peer, corral = keyed_pair.both(method, path, body, headers=headers)
        assert_same(f"{method} {path} {headers}", peer, corral)
    peer, corral = keyed_pair.both("OPTIONS", "/v1/chat/completions")  # preflights need no key
    assert_same("OPTIONS without a key", peer, corral)


# -- endpoints added since b10434 ---------------------------------------------------------------

# Every route b11434's router proxies by the body's model; the pinned child lacks /v1/systemone.
NEW_POSTS = (
    "/v1/chat/completions/control",
    "/responses",
    "/v1/audio/transcriptions",
    "/audio/transcriptions",
    "/v1/systemone",
    "/chat/completions/input_tokens",
    "/v1/chat/completions/input_tokens",
    "/responses/input_tokens",
    "/v1/responses/input_tokens",
    "/lora-adapters",
    "/slots/0",
    "/props",
)
BOUNDARY = "corral-test-boundary"


def multipart(fields: dict[str, str], audio: bytes | None = None) -> tuple[bytes, dict[str, Any]]:
    """A ``multipart/form-data`` body as OpenAI's clients send an audio upload."""
    parts = [
        f'--{BOUNDARY}\r\nContent-Disposition: form-data; name="{k}"\r\n\r\n{v}\r\n'.encode()
        for k, v in fields.items()
    ]
    if audio is not None:
        parts.append(
            f'--{BOUNDARY}\r\nContent-Disposition: form-data; name="file"; filename="a.wav"\r\n'
            "Content-Type: audio/wav\r\n\r\n".encode()
            + audio
            + b"\r\n"
        )
    body = b"".join(parts) + f"--{BOUNDARY}--\r\n".encode()
    return body, {"Content-Type": f"multipart/form-data; boundary={BOUNDARY}"}


def test_endpoints_added_since_b10434_get_the_same_answers(pair: Pair) -> None:
    steps: list[tuple[str, str, Any, dict[str, Any]]] = []
    for path in NEW_POSTS:  # the model lookup, before any model runs
        steps += [("POST", path, {}, {}), ("POST", path, {"model": "no-such-model"}, {})]
    audio, form = multipart({"model": TINY}, b"RIFF\0\0\0\0WAVE")
    no_model, _ = multipart({"language": "en"}, b"RIFF\0\0\0\0WAVE")
    steps += [
        ("GET", "/lora-adapters", None, {}),
        ("GET", "/lora-adapters?model=no-such-model", None, {}),
        ("POST", f"/props?model={TINY}", {}, {}),  # a POST names its model in the body
        ("POST", "/v1/audio/transcriptions", None, {"raw": no_model, "headers": form}),
        # then each with a model that runs (the first one loads it)
        ("POST", "/v1/chat/completions/control", {"model": TINY}, {}),
        ("POST", "/v1/chat/completions/control", {"model": TINY, "id": "x", "action": "x"}, {}),
        ("POST", "/responses", gen({"input": "hello", "max_output_tokens": 3}), {}),
        ("POST", "/responses", gen({"input": "hello", "max_output_tokens": 3, "stream": True}), {}),
        ("POST", "/chat/completions/input_tokens", gen({"messages": MESSAGES}), {}),
        ("POST", "/v1/chat/completions/input_tokens", gen({"messages": MESSAGES}), {}),
        ("POST", "/responses/input_tokens", gen({"input": "hello"}), {}),
        ("POST", "/v1/responses/input_tokens", gen({"input": "hello"}), {}),
        ("GET", f"/lora-adapters?model={TINY}", None, {}),
        ("POST", "/lora-adapters", {"model": TINY}, {}),  # "Request body must be an array"
        ("POST", "/lora-adapters", [], {}),
        ("POST", "/slots/0", {"model": TINY}, {}),  # started without --slot-save-path
        ("POST", "/slots/0?action=erase", {"model": TINY}, {}),
        ("POST", "/props", {"model": TINY}, {}),  # started without --props
        ("POST", "/v1/audio/transcriptions", None, {"raw": audio, "headers": form}),
        ("POST", "/audio/transcriptions", None, {"raw": audio, "headers": form}),
        ("POST", "/v1/systemone", {"model": TINY}, {}),
    ]
    for method, path, body, kw in steps:
        peer, corral = pair.both(method, path, body, **kw)
        assert_same(f"{method} {path} {json.dumps(body)[:120]}", peer, corral)
    assert call(pair.corral, "POST", "/models/unload", {"model": TINY}).status == 200
    assert call(pair.peer, "POST", "/models/unload", {"model": TINY}).status == 200
    wait_settled(pair, {TINY: "unloaded"})


# -- browsers: CORS as llama.cpp answers it ------------------------------------------------------

CORS_FLAGS = {
    "localhost": ("--cors-origins", "localhost"),
    "any-without-credentials": (
        "--no-cors-credentials",
        "--cors-methods",
        "GET, POST",
        "--cors-headers",
        "Content-Type, Authorization",
    ),
    "one-origin": ("--cors-origins", "http://app.example"),
}
ORIGINS: tuple[str | None, ...] = (
    "http://localhost:5173",
    "http://127.0.0.1:9",
    "http://[::1]:8080",
    "https://localhost",
    "http://localhost.evil.com",
    "http://notlocalhost",
    "http://evil.example",
    "http://app.example",
    "null",
    "",
    None,  # no Origin header
)


@pytest.fixture(scope="module", params=sorted(CORS_FLAGS))
def cors_pair(
    request: pytest.FixtureRequest,
    tmp_path_factory: pytest.TempPathFactory,
    demo_dir: Path,
    binary: str,
) -> Iterator[Pair]:
    tmp = tmp_path_factory.mktemp("compat-cors")
    folder, _ = models_folder(tmp, demo_dir)
    both = start_pair(
        tmp, binary, ["--models-dir", str(folder), *FLAGS, *CORS_FLAGS[request.param]]
    )
    yield both
    stop_pair(both)


def cors_of(answer: Answer) -> dict[str, str]:
    return {k: v for k, v in answer.headers.items() if k.startswith("access-control-")}


def assert_same_cors(pair: Pair) -> None:
    requests: list[tuple[str, str, Any]] = [
        ("GET", "/health", None),
        ("GET", "/models", None),
        ("OPTIONS", "/v1/chat/completions", None),
        ("OPTIONS", "/no/such/path", None),
        ("POST", "/tokenize", {"model": TINY, "content": "hello"}),  # a proxied answer
        ("GET", f"/props?model={TINY}", None),
        ("GET", "/no/such/path", None),
    ]
    for origin in ORIGINS:
        for method, path, body in requests:
            peer, corral = pair.both(method, path, body, headers={"Origin": origin})
            where = f"{method} {path} Origin: {origin!r}"
            allowed = cors_of(peer).get("access-control-allow-origin") in (origin, "*")
            if "?model=" in path and origin is not None and not allowed:
                # A deliberate difference (issue 26, row 20): a GET that may load a model, from
                # an origin --cors-origins does not allow, is refused; llama.cpp loads it.
                assert corral.status == 403, where
            else:
                assert corral.status == peer.status, where
            assert cors_of(corral) == cors_of(peer), where


def test_cors_headers_match_for_every_origin(cors_pair: Pair) -> None:
    assert_same_cors(cors_pair)


def test_cors_headers_match_by_default(pair: Pair) -> None:
    assert_same_cors(pair)


def test_open_cors_without_a_key_logs_llama_cpps_warning(pair: Pair, keyed_pair: Pair) -> None:
    warning = "security: no API key is set and CORS allows all origins"
    assert warning in own_lines(pair.router.log())
    assert warning in pair.agent.log()
    # The keyed router's children warn too (it gives them no key): only its own lines count.
    assert warning not in own_lines(keyed_pair.router.log())
    assert warning not in keyed_pair.agent.log()


def own_lines(log: str) -> str:
    """A llama.cpp router's own log lines: its children's carry their port (``[59667] …``)."""
    return "\n".join(line for line in log.splitlines() if not re.match(r"\[\d+\] ", line))


# -- the binary in use: its options, its TLS ---------------------------------------------------


def start_fails(argv: Sequence[str]) -> subprocess.CompletedProcess[str]:
    """A server that must refuse its command line: it exits (within the bound) non-zero."""
    done = subprocess.run(
        argv, capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL, cwd=REPO
    )
    assert done.returncode != 0, (argv, done.stdout[-400:], done.stderr[-400:])
    return done


def test_options_are_the_binarys_own(pair: Pair, binary: str, demo_dir: Path) -> None:
    build = call(pair.peer, "GET", "/props").json()["build_info"]
    corral = [sys.executable, "-m", "node_agent.cli", "agent", "--llama-server", binary]
    router = [binary, "--host", "127.0.0.1", "--port", str(free_port())]
    models = ["--models-dir", str(demo_dir)]
    peer = start_fails([*router, *models, "--no-such-option"])
    assert "invalid argument: --no-such-option" in peer.stdout + peer.stderr
    ours = start_fails([*corral, *models, "--no-such-option"])
    assert f"nor one of llama-server {build} ({binary})" in ours.stderr, ours.stderr
    # --n-cpu-ffn is new in b11434 (test_binary_options.py: a binary without it refuses it).
    newer = ["--n-cpu-ffn", "1"]
    llama = LlamaRouter(binary, [*models, *newer], pair.router.log_path.with_name("newer.log"))
    llama.stop()
    AgentProcess(["--llama-server", binary, *models, *newer]).stop()


def https_get(port: int, path: str, cert: Path) -> Answer:
    context = ssl.create_default_context(cafile=str(cert))
    conn = http.client.HTTPSConnection("127.0.0.1", port, timeout=30, context=context)
    try:
        conn.request("GET", path)
        response = conn.getresponse()
        headers = {k.lower(): v for k, v in response.getheaders()}
        return Answer(response.status, headers, response.read())
    finally:
        conn.close()


def wait_https(port: int, path: str, cert: Path) -> Answer:
    deadline = time.monotonic() + 30
    while True:
        try:
            return https_get(port, path, cert)
        except (OSError, http.client.HTTPException):
            assert time.monotonic() < deadline, f"nothing answers HTTPS on port {port}"
            time.sleep(0.1)


def test_tls_as_llama_cpp_serves_it(
    binary: str,
    demo_dir: Path,
    certificate: tuple[Path, Path],  # noqa: F811 (test_tls's fixture)
    tmp_path: Path,
) -> None:
    key, cert = certificate
    tls = ["--models-dir", str(demo_dir), "--ssl-key-file", str(key), "--ssl-cert-file", str(cert)]
    router = LlamaRouter(binary, tls, tmp_path / "router.log", wait=False)
    agent = AgentProcess(["--llama-server", binary, *tls], wait=False)
    try:
        for path in ("/health", "/props", "/models"):
            peer = wait_https(router.port, path, cert)
            corral = wait_https(agent.port, path, cert)
            assert_same(f"GET {path} over TLS", peer, corral)
    finally:
        router.stop()
        agent.stop()


# -- Google Cloud Vertex AI's prediction routes (AIP_MODE=PREDICTION) -----------------------------


@pytest.fixture(scope="module")
def vertex_pair(
    tmp_path_factory: pytest.TempPathFactory, demo_dir: Path, binary: str
) -> Iterator[Pair]:
    tmp = tmp_path_factory.mktemp("compat-vertex")
    folder, _ = models_folder(tmp, demo_dir)

    def vertex(port: int) -> dict[str, str]:  # Vertex gives the port in AIP_HTTP_PORT
        return {"AIP_MODE": "PREDICTION", "AIP_HTTP_PORT": str(port), "AIP_HEALTH_ROUTE": "hz"}

    both = start_pair(tmp, binary, ["--models-dir", str(folder), *FLAGS], vertex)
    yield both
    stop_pair(both)


def test_vertex_prediction_routes_answer_the_same(vertex_pair: Pair, binary: str) -> None:
    too_many = {"instances": [{}] * 129}
    instances = [
        1,
        {},
        {"@requestFormat": 3},
        {"@requestFormat": "nope"},
        {"@requestFormat": "chatCompletions", "messages": MESSAGES},  # no model
        {"@requestFormat": "/tokenize", "model": "no-such-model", "content": "hi"},
    ]
    for method, path, body in (
        ("GET", "/hz", None),  # AIP_HEALTH_ROUTE serves /health
        ("POST", "/predict", {}),
        ("POST", "/predict", [1]),
        ("POST", "/predict", {"instances": 5}),
        ("POST", "/predict", too_many),
        ("POST", "/predict", {"instances": []}),
        ("POST", "/predict", {"instances": instances}),
    ):
        peer, corral = vertex_pair.both(method, path, body)
        assert_same(f"{method} {path} {json.dumps(body)[:120]}", peer, corral)
    peer, corral = vertex_pair.both("POST", "/predict", raw=b"{")
    assert peer.status == corral.status == 400
    assert peer.json()["error"]["type"] == corral.json()["error"]["type"]


def test_vertex_predictions_reach_the_model(vertex_pair: Pair, binary: str) -> None:
    # A deliberate difference: b11434's router answers each model instance with an error (its
    # children inherit AIP_MODE and take the router's port; its proxy is a stream anyway).
    chat = {"@requestFormat": "chatCompletions", "stream": True, **gen({"messages": MESSAGES})}
    body = {
        "instances": [
            {**chat, "max_tokens": 3},
            {"@requestFormat": "/tokenize", **gen({"content": "hi"})},
        ]
    }
    corral = call(vertex_pair.corral, "POST", "/predict", body)
    assert corral.status == 200, corral.body
    reply, tokens = corral.json()["predictions"]
    assert reply["object"] == "chat.completion"  # not a stream: predictions are one document
    assert reply["usage"]["completion_tokens"] > 0
    assert isinstance(tokens["tokens"], list) and tokens["tokens"]
    peer = call(vertex_pair.peer, "POST", "/predict", body)
    assert peer.status == 200
    assert all("error" in p for p in peer.json()["predictions"]), peer.body


# -- the deliberate differences (app.py's docstring lists them) --------------------------------


def test_malformed_json_is_a_400_not_a_500(pair: Pair) -> None:
    # b11434 answers 400 too (with its parser's message); b10434 answered 500.
    for path in ("/v1/chat/completions", "/completion", "/models/load", "/models/unload"):
        for raw in (b'{"model": "demo-tiny",', b"", b"\xff\xfe{"):
            peer, corral = pair.both("POST", path, raw=raw)
            assert peer.status == 400, (path, raw, peer.body)
            assert "parse_error" in peer.json()["error"]["message"]
            assert corral.status == 400, (path, raw, corral.body)
            error = corral.json()["error"]
            assert error["type"] == "invalid_request_error"
            assert error["message"].startswith("the request body is not valid JSON: ")


def test_load_of_a_missing_or_unknown_model_says_what_is_missing(pair: Pair) -> None:
    for body, message in (
        ({"model": "no-such-model"}, "model 'no-such-model' not found"),
        ({}, "model name is missing from the request"),
        ([1], "model name is missing from the request"),
    ):
        peer, corral = pair.both("POST", "/models/load", body)
        assert peer.status == corral.status == 404
        assert peer.json()["error"]["message"] == "File Not Found"  # not what is missing
        assert corral.json() == {
            "error": {"code": 404, "message": message, "type": "not_found_error"}
        }


def test_api_key_guards_the_model_list_too(keyed_pair: Pair) -> None:
    for path in ("/models", "/v1/models"):
        peer, corral = keyed_pair.both("GET", path)
        # b10434's router listed the models to anyone; b11434's asks for the key, as Corral.
        assert peer.status == 401
        assert corral.status == 401  # SPEC: every endpoint but /health needs the key
        assert corral.json()["error"]["message"] == "Invalid API Key"
        peer, corral = keyed_pair.both("GET", path, headers={"X-Api-Key": KEY})
        assert peer.status == corral.status == 200


def test_a_rebound_host_name_is_refused(pair: Pair) -> None:
    # Issue 16 row 13: a page on evil.rebind.example whose name now resolves to 127.0.0.1 is
    # "same origin" with the agent, so CORS never applies; only its Host header gives it away.
    for port, peer in ((pair.peer, True), (pair.corral, False)):
        answer = call(port, "GET", "/models", headers={"Host": f"evil.rebind.example:{port}"})
        if peer:
            assert answer.status == 200  # llama.cpp answers any Host
        else:
            assert answer.status == 403, answer.body
            message = answer.json()["error"]["message"]
            assert "'evil.rebind.example:" in message and "--allowed-hosts" in message
    for host in ("localhost", "127.0.0.1", "[::1]", "app.localhost"):
        peer, corral = pair.both("GET", "/models", headers={"Host": f"{host}:{pair.corral}"})
        assert peer.status == corral.status == 200, host


def test_allowed_hosts_lets_a_name_in(demo_dir: Path, binary: str) -> None:
    agent = AgentProcess(
        ["--llama-server", binary, "--models-dir", str(demo_dir), "--allowed-hosts", "box.lan"]
    )
    try:
        for host, status in (("box.lan", 200), ("BOX.lan.:80", 200), ("other.lan", 403)):
            assert call(agent.port, "GET", "/models", headers={"Host": host}).status == status
    finally:
        agent.stop()


def test_a_cross_site_simple_post_cannot_change_state(pair: Pair) -> None:
    # Issue 16 row 15: a text/plain (or form) POST needs no preflight, so a page on any origin
    # can send it, whatever --cors-origins says; llama.cpp's router obeys it.
    unload = json.dumps({"model": TINY}).encode()
    for port in (pair.peer, pair.corral):  # 400 where an earlier test left it running
        assert call(port, "POST", "/models/load", {"model": TINY}).status in (200, 400)
    wait_settled(pair, {TINY: "loaded"})
    for kind, extra in (
        ("text/plain;charset=UTF-8", {"Origin": "http://evil.example"}),
        ("application/x-www-form-urlencoded", {"Origin": "null"}),
        ("text/plain", {"Origin": None, "Sec-Fetch-Site": "cross-site"}),
    ):
        headers = {"Content-Type": kind, **extra}
        corral = call(pair.corral, "POST", "/models/unload", raw=unload, headers=headers)
        assert corral.status == 403, (kind, corral.body)
        assert corral.json()["error"]["message"].startswith("a cross-origin POST with ")
        assert corral.headers.get("access-control-allow-origin") == (extra.get("Origin") or "")
    assert pair.agent.state(TINY) == "loaded"
    peer = call(
        pair.peer, "POST", "/models/unload", raw=unload, headers={"Content-Type": "text/plain"}
    )
    assert peer.status == 200  # llama.cpp unloads the model for the page
    # curl -d labels its JSON as a form and sends no Origin: not a browser, still served.
    curl_d = {"Content-Type": "application/x-www-form-urlencoded", "Origin": None}
    assert call(pair.corral, "POST", "/models/unload", raw=unload, headers=curl_d).status == 200
    wait_settled(pair, {TINY: "unloaded"})
