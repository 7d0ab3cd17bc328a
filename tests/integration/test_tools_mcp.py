"""Router-run MCP servers and ``/tools``, side by side with llama.cpp b11434's router.

Both routers get the same ``--mcp-servers-json``: a stub MCP server that this test writes (a
real process speaking MCP's newline-delimited JSON-RPC over stdio) and a command that does not
exist. A chat request uses a tool the way llama.cpp's web UI does: ``GET /tools`` for the
definitions, a chat completion with them in ``tools``, the model's tool call run through
``POST /tools``, its result sent back as a ``tool`` message.
"""

from __future__ import annotations

import http.server
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.integration.harness import AgentProcess
from tests.integration.test_compat import TINY, LlamaRouter, Pair, assert_same, call, stop_pair

STUB = """\
import json, os, sys
with open(sys.argv[1], "a") as starts:
    starts.write(f"{os.getpid()}\\n")
TOOLS = [
    {"name": "add", "description": "Add two integers",
     "inputSchema": {"type": "object", "required": ["a", "b"],
                     "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}}},
    {"name": "crash", "description": "Exit at once", "inputSchema": {"type": "object"}},
    {"name": "fail", "description": "A tool error", "inputSchema": {"type": "object"}},
    {"name": "sleep", "description": "Take a minute", "inputSchema": {"type": "object"}},
]
for line in sys.stdin:
    msg = json.loads(line)
    if "id" not in msg:
        continue
    method, params = msg["method"], msg.get("params") or {}
    if method == "initialize":
        result = {"protocolVersion": "2024-11-05", "capabilities": {"tools": {}},
                  "serverInfo": {"name": "stub", "version": "1"}}
    elif method == "tools/list":
        result = {"tools": TOOLS}
    elif params.get("name") == "crash":
        os._exit(3)
    elif params.get("name") == "sleep":
        import time
        time.sleep(60)
    elif params.get("name") == "fail":
        result = {"content": [{"type": "text", "text": "no can do"}], "isError": True}
    else:
        args = params["arguments"]
        text = f"{args['a'] + args['b']} cwd={args.get('cwd', '-')}"
        result = {"content": [{"type": "text", "text": text}]}
    print(json.dumps({"jsonrpc": "2.0", "id": msg["id"], "result": result}), flush=True)
"""


AGENT = (sys.executable, "-m", "node_agent.cli", "agent", "--port", "0")


def mcp_config(tmp: Path, who: str = "corral") -> tuple[str, Path]:
    """The servers' JSON, and the file where the stub writes its pid at each start."""
    script, starts = tmp / "mcp_stub.py", tmp / f"starts-{who}.txt"
    script.write_text(STUB)
    servers = {
        "stub": {"command": sys.executable, "args": [str(script), str(starts)]},
        "missing": {"command": str(tmp / "no-such-program")},
    }
    return json.dumps({"mcpServers": servers}), starts


def stub_starts(starts: Path) -> int:
    return len(starts.read_text().split()) if starts.exists() else 0


@pytest.fixture(scope="module")
def tools_pair(
    tmp_path_factory: pytest.TempPathFactory, demo_dir: Path, b11434: Path
) -> Iterator[tuple[Pair, Path]]:
    tmp = tmp_path_factory.mktemp("tools")
    folder = tmp / "models"
    folder.mkdir()
    shutil.copyfile(demo_dir / f"{TINY}.gguf", folder / f"{TINY}.gguf")
    servers, starts = mcp_config(tmp)
    peer_servers, _ = mcp_config(tmp, "llama.cpp")
    args = ["--models-dir", str(folder), "--models-max", "1", "-c", "1024"]
    router = LlamaRouter(
        str(b11434), [*args, "--mcp-servers-json", peer_servers], tmp / "llama-router.log"
    )
    try:
        agent = AgentProcess(["--llama-server", str(b11434), *args, "--mcp-servers-json", servers])
    except BaseException:
        router.stop()
        raise
    # With MCP servers on, llama.cpp's CORS default becomes ``localhost``: a page on
    # localhost is let in by both (the refused origins are the CORS tests' business).
    both = Pair(router.port, agent.port, agent, router, {"Origin": "http://localhost:5173"})
    yield both, starts
    stop_pair(both)


