"""Conversation streams (``X-Conversation-Id``, ``/v1/stream``) through the agent.

With the real model: a client that drops while its model loads still gets its generation into
the child's session buffer (the request is proxied detached), replayed from 0 afterwards; the
route answers 503 during the load; a stop during the load ends the parked request with 400.
``LLAMA_SERVER_DEBUG_FAKE_TIMING`` (2 s at the start of every load, as llama.cpp's router does)
makes the load last long enough to act in it on a busy machine. Side by side with b11434's
router: the same status codes, messages, headers and JSON shapes.
"""

from __future__ import annotations

import json
import os
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest

from node_agent.real_model import MODEL_NAME
from tests.integration.harness import AgentProcess
from tests.integration.test_compat import FLAGS, TINY, Answer, Pair, call, models_folder, start_pair

# Slashes, a space and a colon: the id travels in the query string, percent-encoded.
CONV = "org/repo::chat 1/2"
FAKE_TIMING = {"LLAMA_SERVER_DEBUG_FAKE_TIMING": "1"}
QUESTION = [
    {"role": "system", "content": "You are a helpful assistant."},
    {"role": "user", "content": "What is the capital of France?"},
]


def stream_path(conv: str, start: int | None = None) -> str:
    path = f"/v1/stream?conv_id={quote(conv, safe='')}"
    return path if start is None else f"{path}&from={start}"


def chat_request(model: str, conv: str, max_tokens: int = 24, pad: str | None = None) -> bytes:
    """``pad``: a field the child ignores, to make the body that large."""
    body: dict[str, Any] = {
        "model": model,
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": True,
        "messages": QUESTION,
    }
    if pad is not None:
        body["corral_pad"] = pad
    data = json.dumps(body).encode()
    return (
        f"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        f"Content-Type: application/json\r\nX-Conversation-Id: {conv}\r\n"
        f"Content-Length: {len(data)}\r\n\r\n"
    ).encode() + data


def send_and_drop(port: int, model: str, conv: str) -> Answer:
    """Send a conversation request and hang up before any answer (a page reload), once the
    router knows it; its first answer to ``GET /v1/stream`` then."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(chat_request(model, conv))
        # The agent reads it a moment after the send (later on a busy machine): until then
        # the route knows nothing of it (404).
        return known(port, conv)


def until(check: Any, what: str, timeout: float = 60) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def known(port: int, conv: str) -> Answer:
    """The first answer of ``GET /v1/stream`` that knows the request sent for ``conv``: 503
    while it is parked behind the load, 200 once its child has it (404 before)."""

    def answer() -> Answer | None:
        got = call(port, "GET", stream_path(conv, 0))
        assert got.status in (200, 404, 503), got
        return got if got.status != 404 else None

    found: Answer = until(answer, f"the router to know {conv}", 10)
    return found


def content_of(sse: bytes) -> str:
    """The assistant's text in a replayed chat-completion stream."""
    text = []
    for line in sse.decode().splitlines():
        if line.startswith("data: ") and line != "data: [DONE]":
            for choice in json.loads(line[6:]).get("choices", []):
                text.append(choice.get("delta", {}).get("content") or "")
    return "".join(text)


@pytest.fixture
def agent(real_model: Path, tmp_path: Path) -> Iterator[AgentProcess]:
    folder = tmp_path / "models"
    folder.mkdir()
    os.link(real_model, folder / f"{MODEL_NAME}.gguf")
    agent = AgentProcess(["--models-dir", str(folder), "-c", "2048"], FAKE_TIMING)
    yield agent
    agent.stop()


