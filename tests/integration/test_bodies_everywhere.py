"""Every route that reads a JSON body treats a slow, oversized or malformed one as the chat
route does (``api/bodies.py``): the same status and message, with the real agent.

The routes: Vertex's ``/predict``, ``/v1/streams/lookup``, ``POST /models`` and ``POST /tools``
(and ``/cors-proxy``, which forwards its body). A control route's body is small by nature:
one over a MiB is refused before it is parsed, so it never holds the event loop.
"""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator
from http.client import HTTPResponse
from pathlib import Path
from typing import Any

import pytest

from tests.integration.harness import AgentProcess, free_port, http

pytestmark = pytest.mark.timeout(120)

CLIENT_TIMEOUT = 2
MAX_BODY = 4 * 1024 * 1024
CHAT = "/v1/chat/completions"
# Routes whose bad bodies must be answered as the chat route answers them.
ROUTES = ["/predict", "/v1/streams/lookup", "/models", "/tools", "/cors-proxy?url=http://x/"]
MCP = {"mcpServers": {"missing": {"command": "/nonexistent/mcp-server"}}}


@pytest.fixture(scope="module")
def agent(demo_dir: Path) -> Iterator[AgentProcess]:
    port = free_port()  # Vertex gives the port in AIP_HTTP_PORT
    proc = AgentProcess(
        [
            "--models-dir", str(demo_dir),
            "--client-timeout", str(CLIENT_TIMEOUT),
            "--max-body-size", "4MiB",
            "--mcp-servers-json", json.dumps(MCP),
            "--ui-mcp-proxy",
        ],
        {"AIP_MODE": "PREDICTION", "AIP_HTTP_PORT": str(port)},
        port=port,
    )  # fmt: skip
    yield proc
    proc.stop()


def _raw(agent: AgentProcess, path: str, head_length: int, sent: bytes) -> tuple[int, Any]:
    """POST ``path`` announcing ``head_length`` bytes, send ``sent``, read the answer."""
    with socket.create_connection(("127.0.0.1", agent.port), timeout=30) as sock:
        head = (
            f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            f"Content-Length: {head_length}\r\nConnection: close\r\n\r\n"
        )
        sock.sendall(head.encode() + sent)
        # Read by the answer's Content-Length: after a 408 the agent may keep the socket
        # open for the rest of the announced body (until its own client timeout).
        response = HTTPResponse(sock)
        response.begin()
        body = response.read()
    try:
        return response.status, json.loads(body)
    except ValueError:
        return response.status, body.decode(errors="replace")


def _message(answer: tuple[int, Any]) -> tuple[int, str]:
    status, body = answer
    return status, body["error"]["message"] if isinstance(body, dict) else body


@pytest.mark.parametrize("path", ROUTES)
def test_a_slow_body_is_a_408(agent: AgentProcess, path: str) -> None:
    started = time.monotonic()
    chat = _message(_raw(agent, CHAT, 100, b'{"model"'))
    assert chat[0] == 408, chat
    got = _message(_raw(agent, path, 100, b'{"model"'))
    print(f"{path}: {got} ({time.monotonic() - started:.1f} s for both)")
    assert got == chat


@pytest.mark.parametrize("path", ROUTES)
def test_a_body_over_the_limit_is_a_413(agent: AgentProcess, path: str) -> None:
    big = b'{"model": "' + b"x" * (MAX_BODY + 10) + b'"}'
    chat = _message(_raw(agent, CHAT, len(big), big))
    assert chat[0] == 413, chat
    assert _message(_raw(agent, path, len(big), big)) == chat


@pytest.mark.parametrize("body", [b"", b"{", b"[[[" * 50_000])
@pytest.mark.parametrize("path", ["/predict", "/models"])
def test_a_malformed_body_is_the_same_400(agent: AgentProcess, path: str, body: bytes) -> None:
    chat = _message(_raw(agent, CHAT, len(body), body))
    assert chat[0] == 400, chat
    assert _message(_raw(agent, path, len(body), body)) == chat


@pytest.mark.parametrize("path", ["/v1/streams/lookup", "/models", "/tools"])
def test_a_control_body_over_a_mib_is_refused_unparsed(agent: AgentProcess, path: str) -> None:
    """Under --max-body-size, but no control request is that large: 413, never parsed."""
    many = b"[" + b"{}," * (1024 * 1024 // 3) + b"{}]"
    status, message = _message(_raw(agent, path, len(many), many))
    assert status == 413, message
    assert "at most 1 MiB" in message, message


def _head(path: str, length: str) -> bytes:
    return (
        f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        f"{length}\r\nConnection: close\r\n\r\n"
    ).encode()


def _answer(sock: socket.socket) -> tuple[int, str]:
    response = HTTPResponse(sock)
    response.begin()
    body = json.loads(response.read())
    return response.status, body["error"]["message"]


@pytest.mark.parametrize("path", ["/v1/streams/lookup", "/models", "/tools"])
def test_a_control_body_announced_over_a_mib_is_refused_before_it_is_read(
    agent: AgentProcess, path: str
) -> None:
    """Content-Length says 3 MiB (under --max-body-size) and only a few bytes come: the
    answer is the 413 at once, not a wait for the rest (the client timeout's 408)."""
    with socket.create_connection(("127.0.0.1", agent.port), timeout=30) as sock:
        sock.sendall(_head(path, f"Content-Length: {3 * 1024 * 1024}") + b'{"model"')
        status, message = _answer(sock)
    assert status == 413, message
    assert message.endswith(f"takes at most 1 MiB, this one is {3 * 1024 * 1024} bytes"), message


@pytest.mark.parametrize("path", ["/v1/streams/lookup", "/models", "/tools"])
def test_a_chunked_control_body_is_refused_once_past_a_mib(agent: AgentProcess, path: str) -> None:
    """A chunked body: 1 MiB and a bit, then nothing more (the body is not over): the agent
    stops reading at the cap and answers 413, never waiting for the whole."""
    chunk = b"x" * (64 * 1024)
    with socket.create_connection(("127.0.0.1", agent.port), timeout=30) as sock:
        sock.sendall(_head(path, "Transfer-Encoding: chunked"))
        for _ in range(17):
            sock.sendall(b"%x\r\n%s\r\n" % (len(chunk), chunk))
        status, message = _answer(sock)
    assert status == 413, message
    assert message.endswith(f"takes at most 1 MiB, this one is more than {1024 * 1024} bytes")


def test_a_large_prediction_is_parsed_off_the_loop(agent: AgentProcess) -> None:
    """A /predict body over a MiB still gets its instances answered (parsed in the worker)."""
    padding = "x" * (1024 * 1024)
    instances = [
        {"@requestFormat": "nope", "padding": padding},
        {"@requestFormat": "/tokenize", "model": "no-such-model", "content": padding},
        3,
    ]
    status, body = http("POST", agent.url + "/predict", {"instances": instances})
    assert status == 200, body
    messages = [p["error"]["message"] for p in body["predictions"]]
    assert messages == [
        "no handler registered for @requestFormat: nope",
        "model 'no-such-model' not found",
        "each instance must be a JSON object",
    ]
