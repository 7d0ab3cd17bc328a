"""llama.cpp's built-in tools (``--tools``, ``--tools-runtime``, ``--agent``), side by side with
b11434's router.

Both routers get the same flags. Every ``POST /tools`` runs on a folder the test builds afresh
for each router (the same path, the same files), so the writes of one cannot change what the
other reads; the answers must be equal byte for byte, and so must the folder afterwards. What
we normalise, and why: an invalid regular expression's message (ECMAScript's words there,
Python's here) and the JSON parser's message for a body that is not JSON.

Docker, podman and ssh cannot run here: a fake of each (``FAKE``, first on ``PATH``) records
its argv and runs the command on this machine. Both routers must call them with the same
argv, in the same order: the container's start, one ``exec`` per step of each tool, and its
removal at exit.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.integration.attacks import descendants, processes_with
from tests.integration.harness import AgentProcess, alive
from tests.integration.test_compat import (
    TINY,
    Answer,
    LlamaRouter,
    Pair,
    assert_same,
    call,
    content_type,
)
from tests.integration.test_tools_mcp import assert_the_result_reaches_the_model

AGENT = (sys.executable, "-m", "node_agent.cli", "agent", "--port", "0")
ORIGIN = {"Origin": "http://localhost:5173"}  # with tools on, both let only localhost in


def build_tree(root: Path) -> None:
    """The folder every tool call works on, the same for both routers."""
    shutil.rmtree(root, ignore_errors=True)
    (root / "src" / "deep").mkdir(parents=True)
    (root / "node_modules" / "pkg").mkdir(parents=True)
    (root / "notes.txt").write_text("hello\nworld\nfoo bar\nHello again\n")
    (root / "src" / "main.py").write_text("def main():\n    return 'hi'   \n\nmain()\n")
    (root / "src" / "deep" / "util.py").write_text("x = 1\ny = 2\n")
    (root / "node_modules" / "pkg" / "index.js").write_text("hello()\n")
    (root / "quotes.txt").write_text("say \u201chello\u201d \u2014 twice\nend\n")
    (root / "big.txt").write_text("".join(f"line {i:05d} " + "x" * 40 + "\n" for i in range(600)))
    (root / "dup.txt").write_text("same\nsame\n")


def snapshot(root: Path) -> dict[str, bytes]:
    """The folder's files (git's own, with their timestamps, left out)."""
    files = (p for p in sorted(root.rglob("*")) if p.is_file() and ".git" not in p.parts)
    return {str(p.relative_to(root)): p.read_bytes() for p in files}


def steps(root: Path) -> list[tuple[str, dict[str, Any], dict[str, str]]]:
    """(what, request body, headers): every tool, its limits and its errors."""
    cwd = {"X-Tool-Cwd": str(root)}
    r = str(root)
    return [
        ("read a file", {"tool": "read_file", "params": {"path": f"{r}/notes.txt"}}, {}),
        (
            "read lines 2-3, numbered, relative to X-Tool-Cwd",
            {
                "tool": "read_file",
                "params": {"path": "notes.txt", "start_line": 2, "end_line": 3, "append_loc": True},
            },
            cwd,
        ),
        ("read a file too large", {"tool": "read_file", "params": {"path": "big.txt"}}, cwd),
        (
            "read a large file's range (truncated at 16 KiB)",
            {"tool": "read_file", "params": {"path": "big.txt", "start_line": 1, "end_line": 590}},
            cwd,
        ),
        (
            "read as base64 (X-Resp-Type)",
            {"tool": "read_file", "params": {"path": "notes.txt"}},
            {**cwd, "X-Resp-Type": "base64"},
        ),
        ("read a missing file", {"tool": "read_file", "params": {"path": "absent.txt"}}, cwd),
        ("read a folder", {"tool": "read_file", "params": {"path": r}}, {}),
        ("read_file without path", {"tool": "read_file", "params": {}}, {}),
        ("read_file with a number path", {"tool": "read_file", "params": {"path": 5}}, {}),
        (
            "a wrong-typed optional is its default",
            {"tool": "read_file", "params": {"path": f"{r}/notes.txt", "start_line": "x"}},
            {},
        ),
        ("glob every file", {"tool": "file_glob_search", "params": {"path": r}}, {}),
        (
            "glob all entries, depth 1",
            {"tool": "file_glob_search", "params": {"path": ".", "type": "all", "max_depth": 1}},
            cwd,
        ),
        (
            "glob dirs",
            {"tool": "file_glob_search", "params": {"path": r, "type": "dir"}},
            {},
        ),
        (
            "glob with include/exclude and a limit",
            {
                "tool": "file_glob_search",
                "params": {"path": r, "include": "src/**/*.py", "exclude": "util.*", "limit": 1},
            },
            {},
        ),
        (
            "glob over the limit",
            {"tool": "file_glob_search", "params": {"path": r, "include": "*.txt", "limit": 2}},
            {},
        ),
        ("glob a bad limit", {"tool": "file_glob_search", "params": {"path": r, "limit": 0}}, {}),
        ("glob a bad type", {"tool": "file_glob_search", "params": {"path": r, "type": "x"}}, {}),
        ("glob a missing folder", {"tool": "file_glob_search", "params": {"path": "nope"}}, cwd),
        (
            "grep with line numbers",
            {
                "tool": "grep_search",
                "params": {"path": r, "pattern": "hel+o", "return_line_numbers": True},
            },
            {},
        ),
        (
            "grep one file, context, ignoring case",
            {
                "tool": "grep_search",
                "params": {
                    "path": "notes.txt",
                    "pattern": "HELLO",
                    "ignore_case": True,
                    "context_lines": 1,
                },
            },
            cwd,
        ),
        (
            "grep a literal, included files only",
            {
                "tool": "grep_search",
                "params": {"path": r, "pattern": "main()", "literal": True, "include": "*.py"},
            },
            {},
        ),
        (
            "grep a missing path",
            {"tool": "grep_search", "params": {"path": "nope", "pattern": "x"}},
            cwd,
        ),
        ("grep without pattern", {"tool": "grep_search", "params": {"path": r}}, {}),
        (
            "run a shell command",
            {"tool": "exec_shell_command", "params": {"command": "pwd; echo err >&2; exit 3"}},
            cwd,
        ),
        (
            "a command's output truncated",
            {
                "tool": "exec_shell_command",
                "params": {"command": "seq 1 5000", "max_output_size": 30},
            },
            {},
        ),
        (
            "a command that times out",
            {"tool": "exec_shell_command", "params": {"command": "sleep 30", "timeout": 1}},
            {},
        ),
        (
            "write a file in a new folder",
            {"tool": "write_file", "params": {"path": "new/dir/out.txt", "content": "abc\n"}},
            cwd,
        ),
        (
            "write where nothing can be",
            {"tool": "write_file", "params": {"path": "/proc/x/y", "content": ""}},
            {},
        ),
        (
            "edit two places at once",
            {
                "tool": "edit_file",
                "params": {
                    "path": "notes.txt",
                    "edits": [
                        {"old_text": "world", "new_text": "planet"},
                        {"old_text": "foo", "new_text": "baz"},
                    ],
                },
            },
            cwd,
        ),
        (
            "edit fuzzily (typographic quotes and a dash, trailing blanks)",
            {
                "tool": "edit_file",
                "params": {
                    "path": "quotes.txt",
                    "edits": [{"old_text": 'say "hello" - twice', "new_text": "said it"}],
                },
            },
            cwd,
        ),
        (
            "edit keeps the untouched lines' bytes",
            {
                "tool": "edit_file",
                "params": {
                    "path": "src/main.py",
                    "edits": [{"old_text": "return 'hi'\n", "new_text": "return 'ho'\n"}],
                },
            },
            cwd,
        ),
        (
            "edit a text that is not unique",
            {
                "tool": "edit_file",
                "params": {"path": "dup.txt", "edits": [{"old_text": "same", "new_text": "x"}]},
            },
            cwd,
        ),
        (
            "edit a text that is not there",
            {
                "tool": "edit_file",
                "params": {"path": "dup.txt", "edits": [{"old_text": "zzz", "new_text": "x"}]},
            },
            cwd,
        ),
        (
            "edits that overlap",
            {
                "tool": "edit_file",
                "params": {
                    "path": "notes.txt",
                    "edits": [
                        {"old_text": "hello\nworld", "new_text": "a"},
                        {"old_text": "world\nfoo", "new_text": "b"},
                    ],
                },
            },
            cwd,
        ),
        (
            "an edit that changes nothing",
            {
                "tool": "edit_file",
                "params": {
                    "path": "dup.txt",
                    "edits": [{"old_text": "same\nsame", "new_text": "same\nsame"}],
                },
            },
            cwd,
        ),
        ("edits empty", {"tool": "edit_file", "params": {"path": "dup.txt", "edits": []}}, cwd),
        (
            "an empty old_text",
            {
                "tool": "edit_file",
                "params": {"path": "dup.txt", "edits": [{"old_text": "", "new_text": "x"}]},
            },
            cwd,
        ),
        (
            "an edit without new_text",
            {"tool": "edit_file", "params": {"path": "dup.txt", "edits": [{"old_text": "same"}]}},
            cwd,
        ),
        (
            "edit a missing file",
            {
                "tool": "edit_file",
                "params": {"path": "gone", "edits": [{"old_text": "a", "new_text": "b"}]},
            },
            cwd,
        ),
        ("get_info in X-Tool-Cwd", {"tool": "get_info", "params": {}}, cwd),
        (
            "get_info in a folder that is not",
            {"tool": "get_info", "params": {}},
            {"X-Tool-Cwd": f"{r}/nope"},
        ),
        ("an unknown tool", {"tool": "nope", "params": {}}, {}),
        (
            "stream from a tool that cannot",
            {"tool": "read_file", "params": {"path": "x"}, "stream": True},
            {},
        ),
        ("no tool", {"params": {}}, {}),
        ("params null", {"tool": "read_file", "params": None}, {}),
        ("params null, with X-Tool-Cwd", {"tool": "read_file", "params": None}, cwd),
        ("params a list, with X-Tool-Cwd", {"tool": "read_file", "params": []}, cwd),
        ("stream not a boolean", {"tool": "read_file", "params": {}, "stream": "yes"}, {}),
        ("tool not a string", {"tool": 7}, {}),
        ("a body that is a list", [1], {}),  # type: ignore[list-item]
    ]


# Runtimes a client names; llama.cpp honours (or checks) them, Corral refuses them all.
NAMED_RUNTIMES = [
    ("bogus", "unknown tool runtime: bogus"),
    ("docker:alpine", "tool runtime must name a running container: docker:alpine"),
    ("ssh:-oProxyCommand=touch%20/tmp/x", "invalid ssh target: -oProxyCommand=touch%20/tmp/x"),
    ("docker-container:--privileged", "invalid container id: --privileged"),
    ("docker-container:abc1", None),  # llama.cpp runs the call in that container
    ("ssh:me@box", None),  # ... or on that host, with the agent's own ssh keys
]


def run_steps(
    pair: Pair,
    root: Path,
    cases: list[tuple[str, Any, dict[str, str]]],
    build: Callable[[Path], None] = build_tree,
) -> list[tuple[str, Answer]]:
    answers = []
    for step, body, headers in cases:
        build(root)
        peer = call(pair.peer, "POST", "/tools", body, headers={**ORIGIN, **headers})
        peer_tree = snapshot(root)
        build(root)
        corral = call(pair.corral, "POST", "/tools", body, headers={**ORIGIN, **headers})
        assert_same(f"POST /tools ({step})", peer, corral)
        assert corral.body == peer.body, (step, peer.body[:600], corral.body[:600])
        assert snapshot(root) == peer_tree, step
        answers.append((step, corral))
    return answers


def tools_pair_for(
    b11434: Path, tmp: Path, args: list[str], env: Callable[[str], dict[str, str]] | None = None
) -> Pair:
    """Both routers with ``args``; ``env(who)`` adds each one's environment."""
    router = LlamaRouter(
        str(b11434), args, tmp / "llama-router.log", env=env("llama.cpp") if env else None
    )
    try:
        agent = AgentProcess(["--llama-server", str(b11434), *args], env("corral") if env else None)
    except BaseException:
        router.stop()
        raise
    return Pair(router.port, agent.port, agent, router, dict(ORIGIN))


