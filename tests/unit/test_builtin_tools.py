"""The pure parts of llama.cpp's built-in tools (node_agent.tools), and the flags that turn
them on: names, runtimes, globs, edits, argument reading, quoting, host files. (Programs, the
runtime container and the tools' threads: tests/integration/test_tools_programs.py; every
tool's answers side by side with b11434: tests/integration/test_builtin_tools.py.)"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import shlex
from pathlib import Path

import pytest

from node_agent.config import parse_agent_args
from node_agent.errors import ConfigError
from node_agent.tools.builtin import grep_search
from node_agent.tools.edits import EditError, apply_edits, fuzzy
from node_agent.tools.globs import glob_match, path_glob_match
from node_agent.tools.grep_worker import grep_lines
from node_agent.tools.io import ContainerIO, HostIO, SshIO, shell_quote_join, tools_io
from node_agent.tools.names import (
    TOOL_NAMES,
    ContainerSpec,
    RuntimeSpecError,
    check_attachable,
    check_tool_names,
    check_tools_runtime,
    split_tool_names,
)
from node_agent.tools.params import ParamError, at, opt_bool, opt_int, opt_str, required_str

# --- flags ---------------------------------------------------------------------------------


def test_tools_agent_and_their_env_as_llama_cpp_reads_them() -> None:
    assert parse_agent_args(["--tools", "all"], {}).tools == TOOL_NAMES
    assert parse_agent_args(["--tools", "get_info,read_file"], {}).tools == (
        "read_file",
        "get_info",
    )  # llama.cpp's order, not the flag's
    agent = parse_agent_args(["--agent"], {})
    assert agent.tools == TOOL_NAMES and agent.ui_mcp_proxy
    assert parse_agent_args(["-ag", "--tools", "grep_search"], {}).tools == ("grep_search",)
    off = parse_agent_args(["--agent", "--no-agent"], {})
    assert off.tools == () and not off.ui_mcp_proxy
    assert parse_agent_args([], {"LLAMA_ARG_TOOLS": "write_file"}).tools == ("write_file",)
    # $LLAMA_ARG_AGENT is read after the others, as llama.cpp reads its options in order.
    env = {"LLAMA_ARG_AGENT": "1", "LLAMA_ARG_UI_MCP_PROXY": "0", "LLAMA_ARG_TOOLS": "get_info"}
    both = parse_agent_args([], env)
    assert both.tools == TOOL_NAMES and both.ui_mcp_proxy
    assert parse_agent_args([], {"LLAMA_ARG_TOOLS": ""}).tools == ()  # empty: unset
    runtime = parse_agent_args(["--tools", "all", "--tools-runtime", "docker:alpine"], {})
    assert runtime.tools_runtime == "docker:alpine"
    assert not dict(runtime.child_options)  # nothing of it reaches the children


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["--tools", "read_file,rm_rf"], r'unknown tool "rm_rf"\. available tools: read_file, '),
        (["--tools", ""], r'unknown tool ""'),
        (["--tools", "all", "--tools-runtime", "lxc:x"], "unknown tool runtime: lxc:x"),
        (["--tools", "all", "--tools-runtime", "podman:"], "requires an image name"),
        (["--tools", "all", "--tools-runtime", "docker-container:-x"], "invalid container id"),
        (["--tools", "all", "--tools-runtime", "ssh:a b"], "invalid ssh target: a b"),
        (["--tools-runtime", "ssh:box"], "no tool is on"),
        ([], r"\$LLAMA_ARG_AGENT expects a boolean"),
    ],
)
def test_bad_tool_flags_are_clear_errors(argv: list[str], expected: str) -> None:
    env = {} if argv else {"LLAMA_ARG_AGENT": "perhaps"}
    with pytest.raises(ConfigError, match=expected):
        parse_agent_args(argv, env)


def test_tool_names_split_as_llama_cpp_splits_a_csv_row() -> None:
    assert split_tool_names("a,b") == ["a", "b"]
    assert split_tool_names('"a,b",c') == ["a,b", "c"]
    assert split_tool_names('a"b') == ['a"b']
    assert split_tool_names('"a""b"') == ['a"b']
    assert split_tool_names("") == [""]
    assert check_tool_names(["all", "read_file"]) == TOOL_NAMES


def test_runtimes_are_checked_as_llama_cpp_checks_them() -> None:
    assert check_attachable("docker-container:ab.c_1-2") == ContainerSpec(
        "docker", "ab.c_1-2", True
    )
    assert check_attachable("ssh:me@host.example") == "me@host.example"
    assert check_tools_runtime("podman:quay.io/x/y:1") == "podman:quay.io/x/y:1"
    for bad, message in (
        ("docker:alpine", "tool runtime must name a running container: docker:alpine"),
        ("docker-container:", "invalid container id: "),
        ("podman-container:--privileged", "invalid container id: --privileged"),
        ("ssh:-oProxyCommand=sh", "invalid ssh target: -oProxyCommand=sh"),
        ("ssh:a;b", "invalid ssh target: a;b"),
        ("host", "unknown tool runtime: host"),
    ):
        with pytest.raises(RuntimeSpecError) as caught:
            check_attachable(bad)
        assert str(caught.value) == message


def test_a_call_gets_the_io_of_its_runtime() -> None:
    assert isinstance(tools_io({}), HostIO)
    assert isinstance(tools_io({"runtime": "docker-container:c1", "cwd": "/w"}), ContainerIO)
    assert isinstance(tools_io({"runtime": "ssh:box"}), SshIO)
    with pytest.raises(RuntimeSpecError):
        tools_io({"runtime": "docker:alpine"})


# --- argument reading ----------------------------------------------------------------------


def test_arguments_read_as_nlohmann_json_reads_them() -> None:
    with pytest.raises(ParamError, match=r"^\[json.exception.out_of_range.403\] key 'path' not"):
        required_str({}, "path")
    with pytest.raises(ParamError, match=r"type must be string, but is number$"):
        required_str({"path": 1.5}, "path")
    with pytest.raises(ParamError, match=r"type must be string, but is boolean$"):
        required_str({"path": True}, "path")
    with pytest.raises(ParamError, match=r"type_error.304\] cannot use at\(\) with null$"):
        at(None, "x")
    assert opt_int({"n": "7"}, "n", 3) == 3 and opt_int({"n": 7.9}, "n", 3) == 7
    assert opt_int({"n": True}, "n", 3) == 3  # a boolean is not a number
    # A C cast of what nlohmann parsed (an int64/uint64 wraps; a double beyond int, INT_MIN).
    assert [opt_int({"n": n}, "n", 3) for n in (2**32 + 2, 2**64 - 1, -3.7)] == [2, -1, -3]
    int_min = -(2**31)
    beyond = (10**20, -(2**63) - 1, 1e20, -1e20, 2.0**31, float("inf"), float("nan"))
    assert [opt_int({"n": n}, "n", 3) for n in beyond] == [int_min] * len(beyond)
    assert opt_bool({"b": 1}, "b", False) is False and opt_str({"s": None}, "s", "d") == "d"
    assert opt_str([], "s", "d") == "d"


# --- globs ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("pattern", "text", "matched"),
    [
        ("*.py", "a.py", True),
        ("*.py", "d/a.py", False),  # * stops at /
        ("**/*.py", "d/e/a.py", True),
        ("**", "", True),
        ("a?c", "abc", True),
        ("a?c", "a/c", False),
        ("[a-c]x", "bx", True),
        ("[!a-c]x", "bx", False),
        ("[]]x", "]x", True),
        ("[-a]", "-", True),
        ("[abc", "[abc", True),  # no closing ]: a literal [
        ("src/**/*.py", "src/a/b.py", True),
        ("src/**/*.py", "src/a.py", False),  # llama.cpp's ** keeps both slashes
    ],
)
def test_glob_match_as_llama_cpp(pattern: str, text: str, matched: bool) -> None:
    assert glob_match(pattern, text) is matched


def test_a_pattern_without_a_slash_matches_the_basename() -> None:
    assert path_glob_match("*.py", "deep/down/a.py")
    assert path_glob_match("down/*.py", "deep/down/a.py")  # anchored with **/
    assert not path_glob_match("/down/*.py", "deep/down/a.py")


# --- grep ---------------------------------------------------------------------------------


def test_grep_lines_are_llama_cpps_and_bounded() -> None:
    content = b"a1\nb\na2\nc\n"
    regex = re.compile("a")
    found = grep_lines(regex, content, "f", True, 1, 100, 1000)
    windows = ["f:1:a1\n", "f-2-b\n", "--\n", "f-2-b\n", "f:3:a2\n", "f-4-c\n", "--\n"]
    assert found == (windows, 2, False, False)  # each match its own window, as llama.cpp
    assert grep_lines(regex, content, "f", False, 0, 1, 1000) == (["f:a1\n"], 1, True, False)
    # A huge context on a long file: the answer is cut, not the agent's memory.
    many = b"a\n" * 10_000
    lines, _, full, truncated = grep_lines(regex, many, "f", False, 10**9, 100, 4096)
    assert truncated and not full and sum(map(len, lines)) <= 4096


# --- edits ---------------------------------------------------------------------------------


def test_edits_match_the_original_not_each_other() -> None:
    text = "a = 1\nb = 2\nc = 3\n"
    edits = [("b = 2", "a = 1"), ("a = 1", "z = 0")]
    assert apply_edits(text, edits, "f") == "z = 0\na = 1\nc = 3\n"


@pytest.mark.parametrize(
    ("text", "edits", "message"),
    [
        (
            "x\nx\n",
            [("x", "y")],
            "found 2 occurrences of edits[0].old_text in f, it must be unique",
        ),
        ("x  \nx\n", [("x\n", "y")], "found 2 occurrences"),  # fuzzily a duplicate
        ("abc", [("zz", "y")], "could not find edits[0].old_text in f, it must match"),
        ("abcd", [("ab", "1"), ("bc", "2")], "edits[0] and edits[1] overlap in f; merge"),
        ("abc", [("b", "b")], "no changes made: the replacement(s) produced identical content"),
    ],
)
def test_edits_that_cannot_be_applied(
    text: str, edits: list[tuple[str, str]], message: str
) -> None:
    with pytest.raises(EditError) as caught:
        apply_edits(text, edits, "f")
    assert str(caught.value).startswith(message)


def test_a_fuzzy_edit_keeps_the_lines_it_does_not_touch() -> None:
    text = "keep \u201cthis\u201d   \nsay \u201chi\u201d \u2014 now  \nlast\u00a0line\t\n"
    edited = apply_edits(text, [('say "hi" - now', "said")], "f")
    # The touched line is rebuilt from the normalised text, the others keep their bytes.
    assert edited == "keep \u201cthis\u201d   \nsaid\nlast\u00a0line\t\n"
    # Trailing blanks go first, then the typographic space becomes one (llama.cpp's order).
    assert fuzzy("a \u2018b\u2019\u2212c\u3000 \r\nd\t") == "a 'b'-c \nd"


def test_edits_past_their_time_are_a_clear_error() -> None:
    with pytest.raises(EditError) as caught:
        apply_edits("a\nb\n", [("a", "c")], "f", timeout=0)
    assert str(caught.value) == "edit_file timed out after 0 s on f: use fewer edits or write_file"


def test_fuzzy_in_pieces_is_fuzzy_whole(monkeypatch: pytest.MonkeyPatch) -> None:
    text = "a \u201cb\u201d  \nc\t\n\n d\u2014e \r\nlast  "
    whole = fuzzy(text)
    monkeypatch.setattr("node_agent.tools.edits._FUZZY_PIECE", 3)
    assert fuzzy(text) == whole == 'a "b"\nc\n\n d-e\nlast'


async def test_a_glob_too_long_is_refused_before_any_work() -> None:
    answer = await grep_search({"path": "/nowhere", "pattern": "x", "exclude": "*" * 257}, None)
    assert answer == {"error": "exclude pattern too long (257 characters, max 256)"}


# --- quoting and programs ------------------------------------------------------------------


@pytest.mark.parametrize("argv", [["sh", "-c", 'echo "$1"', "_", "it's; $(rm -rf /)"], ["", "a b"]])
def test_shell_quote_join_gives_back_the_argv(argv: list[str]) -> None:
    assert shlex.split(shell_quote_join(argv)) == argv


def test_a_long_path_is_matched_without_deep_recursion() -> None:
    deep = "d/" * 5000 + "x.py"
    assert path_glob_match("*.py", deep) and glob_match("**/*.py", deep)
    assert not glob_match("*" * 200 + "b", "a" * 300)  # no exponential search


async def test_a_host_file_is_read_up_to_a_bound(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("node_agent.tools.io.HOST_READ_MAX", 8)
    (tmp_path / "small").write_bytes(b"12345678")
    (tmp_path / "large").write_bytes(b"123456789")
    io = HostIO(str(tmp_path))
    assert await io.read_file("small") == b"12345678"
    assert await io.read_file("large") is None  # "failed to open file", not all of it
    assert io.resolve("a/../b/./c") == f"{tmp_path}/b/c"


async def test_a_fifo_is_no_file_to_read_or_write(tmp_path: Path) -> None:
    """Opened as llama.cpp opens it, a FIFO would hold a tool thread until a peer came."""
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    io = HostIO(str(tmp_path))
    try:
        assert await asyncio.wait_for(io.write_file("fifo", b"x"), 10) is False
        assert await asyncio.wait_for(io.read_file("fifo"), 10) is None
    finally:  # let an open that blocked (the old code's) go on, so the thread ends
        for flags in (os.O_RDONLY, os.O_WRONLY):
            with contextlib.suppress(OSError):
                os.close(os.open(fifo, flags | os.O_NONBLOCK))