def tool_call(port: int, tool: str, params: dict[str, Any], **headers: str) -> Any:
    sent = {k.replace("_", "-"): v for k, v in headers.items()}
    answer = call(port, "POST", "/tools", {"tool": tool, "params": params}, headers=sent)
    assert answer.status == 200, answer
    return answer.json()


def test_tools_list_the_mcp_servers_tools_like_llama_cpp(tools_pair: tuple[Pair, Path]) -> None:
    pair, _ = tools_pair
    peer, corral = pair.both("GET", "/tools")
    assert_same("GET /tools", peer, corral)
    assert corral.json() == peer.json()  # names, definitions, permissions: all equal
    assert [t["tool"] for t in corral.json()] == [
        "stub_add",
        "stub_crash",
        "stub_fail",
        "stub_sleep",
    ]
    # The command that does not exist is logged and left out; the agent goes on.
    assert "failed to spawn 'missing'" in pair.agent.log()
    assert "security: router mode, MCP servers (experimental) enabled" in pair.agent.log()


def test_mcp_servers_make_localhost_the_cors_default_like_llama_cpp(
    tools_pair: tuple[Pair, Path],
) -> None:
    """Neither was given --cors-origins: with MCP servers on, both let a page on localhost
    in and reflect nothing to another origin, and both say so at start."""
    pair, _ = tools_pair
    for origin in ("http://localhost:5173", "http://evil.example", "http://localhost.evil.com"):
        answers = [
            call(port, "GET", "/models", headers={"Origin": origin})
            for port in (pair.peer, pair.corral)
        ]
        allowed = [a.headers.get("access-control-allow-origin") for a in answers]
        assert allowed[0] == allowed[1], (origin, allowed)
        assert allowed[1] == (origin if origin == "http://localhost:5173" else None), allowed
    warning = "server tools or MCP servers are enabled, using localhost as default CORS origin"
    assert warning in pair.router.log() and warning in pair.agent.log()


def test_tool_calls_answer_like_llama_cpp(tools_pair: tuple[Pair, Path]) -> None:
    pair, _ = tools_pair
    steps: list[tuple[str, Any]] = [
        ("run a tool", {"tool": "stub_add", "params": {"a": 2, "b": 3}}),
        ("a tool error", {"tool": "stub_fail", "params": {}}),
        ("an unknown tool", {"tool": "nope", "params": {}}),
        ("stream from a tool that cannot", {"tool": "stub_add", "params": {}, "stream": True}),
    ]
    for step, body in steps:
        peer, corral = pair.both("POST", "/tools", body)
        assert_same(f"POST /tools ({step})", peer, corral)
        assert corral.json() == peer.json(), step
    # The runtime's working directory arrives as a header, never from the model's arguments.
    for port in (pair.peer, pair.corral):
        answer = tool_call(port, "stub_add", {"a": 1, "b": 1, "cwd": "/etc"}, X_Tool_Cwd="/w")
        assert answer == {"plain_text_response": "2 cwd=/w"}
    # Requests that are not a tool call: the same status and error shape (the parsers'
    # messages differ).
    for raw in (b"{not json", b"[1]", b'{"params": {}}'):
        peer = call(pair.peer, "POST", "/tools", raw=raw)
        corral = call(pair.corral, "POST", "/tools", raw=raw)
        assert (corral.status, sorted(corral.json())) == (peer.status, sorted(peer.json())), raw
        assert corral.json()["type"] == peer.json()["type"] == "invalid_request_error"