def stop(pair: Pair) -> None:
    pair.router.stop()
    pair.agent.stop()


@pytest.fixture(scope="module")
def all_tools(
    tmp_path_factory: pytest.TempPathFactory, demo_dir: Path, b11434: Path
) -> Iterator[tuple[Pair, Path]]:
    tmp = tmp_path_factory.mktemp("builtin")
    folder = tmp / "models"
    folder.mkdir()
    shutil.copyfile(demo_dir / f"{TINY}.gguf", folder / f"{TINY}.gguf")
    pair = tools_pair_for(
        b11434,
        tmp,
        ["--models-dir", str(folder), "--models-max", "1", "-c", "1024", "--tools", "all"],
    )
    yield pair, tmp / "work"
    stop(pair)


def test_get_tools_lists_the_built_in_tools_like_llama_cpp(all_tools: tuple[Pair, Path]) -> None:
    pair, _ = all_tools
    peer, corral = pair.both("GET", "/tools")
    assert_same("GET /tools", peer, corral)
    assert corral.body == peer.body  # definitions byte for byte, in llama.cpp's order
    assert [t["tool"] for t in corral.json()] == [
        "read_file",
        "file_glob_search",
        "grep_search",
        "exec_shell_command",
        "write_file",
        "edit_file",
        "get_info",
    ]
    warning = "security: router mode, server tools (experimental) enabled"
    assert warning in pair.router.log() and warning in pair.agent.log()