def test_a_client_that_drops_during_the_load_can_resume_from_0(agent: AgentProcess) -> None:
    # The model is still loading (2 s of fake timing at least): retry later.
    during = send_and_drop(agent.port, MODEL_NAME, CONV)
    assert during.status == 503, during
    assert during.json()["error"] == {
        "code": 503,
        "message": "Stream owner model is loading, retry later",
        "type": "unavailable_error",
    }

    # Once loaded, the request reached the child although its client was gone: replay from 0.
    # Until its session exists, the route says "retry" (never "not found", which would make a
    # client give up), also between the lease and the child reading the request.
    def replay_or_retry() -> Answer | None:
        answer = call(agent.port, "GET", stream_path(CONV, 0))
        assert answer.status in (200, 503), answer
        return answer if answer.status == 200 else None

    replay: Answer = until(replay_or_retry, "the session to appear")
    assert replay.headers["content-type"].startswith("text/event-stream")
    assert replay.body.rstrip().endswith(b"data: [DONE]"), replay.body[-200:]
    assert "Paris" in content_of(replay.body)
    # Its child was asked once whether it keeps sessions: GET /models says so.
    assert agent.models()[MODEL_NAME]["corral"]["conversation_streams"] is True
    # A replay from an offset gives the rest of the same bytes.
    tail = call(agent.port, "GET", stream_path(CONV, 100))
    assert tail.status == 200 and tail.body == replay.body[100:]
    found = call(agent.port, "POST", "/v1/streams/lookup", {"conversation_ids": [CONV, "other"]})
    assert found.status == 200
    [entry] = found.json()
    assert entry["conversation_id"] == CONV
    assert entry["is_done"] is True and entry["total_bytes"] == len(replay.body)
    # A stop evicts the session; nothing is known afterwards.
    stopped = call(agent.port, "DELETE", stream_path(CONV))
    assert stopped.status == 204 and stopped.body == b""
    gone = call(agent.port, "GET", stream_path(CONV, 0))
    assert gone.status == 404, gone
    # b11434's HTTP layer answers every 404 so, its "Stream not found or expired" included.
    assert gone.json()["error"]["message"] == "File Not Found"


def test_a_stop_during_the_load_ends_the_parked_request_with_400(agent: AgentProcess) -> None:
    with socket.create_connection(("127.0.0.1", agent.port), timeout=60) as sock:
        sock.sendall(chat_request(MODEL_NAME, CONV))
        until(lambda: call(agent.port, "GET", stream_path(CONV)).status == 503, "it parked", 10)
        stopped = call(agent.port, "DELETE", stream_path(CONV))
        assert stopped.status == 204
        answer = sock.makefile("rb").read1(4096)
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 400"), answer
    assert json.loads(body)["error"] == {
        "code": 400,
        "message": "request cancelled by a stop while the model was loading",
        "type": "invalid_request_error",
    }
    # Cancelled before it reached the child: no session, and the load went on.
    agent.wait_state(MODEL_NAME, "loaded", timeout=60)
    assert call(agent.port, "GET", stream_path(CONV, 0)).status == 404
    assert call(agent.port, "POST", "/v1/streams/lookup", {"conversation_ids": [CONV]}).json() == []


# -- side by side with b11434's router --------------------------------------------------------


@pytest.fixture
def pair(
    b11434: Path, demo_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Pair]:
    folder, _ = models_folder(tmp_path, demo_dir)
    monkeypatch.setenv(*next(iter(FAKE_TIMING.items())))  # both routers read it
    both = start_pair(tmp_path, str(b11434), ["--models-dir", str(folder), *FLAGS])
    yield both
    both.agent.stop()
    both.router.stop()


def same(peer: Answer, corral: Answer) -> None:
    assert peer.status == corral.status, (peer, corral)
    assert peer.headers.get("content-type") == corral.headers.get("content-type"), (peer, corral)
    assert (peer.body and json.loads(peer.body)) == (corral.body and json.loads(corral.body))


def test_the_stream_routes_answer_as_b11434s_router(pair: Pair) -> None:
    for method, path, body in (
        ("GET", "/v1/stream", None),
        ("GET", "/v1/stream?conv_id=", None),
        ("DELETE", "/v1/stream", None),
        ("GET", stream_path("never/seen"), None),
        ("DELETE", stream_path("never/seen"), None),
        ("POST", "/v1/streams/lookup", {"conversation_ids": ["never/seen"]}),
        ("POST", "/v1/streams/lookup", {"nothing": 1}),
    ):
        same(*pair.both(method, path, body))
    peer, corral = (
        call(port, "POST", "/v1/streams/lookup", raw=b"not json")
        for port in (pair.peer, pair.corral)
    )
    same(peer, corral)