def test_the_cors_proxy_is_off_unless_asked_for(tools_pair: tuple[Pair, Path]) -> None:
    pair, _ = tools_pair
    # Sent as the web UI sends it, from its own origin (a cross-site bodiless POST is refused
    # before this: test_compat's test_a_cross_site_simple_post_cannot_change_state).
    for method in ("GET", "POST"):
        peer, corral = pair.both(
            method, "/cors-proxy?url=http://127.0.0.1:1/", headers={"Origin": None}
        )
        assert_same(f"{method} /cors-proxy", peer, corral)
        assert corral.status == 403
        assert corral.json() == {
            "error": {"message": "this feature is disabled", "type": "feature_disabled"}
        }
    peer, corral = pair.both("GET", "/props")
    assert corral.json()["cors_proxy_enabled"] is peer.json()["cors_proxy_enabled"] is False


def assert_the_result_reaches_the_model(
    pair: Pair,
    asked: dict[str, Any],
    tool: str,
    arguments: dict[str, Any],
    result: str,
    template_headers: dict[str, str] | None = None,
) -> None:
    """The web UI's loop after a tool ran: the model's call and the tool's result go back as
    messages; both routers answer the same, and the result reaches the model's prompt (the
    demo models' ChatML template shows no tool definitions)."""
    call_turn = {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {
                "id": "call_1",
                "type": "function",
                "function": {"name": tool, "arguments": json.dumps(arguments)},
            }
        ],
    }
    messages = [*asked["messages"], call_turn, {"role": "tool", "content": result}]
    answered = {**asked, "messages": messages}
    for body in (asked, answered):
        peer, corral = pair.both("POST", "/v1/chat/completions", body)
        assert_same(f"POST /v1/chat/completions with the tool {tool}", peer, corral)
        assert corral.status == 200, corral.body
    headers = template_headers or {}
    prompt = call(pair.corral, "POST", "/apply-template", answered, headers=headers).json()
    assert f"<|im_start|>tool\n{result}<|im_end|>" in prompt["prompt"]


def test_a_chat_completion_uses_a_tool_as_the_web_ui_does(tools_pair: tuple[Pair, Path]) -> None:
    pair, _ = tools_pair
    definitions = [t["definition"] for t in call(pair.corral, "GET", "/tools").json()]
    question = {"role": "user", "content": "What is 2 + 3?"}
    asked = {"model": TINY, "max_tokens": 4, "messages": [question], "tools": definitions}
    # The model's tool call (a tiny random model does not write one itself; the UI's loop is
    # the same whoever wrote it), run through the router, and its result sent back.
    arguments = {"a": 2, "b": 3}
    result = tool_call(pair.corral, "stub_add", arguments)["plain_text_response"]
    assert result == "5 cwd=-"
    assert_the_result_reaches_the_model(pair, asked, "stub_add", arguments, result)


def test_a_crashed_mcp_server_or_child_loses_no_tools(tools_pair: tuple[Pair, Path]) -> None:
    pair, starts = tools_pair
    for port in (pair.peer, pair.corral):
        assert tool_call(port, "stub_crash", {}) == {"error": "transport closed"}
    before = stub_starts(starts)
    # The next call starts the server again.
    assert tool_call(pair.corral, "stub_add", {"a": 4, "b": 5}) == {
        "plain_text_response": "9 cwd=-"
    }
    assert stub_starts(starts) == before + 1
    # A model's child that crashes takes no MCP server with it: they run in the agent.
    assert call(pair.corral, "POST", "/v1/chat/completions", chat_body()).status == 200
    (child,) = pair.agent.children()
    assert "--mcp-servers-json" not in Path(f"/proc/{child}/cmdline").read_text()
    os.kill(child, signal.SIGKILL)
    pair.agent.wait_state(TINY, "unloaded")
    assert call(pair.corral, "GET", "/tools").json()[0]["tool"] == "stub_add"
    assert tool_call(pair.corral, "stub_add", {"a": 1, "b": 2})["plain_text_response"] == (
        "3 cwd=-"
    )
    assert stub_starts(starts) == before + 1  # the same server process answered
    assert pair.agent.proc.poll() is None