def test_every_tool_answers_like_llama_cpp(all_tools: tuple[Pair, Path]) -> None:
    pair, root = all_tools
    answers = dict(run_steps(pair, root, steps(root)))
    # A few answers spelled out, so that both agreeing on nonsense would show.
    assert answers["read lines 2-3, numbered, relative to X-Tool-Cwd"].json() == {
        "plain_text_response": "2\u2192world\n3\u2192foo bar\n"
    }
    assert answers["run a shell command"].json() == {
        "plain_text_response": f"{root}\nerr\n\n[exit code: 3]"
    }
    assert (
        answers["a command that times out"]
        .json()["plain_text_response"]
        .endswith("[exit due to timed out]")
    )
    assert answers["an unknown tool"].status == 404
    globbed = answers["glob every file"].json()
    assert "node_modules/pkg/index.js" not in globbed["plain_text_response"]  # junk, not walked
    assert globbed["base"] == str(root)


@pytest.mark.parametrize(("runtime", "peer_error"), NAMED_RUNTIMES)
def test_a_client_cannot_choose_where_tools_run_unlike_llama_cpp(
    all_tools: tuple[Pair, Path], runtime: str, peer_error: str | None
) -> None:
    """A deliberate difference: the header would get around the administrator's sandbox."""
    pair, _ = all_tools
    body = {"tool": "get_info", "params": {}}
    headers = {**ORIGIN, "X-Tool-Runtime": runtime}
    if peer_error is not None:  # llama.cpp checks it; a good one it would just use
        peer = call(pair.peer, "POST", "/tools", body, headers=headers)
        assert peer.json()["message"] == peer_error
    corral = call(pair.corral, "POST", "/tools", body, headers=headers)
    assert corral.status == 403
    assert corral.json() == {
        "code": 403,
        "message": f"X-Tool-Runtime {runtime!r} is not this agent's tools runtime (the host): "
        "a request may not choose where tools run; the agent's --tools-runtime sets it "
        "(send no X-Tool-Runtime header)",
        "type": "permission_error",
    }