def test_a_stop_during_the_load_and_a_resume_as_b11434s_router(pair: Pair) -> None:
    answers: dict[str, list[Answer]] = {"503": [], "400": []}
    for port in (pair.peer, pair.corral):
        # A parked request, stopped during the load: 400, the same message on both.
        with socket.create_connection(("127.0.0.1", port), timeout=60) as sock:
            sock.sendall(chat_request(TINY, "a/b", max_tokens=8))
            if port == pair.corral:
                answers["503"].append(known(port, "a/b"))
            else:
                # b11434 shows nothing of a request parked before its load begins (404): the
                # line its router logs as it queues the request says it has it (on a busy
                # machine, later than 0.3 s after the send).
                until(
                    lambda: f"request for name={TINY} queued" in pair.router.log(),
                    "b11434's router to queue the request",
                    10,
                )
                answers["503"].append(call(port, "GET", stream_path("a/b", 0)))
            assert call(port, "DELETE", stream_path("a/b")).status == 204
            raw = sock.makefile("rb").read1(4096)
        head, _, body = raw.partition(b"\r\n\r\n")
        status = int(head.split()[1])
        answers["400"].append(Answer(status, {}, body))
    # A deliberate difference: b11434 says 503 only while the child itself loads, 404 before
    # (its fake timing sleeps before the load begins); Corral says 503 for as long as the
    # request is parked, since its session appears once it reaches the child.
    peer, corral = answers["503"]
    assert (peer.status, peer.json()["error"]["message"]) == (404, "File Not Found")
    assert corral.status == 503
    assert corral.json()["error"]["message"] == "Stream owner model is loading, retry later"
    peer, corral = answers["400"]
    assert peer.status == corral.status == 400
    assert json.loads(peer.body) == json.loads(corral.body)
    # Loaded now: a dropped request's replay and lookup have the same shapes on both.
    for port in (pair.peer, pair.corral):
        send_and_drop(port, TINY, "c/d")
    replays = [
        until(
            lambda p=port: (a := call(p, "GET", stream_path("c/d", 0))).status == 200 and a,
            "replay",
        )
        for port in (pair.peer, pair.corral)
    ]
    assert [r.headers["content-type"] for r in replays] == ["text/event-stream"] * 2
    assert all(r.body.rstrip().endswith(b"data: [DONE]") for r in replays)
    peer, corral = pair.both("POST", "/v1/streams/lookup", {"conversation_ids": ["c/d"]})
    assert peer.status == corral.status == 200
    assert [sorted(e) for e in peer.json()] == [sorted(e) for e in corral.json()]
    same(*pair.both("DELETE", stream_path("c/d")))
    same(*pair.both("GET", stream_path("c/d", 0)))


@pytest.mark.parametrize(
    "pad",
    [None, "x" * (1024 * 1024 + 1)],  # over 1 MiB (a chat with an image): parsed off the loop
    ids=["small", "large"],
)
def test_a_request_dropped_as_soon_as_sent_reaches_a_loaded_child_as_b11434s(
    pair: Pair, pad: str | None
) -> None:
    """A page reload right after a send: b11434's router sends the request on to the child
    from its own thread, whose session then keeps the generation; Corral cancelled the
    request with its client's connection before the child had it (a replay 404 for good), a
    large body during its parse."""
    for port in (pair.peer, pair.corral):
        warm = call(
            port, "POST", "/v1/chat/completions",
            {"model": TINY, "max_tokens": 4, "messages": QUESTION},
        )  # fmt: skip
        assert warm.status == 200, warm  # loaded: the request is not parked behind a load
        with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
            sock.sendall(chat_request(TINY, "e/f", max_tokens=8, pad=pad))
        replay = until(
            lambda p=port: (a := call(p, "GET", stream_path("e/f", 0))).status == 200 and a,
            f"the replay on port {port} ({'b11434' if port == pair.peer else 'Corral'})",
            30,
        )
        assert replay.body.rstrip().endswith(b"data: [DONE]"), replay.body[-200:]
    assert "Traceback" not in pair.agent.log(), pair.agent.log()[-3000:]