def chat_body() -> dict[str, Any]:
    return {"model": TINY, "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]}


def test_tools_are_off_without_the_agents_command_line(
    tmp_path: Path, demo_dir: Path, b11434: Path
) -> None:
    folder = tmp_path / "models"
    folder.mkdir()
    shutil.copyfile(demo_dir / f"{TINY}.gguf", folder / f"{TINY}.gguf")
    args = ["--models-dir", str(folder)]
    router = LlamaRouter(str(b11434), args, tmp_path / "llama-router.log")
    agent = AgentProcess(["--llama-server", str(b11434), *args])
    try:
        for method, path in (("GET", "/tools"), ("POST", "/tools"), ("GET", "/cors-proxy")):
            peer = call(router.port, method, path, {"tool": "x"} if method == "POST" else None)
            corral = call(agent.port, method, path, {"tool": "x"} if method == "POST" else None)
            assert_same(f"{method} {path} (off)", peer, corral)
            assert corral.status == 403
    finally:
        router.stop()
        agent.stop()


def test_a_preset_cannot_turn_tools_on(tmp_path: Path, b11434: Path) -> None:
    servers, starts = mcp_config(tmp_path)
    preset = tmp_path / "preset.ini"
    preset.write_text(f"[*]\nmcp-servers-json = {servers}\n")
    proc = subprocess.run(
        [*AGENT, "--llama-server", str(b11434), "--models-preset", str(preset)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode != 0
    assert f"{preset}:2:" in proc.stderr and "router setting" in proc.stderr, proc.stderr
    assert "--mcp-servers-json on the agent's command line" in proc.stderr
    assert stub_starts(starts) == 0


def test_the_agents_environment_turns_them_on_for_the_agent_only(
    tmp_path: Path, demo_dir: Path, b11434: Path
) -> None:
    folder = tmp_path / "models"
    folder.mkdir()
    shutil.copyfile(demo_dir / f"{TINY}.gguf", folder / f"{TINY}.gguf")
    servers, starts = mcp_config(tmp_path)
    env = {"LLAMA_ARG_MCP_SERVERS_JSON": servers}
    agent = AgentProcess(["--llama-server", str(b11434), "--models-dir", str(folder)], env)
    try:
        assert call(agent.port, "GET", "/tools").status == 200
        assert call(agent.port, "POST", "/v1/chat/completions", chat_body()).status == 200
        (child,) = agent.children()
        environ = Path(f"/proc/{child}/environ").read_bytes().split(b"\0")
        assert not [v for v in environ if v.startswith(b"LLAMA_ARG_MCP_SERVERS_JSON=")]
        assert stub_starts(starts) == 1  # the agent's warm-up only, no child's
    finally:
        agent.stop()


def test_a_bad_mcp_config_is_a_clear_error(tmp_path: Path, b11434: Path) -> None:
    for flag, value, expected in (
        ("--mcp-servers-json", "{nope", "failed to parse MCP config JSON"),
        ("--mcp-servers-config", str(tmp_path / "absent.json"), "failed to open MCP config file"),
    ):
        started = time.monotonic()
        proc = subprocess.run(
            [*AGENT, "--llama-server", str(b11434), flag, value],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert proc.returncode != 0 and expected in proc.stderr, (flag, proc.stderr)
        assert time.monotonic() - started < 30


class _Echo(http.server.BaseHTTPRequestHandler):
    """What the proxy is pointed at: answers with what it received."""

    def _answer(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = json.dumps(
            {
                "method": self.command,
                "path": self.path,
                "x_token": self.headers.get("X-Token"),
                "origin": self.headers.get("Origin"),
                "body": self.rfile.read(length).decode(),
            }
        ).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_POST = _answer

    def log_message(self, format: str, *args: object) -> None:
        pass


def test_the_cors_proxy_when_asked_for_answers_like_llama_cpp(
    tmp_path: Path, demo_dir: Path, b11434: Path
) -> None:
    upstream = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Echo)
    threading.Thread(target=upstream.serve_forever, daemon=True).start()
    target = f"http://127.0.0.1:{upstream.server_address[1]}/mcp?x=1"
    folder = tmp_path / "models"
    folder.mkdir()
    args = ["--models-dir", str(folder), "--ui-mcp-proxy"]
    router = LlamaRouter(str(b11434), args, tmp_path / "llama-router.log")
    agent = AgentProcess(["--llama-server", str(b11434), *args])
    pair = Pair(router.port, agent.port, agent, router)
    try:
        # Only the X-Llama-Server-Proxy-Header-* headers reach the target, prefix removed.
        sent = {"X-Llama-Server-Proxy-Header-X-Token": "t0k", "X-Token": "not-this"}
        for method, body in (("GET", None), ("POST", {"jsonrpc": "2.0"})):
            peer, corral = pair.both(method, f"/cors-proxy?url={target}", body, headers=sent)
            assert (corral.status, corral.json()) == (peer.status, peer.json()), method
            assert corral.json()["x_token"] == "t0k" and corral.json()["path"] == "/mcp?x=1"
        # Unlike llama.cpp: another site's page cannot make the agent fetch (even a GET).
        other: dict[str, str | None] = {
            "Origin": "http://evil.example",
            "Sec-Fetch-Site": "cross-site",
        }
        peer = call(pair.peer, "GET", f"/cors-proxy?url={target}", headers=other)
        corral = call(pair.corral, "GET", f"/cors-proxy?url={target}", headers=other)
        assert peer.status == 200 and corral.status == 403, corral.body
        assert corral.json()["error"]["message"].startswith(
            "/cors-proxy is refused for a request from another site (Sec-Fetch-Site: cross-site)"
        )
        for bad in ("nope", "ftp://h/x", "http://u:secret@h/", "http:///x"):
            peer, corral = pair.both("GET", f"/cors-proxy?url={bad}")
            assert_same(f"GET /cors-proxy?url={bad}", peer, corral)
        # Nothing listens there: llama.cpp's 500 with a body of "proxy error: <why>".
        peer, corral = pair.both("GET", "/cors-proxy?url=http://127.0.0.1:1/")
        assert corral.status == peer.status == 500
        assert corral.body.startswith(b"proxy error: ") and peer.body.startswith(b"proxy error: ")
        peer, corral = pair.both("GET", "/props")
        assert corral.json()["cors_proxy_enabled"] is peer.json()["cors_proxy_enabled"] is True
        assert "security: router mode, MCP proxy (experimental) enabled" in agent.log()
    finally:
        router.stop()
        agent.stop()
        upstream.shutdown()
        upstream.server_close()


def test_a_tool_call_in_flight_does_not_hold_the_shutdown_up(tmp_path: Path, b11434: Path) -> None:
    servers, starts = mcp_config(tmp_path)
    agent = AgentProcess(["--llama-server", str(b11434), "--mcp-servers-json", servers])
    answers: list[Any] = []
    calling = threading.Thread(
        target=lambda: answers.append(tool_call(agent.port, "stub_sleep", {}))
    )
    try:
        calling.start()
        deadline = time.monotonic() + 20
        while stub_starts(starts) < 2 and time.monotonic() < deadline:  # warm-up, then the call
            time.sleep(0.05)
        started = time.monotonic()
        agent.proc.send_signal(signal.SIGTERM)
        calling.join(30)
        assert answers == [{"error": "cancelled"}]  # llama.cpp's word for it
        assert agent.proc.wait(30) == 0
        assert time.monotonic() - started < 15  # not the tool's minute
    finally:
        agent.stop()