def test_a_bad_regex_and_a_body_that_is_not_json(all_tools: tuple[Pair, Path]) -> None:
    """The one difference in the tools' answers: whose regular expressions they are."""
    pair, root = all_tools
    build_tree(root)
    body = {"tool": "grep_search", "params": {"path": str(root), "pattern": "("}}
    peer, corral = pair.both("POST", "/tools", body)
    assert_same("POST /tools (a bad regex)", peer, corral)
    assert peer.json()["error"].startswith("invalid regex: ")
    assert corral.json()["error"].startswith("invalid regex: ")
    peer = call(pair.peer, "POST", "/tools", raw=b"{nope", headers=ORIGIN)
    corral = call(pair.corral, "POST", "/tools", raw=b"{nope", headers=ORIGIN)
    assert (corral.status, sorted(corral.json())) == (peer.status, sorted(peer.json()))


def test_a_shell_command_streams_like_llama_cpp(all_tools: tuple[Pair, Path]) -> None:
    pair, root = all_tools
    build_tree(root)
    body = {
        "tool": "exec_shell_command",
        "params": {"command": "echo one; echo two"},
        "stream": True,
    }
    headers = {"X-Tool-Cwd": str(root)}
    peer, corral = pair.both("POST", "/tools", body, headers=headers)
    # Not assert_same: it compares the events one by one, and how many chunks the two lines
    # come in is the pipe's (one or two under load), on either side.
    assert (corral.status, content_type(corral)) == (peer.status, content_type(peer))

    def text(answer: Answer) -> tuple[str, Any]:
        events = [json.loads(line[6:]) for line in answer.body.decode().split("\n\n") if line]
        return "".join(e.get("chunk", "") for e in events[:-1]), events[-1]

    # Chunk boundaries are the pipe's; the text and the last event are the same.
    assert text(corral) == text(peer) == ("one\ntwo\n\n[exit code: 0]", {"done": True})
    missing = {"tool": "exec_shell_command", "params": {}, "stream": True}
    peer, corral = pair.both("POST", "/tools", missing)
    assert corral.body == peer.body  # the tool's failure is the last event


def test_a_chat_completion_uses_a_built_in_tool_as_the_web_ui_does(
    all_tools: tuple[Pair, Path],
) -> None:
    pair, root = all_tools
    build_tree(root)
    definitions = [
        t["definition"] for t in call(pair.corral, "GET", "/tools", headers=ORIGIN).json()
    ]
    question = {"role": "user", "content": "What is in notes.txt?"}
    asked = {"model": TINY, "max_tokens": 4, "messages": [question], "tools": definitions}
    # The model's tool call (a tiny random model writes none itself; the UI's loop is the same
    # whoever wrote it), run through the router, its result sent back.
    arguments = {"path": "notes.txt"}
    answer = call(
        pair.corral,
        "POST",
        "/tools",
        {"tool": "read_file", "params": arguments},
        headers={**ORIGIN, "X-Tool-Cwd": str(root)},
    )
    result = answer.json()["plain_text_response"]
    assert result == "hello\nworld\nfoo bar\nHello again\n"
    assert_the_result_reaches_the_model(pair, asked, "read_file", arguments, result, ORIGIN)
    # The tools run in the agent: the child was given none of the flags.
    (child,) = pair.agent.children()
    assert "--tools" not in Path(f"/proc/{child}/cmdline").read_text()


def test_tools_make_localhost_the_cors_default_like_llama_cpp(all_tools: tuple[Pair, Path]) -> None:
    pair, _ = all_tools
    for origin in ("http://localhost:5173", "http://evil.example", "http://localhost.evil.com"):
        answers = [
            call(port, "GET", "/tools", headers={"Origin": origin})
            for port in (pair.peer, pair.corral)
        ]
        allowed = [a.headers.get("access-control-allow-origin") for a in answers]
        assert allowed[0] == allowed[1] == (origin if "5173" in origin else None), (origin, allowed)
    warning = "server tools or MCP servers are enabled, using localhost as default CORS origin"
    assert warning in pair.router.log() and warning in pair.agent.log()


def test_a_subset_and_agent_list_like_llama_cpp(tmp_path: Path, b11434: Path) -> None:
    for args in (
        ["--tools", "get_info,read_file"],
        ["--agent"],
        ["--agent", "--tools", "grep_search"],
    ):
        pair = tools_pair_for(b11434, tmp_path, ["--models-dir", str(tmp_path), *args])
        try:
            peer, corral = pair.both("GET", "/tools")
            assert_same(f"GET /tools {args}", peer, corral)
            assert corral.body == peer.body, args
            listed = [t["tool"] for t in corral.json()]
            peer, corral = pair.both("GET", "/props")
            assert corral.json()["cors_proxy_enabled"] is peer.json()["cors_proxy_enabled"], args
        finally:
            stop(pair)
    assert listed == ["grep_search"]  # the last --tools wins over --agent's "all"


def test_tool_flags_are_clear_errors_at_start(tmp_path: Path, b11434: Path) -> None:
    for args, expected in (
        (["--tools", "read_file,nope"], 'unknown tool "nope". available tools: read_file, '),
        (["--tools", "all", "--tools-runtime", "bogus"], "unknown tool runtime: bogus"),
        (["--tools", "all", "--tools-runtime", "docker:"], "requires an image name"),
        (["--tools", "all", "--tools-runtime", "ssh:-oProxyCommand=x"], "invalid ssh target"),
        (["--tools-runtime", "ssh:host"], "no tool is on: give --tools"),
    ):
        proc = subprocess.run(
            [*AGENT, "--llama-server", str(b11434), *args],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert proc.returncode != 0 and expected in proc.stderr, (args, proc.stderr)


def test_a_preset_cannot_turn_tools_on(tmp_path: Path, b11434: Path) -> None:
    for key, value in (("tools", "all"), ("agent", "true"), ("tools-runtime", "ssh:host")):
        preset = tmp_path / "preset.ini"
        preset.write_text(f"[*]\n{key} = {value}\n")
        proc = subprocess.run(
            [*AGENT, "--llama-server", str(b11434), "--models-preset", str(preset)],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert proc.returncode != 0, (key, proc.stderr)
        assert f"{preset}:2:" in proc.stderr and "router setting" in proc.stderr, proc.stderr


def test_the_agents_environment_turns_them_on_for_the_agent_only(
    tmp_path: Path, demo_dir: Path, b11434: Path
) -> None:
    folder = tmp_path / "models"
    folder.mkdir()
    shutil.copyfile(demo_dir / f"{TINY}.gguf", folder / f"{TINY}.gguf")
    env = {"LLAMA_ARG_TOOLS": "get_info"}
    agent = AgentProcess(["--llama-server", str(b11434), "--models-dir", str(folder)], env)
    try:
        status, tools = agent.get("/tools", headers=ORIGIN)
        assert status == 200 and [t["tool"] for t in tools] == ["get_info"]
        body = {"model": TINY, "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]}
        assert call(agent.port, "POST", "/v1/chat/completions", body, headers=ORIGIN).status == 200
        (child,) = agent.children()
        environ = Path(f"/proc/{child}/environ").read_bytes().split(b"\0")
        assert not [v for v in environ if v.startswith(b"LLAMA_ARG_TOOLS=")]
    finally:
        agent.stop()


# --- runtimes: docker, podman, ssh (fakes that record their argv) --------------------------

FAKE = r'''#!/usr/bin/env python3
"""A fake docker/podman/ssh: records its argv, runs the command on this machine."""
import json, os, subprocess, sys
engine = os.path.basename(sys.argv[0])
with open(os.environ["FAKE_LOG"], "a") as log:
    log.write(json.dumps([engine, *sys.argv[1:]]) + "\n")
args = sys.argv[1:]
if engine == "ssh":
    while args[0] == "-o":
        args = args[2:]
    quiet = args[0] == "-n"
    if quiet:
        args = args[1:]
        os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
    os.execvp("sh", ["sh", "-c", args[1]])
if args[0] == "run":  # run --rm -i --cidfile F IMAGE sh
    with open(args[args.index("--cidfile") + 1], "w") as f:
        f.write("c0ffee42\n")
    subprocess.run(["sh"])  # the container lives while its stdin is open
    with open(os.environ["FAKE_LOG"], "a") as log:
        log.write(json.dumps([engine, "<removed>"]) + "\n")
    sys.exit(0)
if args[0] == "exec":  # exec [-i] ID CMD...
    args = args[1:]
    if args[0] == "-i":
        args = args[1:]
    else:
        os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
    os.execvp(args[1], args[1:])
sys.exit(f"fake {engine}: unexpected {args}")
'''


def fake_bin(tmp: Path) -> Path:
    folder = tmp / "bin"
    folder.mkdir(exist_ok=True)
    for name in ("docker", "podman", "ssh"):
        path = folder / name
        path.write_text(FAKE)
        path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return folder


def recorded(log: Path) -> list[list[str]]:
    """The argv lines, the cidfile's path (each router picks its own) made one word."""
    calls = [json.loads(line) for line in log.read_text().splitlines()]
    for argv in calls:
        if "--cidfile" in argv:
            argv[argv.index("--cidfile") + 1] = "<cidfile>"
    return calls


RUNTIME_STEPS = (
    "read lines 2-3, numbered, relative to X-Tool-Cwd",
    "read a missing file",
    "glob all entries, depth 1",
    "glob every file",
    "grep with line numbers",
    "run a shell command",
    "write a file in a new folder",
    "edit two places at once",
    "get_info in X-Tool-Cwd",
)


@pytest.mark.parametrize("runtime", ["docker:alpine:3", "podman-container:c0ffee42", "ssh:me@box"])
def test_a_runtime_gets_the_same_calls_as_from_llama_cpp(
    tmp_path: Path, b11434: Path, runtime: str
) -> None:
    bin_dir = fake_bin(tmp_path)
    logs = {who: tmp_path / f"calls-{who}.log" for who in ("llama.cpp", "corral")}

    def env(who: str) -> dict[str, str]:
        return {"PATH": f"{bin_dir}:{os.environ['PATH']}", "FAKE_LOG": str(logs[who])}

    root = tmp_path / "work"
    args = ["--models-dir", str(tmp_path), "--tools", "all", "--tools-runtime", runtime]
    pair = tools_pair_for(b11434, tmp_path, args, env)
    try:
        cases = [c for c in steps(root) if c[0] in RUNTIME_STEPS]
        run_steps(pair, root, cases)
        if not runtime.startswith("docker:"):  # naming the agent's own runtime is no choice
            own = [("named", {"tool": "get_info", "params": {}}, {"X-Tool-Runtime": runtime})]
            run_steps(pair, root, own)
        # Another one is refused (llama.cpp would run the call there): no engine call for it.
        other = {**ORIGIN, "X-Tool-Runtime": "docker-container:abc1"}
        refused = call(pair.corral, "POST", "/tools", {"tool": "get_info"}, headers=other)
        assert refused.status == 403, refused.body
    finally:
        stop(pair)
    peer, corral = recorded(logs["llama.cpp"]), recorded(logs["corral"])
    assert corral == peer
    engine = runtime.partition(":")[0].removesuffix("-container")
    if runtime.startswith("docker:"):  # started once, before the first call; removed at exit
        assert corral[0] == [
            "docker",
            "run",
            "--rm",
            "-i",
            "--cidfile",
            "<cidfile>",
            "alpine:3",
            "sh",
        ]
        assert corral[-1] == ["docker", "<removed>"]
        assert all(argv[:2] == ["docker", "exec"] for argv in corral[1:-1] if argv[0] == "docker")
        assert corral.count(corral[0]) == 1
    elif engine == "ssh":
        assert all(
            argv[:9]
            == [
                "ssh",
                "-o",
                "BatchMode=yes",
                "-o",
                "PasswordAuthentication=no",
                "-o",
                "KbdInteractiveAuthentication=no",
                "-o",
                "StrictHostKeyChecking=yes",
            ]
            for argv in corral
            if argv[0] == "ssh"
        )
    else:  # an existing container: used, never started nor removed
        assert not [argv for argv in corral if argv[1] in ("run", "<removed>")]
    assert len(corral) > len(RUNTIME_STEPS)


def engine_runs(pid: int) -> list[int]:
    """The ``docker run`` clients a router keeps for its runtime (its own children)."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            ppid = int((entry / "stat").read_text().rpartition(")")[2].split()[1])
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except (OSError, ValueError, IndexError):
            continue
        if ppid == pid and any(a.endswith(b"docker") for a in argv[:2]) and b"run" in argv:
            found.append(int(entry.name))
    return found


def test_a_container_that_died_is_started_again_like_llama_cpp(
    tmp_path: Path, b11434: Path
) -> None:
    bin_dir = fake_bin(tmp_path)
    logs = {who: tmp_path / f"calls-{who}.log" for who in ("llama.cpp", "corral")}

    def env(who: str) -> dict[str, str]:
        return {"PATH": f"{bin_dir}:{os.environ['PATH']}", "FAKE_LOG": str(logs[who])}

    args = ["--models-dir", str(tmp_path), "--tools", "get_info", "--tools-runtime", "docker:img"]
    pair = tools_pair_for(b11434, tmp_path, args, env)
    body = {"tool": "get_info", "params": {}}
    try:
        first = pair.both("POST", "/tools", body)
        assert first[0].body == first[1].body
        for router in (pair.router.proc.pid, pair.agent.proc.pid):
            (client,) = engine_runs(router)
            os.kill(client, signal.SIGKILL)
            # llama.cpp reaps it at the next call; the agent's child watcher at once (then
            # the next call sees it ended).
            reaped = router == pair.agent.proc.pid
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline and (
                Path(f"/proc/{client}").exists() if reaped else alive(client)
            ):
                time.sleep(0.05)
        time.sleep(0.2)
        again = pair.both("POST", "/tools", body)
        assert again[0].body == again[1].body and again[1].json()["os"] != "unknown"
    finally:
        stop(pair)
    peer, corral = recorded(logs["llama.cpp"]), recorded(logs["corral"])
    assert corral == peer
    assert [argv[1] for argv in corral].count("run") == 2
    assert 'tools runtime container "c0ffee42" died, respawning' in pair.agent.log()


def test_a_command_in_flight_does_not_hold_the_shutdown_up(tmp_path: Path, b11434: Path) -> None:
    agent = AgentProcess(["--llama-server", str(b11434), "--tools", "exec_shell_command"])
    command = "sleep 47.25; echo late"  # its own duration, to find it in the process list
    answers: list[Any] = []

    def run(stream: bool) -> None:
        body = {"tool": "exec_shell_command", "params": {"command": command, "timeout": 60}}
        answers.append(
            call(agent.port, "POST", "/tools", {**body, "stream": stream}, headers=ORIGIN)
        )

    callers = [threading.Thread(target=run, args=(s,)) for s in (False, True)]
    try:
        for caller in callers:
            caller.start()
        deadline = time.monotonic() + 20
        while len(sleepers(agent.proc.pid)) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        ours = sleepers(agent.proc.pid)
        assert len(ours) == 2
        started = time.monotonic()
        agent.proc.send_signal(signal.SIGTERM)
        for caller in callers:
            caller.join(30)
        assert agent.proc.wait(30) == 0
        assert time.monotonic() - started < 15  # not the command's 47 s
        bodies = sorted(a.body for a in answers)
        assert bodies == [b'data: {"done":true,"error":"cancelled"}\n\n', b'{"error":"cancelled"}']
        # The programs were killed, not left behind (a zombie has no command line).
        assert not ours & set(processes_with(SLEEP)), ours
    finally:
        agent.stop()


SLEEP = b"sleep\x0047.25\x00"  # the command's own duration: its line in the process list


def sleepers(agent: int) -> set[int]:
    """The ``sleep 47.25`` processes that ``agent`` started (its descendants). Not every one on
    the machine: a run of this test just before, or beside this one, may have left its own."""
    return set(processes_with(SLEEP)) & set(descendants(agent))


def test_a_git_folder_is_listed_by_git_like_llama_cpp(all_tools: tuple[Pair, Path]) -> None:
    """Inside a git repository the files come from ``git ls-files``: .gitignore applies."""
    pair, root = all_tools
    repo = root.parent / "repo"

    def build(_: Path) -> None:
        shutil.rmtree(repo, ignore_errors=True)
        (repo / "src").mkdir(parents=True)
        (repo / ".gitignore").write_text("*.log\n")
        (repo / "src" / "a.py").write_text("print('hello')\n")
        (repo / "debug.log").write_text("hello\n")
        (repo / "untracked.txt").write_text("hello\n")
        subprocess.run(["git", "init", "-q", str(repo)], check=True)
        subprocess.run(["git", "-C", str(repo), "add", "src"], check=True)

    cases = [
        ("glob in git", {"tool": "file_glob_search", "params": {"path": str(repo)}}, {}),
        (
            "grep in git",
            {"tool": "grep_search", "params": {"path": str(repo), "pattern": "hello"}},
            {},
        ),
    ]
    answers = dict(run_steps(pair, repo, cases, build))
    listed = answers["glob in git"].json()["entries"]
    assert {e["path"] for e in listed} == {".gitignore", "src/a.py", "untracked.txt"}


def test_mcp_tools_come_after_the_built_in_ones_like_llama_cpp(
    tmp_path: Path, b11434: Path
) -> None:
    from tests.integration.test_tools_mcp import mcp_config

    servers, _ = mcp_config(tmp_path)
    args = ["--models-dir", str(tmp_path), "--tools", "get_info", "--mcp-servers-json", servers]
    pair = tools_pair_for(b11434, tmp_path, args)
    try:
        peer, corral = pair.both("GET", "/tools")
        assert corral.body == peer.body
        assert [t["tool"] for t in corral.json()][:2] == ["get_info", "stub_add"]
        peer, corral = pair.both("POST", "/tools", {"tool": "stub_add", "params": {"a": 1, "b": 2}})
        assert corral.body == peer.body
        warning = "security: router mode, server tools (experimental), MCP servers (experimental)"
        assert warning in pair.router.log() and warning in pair.agent.log()
    finally:
        stop(pair)


def test_a_lone_surrogate_is_no_text_for_either(all_tools: tuple[Pair, Path]) -> None:
    pair, root = all_tools
    raw = b'{"tool": "write_file", "params": {"path": "%s/s.txt", "content": "\\ud800"}}' % (
        str(root).encode()
    )
    peer = call(pair.peer, "POST", "/tools", raw=raw, headers=ORIGIN)
    corral = call(pair.corral, "POST", "/tools", raw=raw, headers=ORIGIN)
    assert corral.status == peer.status == 400, (peer.body, corral.body)
    assert corral.json()["type"] == peer.json()["type"] == "invalid_request_error"
    assert not (root / "s.txt").exists()


def test_a_container_that_cannot_start_stops_the_agent_with_a_clear_error(
    tmp_path: Path, b11434: Path
) -> None:
    nothing = tmp_path / "empty"
    nothing.mkdir()
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "podman").write_text("#!/bin/sh\necho 'no such image' >&2\nexit 125\n")
    (broken / "podman").chmod(0o755)
    for path, runtime, expected in (
        (nothing, "docker:alpine", "failed to spawn docker container for tools runtime"),
        (broken, "podman:alpine", "podman run ended with exit code 125 before the container"),
    ):
        started = time.monotonic()
        proc = subprocess.run(
            [*AGENT, "--llama-server", str(b11434), "--tools", "all", "--tools-runtime", runtime],
            capture_output=True,
            text=True,
            timeout=60,
            env={**os.environ, "PATH": str(path)},
        )
        assert proc.returncode != 0 and expected in proc.stderr, (runtime, proc.stderr)
        assert f"--tools-runtime {runtime}: " in proc.stderr
        assert path is nothing or "no such image" in proc.stderr  # the engine's own words
        assert time.monotonic() - started < 30


@pytest.mark.parametrize("number", [b"1e999", b"-1e999", b"NaN", b"Infinity"])
def test_a_number_that_is_no_double_is_a_400_for_either(
    all_tools: tuple[Pair, Path], number: bytes
) -> None:
    pair, root = all_tools
    raw = b'{"tool": "read_file", "params": {"path": "%s/notes.txt", "end_line": %s}}' % (
        str(root).encode(),
        number,
    )
    peer = call(pair.peer, "POST", "/tools", raw=raw, headers=ORIGIN)
    corral = call(pair.corral, "POST", "/tools", raw=raw, headers=ORIGIN)
    assert corral.status == peer.status == 400, (peer.body, corral.body)
    assert corral.json()["type"] == peer.json()["type"] == "invalid_request_error"
    assert "not valid JSON: a number overflows a double" in corral.json()["message"]


@pytest.mark.parametrize(
    "number", [2**32 + 2, 2**64 - 1, 10**20, -(2**63) - 1, 1e20, -1e20, 2.9, -3.7]
)
def test_a_number_beyond_int_is_cast_as_llama_cpp_casts_it(
    all_tools: tuple[Pair, Path], number: float
) -> None:
    """nlohmann's ``get<int>``: 2**32 + 2 wraps to 2, 2**64 - 1 to -1 (no limit), a double
    outside ``int`` is INT_MIN (nothing)."""
    pair, root = all_tools
    params = {"path": "notes.txt", "end_line": number}
    ((_, answer),) = run_steps(
        pair,
        root,
        [("end_line", {"tool": "read_file", "params": params}, {"X-Tool-Cwd": str(root)})],
    )
    assert answer.status == 200
