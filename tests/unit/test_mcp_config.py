"""Router-run MCP servers: their definitions, the flags that turn them on, and that nothing
but the agent's own command line (or environment) can."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from node_agent.child.spawn import ChildConfig, child_environment
from node_agent.config import parse_agent_args
from node_agent.errors import ConfigError
from node_agent.mcp.config import McpServerConfig, load_servers, parse_servers
from node_agent.sources.preset_ini import parse_preset_text

SERVERS = {
    "mcpServers": {
        "fs": {"command": "mcp-fs", "args": ["--root", "/srv"], "env": {"A": "1"}, "cwd": "/w"},
        "nocommand": {"args": ["x"]},
        "slow": {"command": "slow-mcp", "timeout_ms": 5},
    }
}


def test_cursor_format_as_llama_cpp_reads_it() -> None:
    servers = parse_servers(json.dumps(SERVERS), "--mcp-servers-json")
    assert servers == [
        McpServerConfig("fs", "mcp-fs", ("--root", "/srv"), (("A", "1"),), "/w"),
        McpServerConfig("slow", "slow-mcp", timeout_ms=5),
    ]  # an entry without a command is skipped, as llama.cpp does
    assert parse_servers("{}", "x") == [] and parse_servers('{"mcpServers": []}', "x") == []


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("{nope", "--mcp-servers-json: failed to parse MCP config JSON"),
        ('{"mcpServers": {"a": "cmd"}}', "mcpServers.a must be an object"),
        ('{"mcpServers": {"a": {"command": 3}}}', "mcpServers.a.command must be a string"),
        ('{"mcpServers": {"a": {"command": "c", "args": [1]}}}', "args must hold strings"),
        ('{"mcpServers": {"a": {"command": "c", "timeout_ms": 0}}}', "positive integer"),
    ],
)
def test_bad_definitions_say_where(text: str, expected: str) -> None:
    with pytest.raises(ConfigError, match=expected):
        parse_servers(text, "--mcp-servers-json")


def test_file_then_inline_and_a_name_given_twice_keeps_the_first(tmp_path: Path) -> None:
    path = tmp_path / "mcp.json"
    path.write_text(json.dumps({"mcpServers": {"a": {"command": "from-file"}}}))
    inline = json.dumps({"mcpServers": {"a": {"command": "inline"}, "b": {"command": "b"}}})
    servers = load_servers(str(path), inline)
    assert [(s.name, s.command) for s in servers] == [("a", "from-file"), ("b", "b")]
    with pytest.raises(ConfigError, match="failed to open MCP config file"):
        load_servers(str(tmp_path / "absent.json"), None)


def test_flags_and_env_turn_them_on() -> None:
    options = parse_agent_args(["--mcp-servers-json", "{}", "--ui-mcp-proxy"], {})
    assert options.mcp_servers_json == "{}" and options.ui_mcp_proxy
    assert not dict(options.child_options)  # nothing of it reaches the children
    env = {"LLAMA_ARG_MCP_SERVERS_CONFIG": "/etc/mcp.json", "LLAMA_ARG_UI_MCP_PROXY": "1"}
    options = parse_agent_args([], env)
    assert options.mcp_servers_config == "/etc/mcp.json" and options.ui_mcp_proxy
    assert not parse_agent_args(["--ui-mcp-proxy", "--no-agent"], {}).ui_mcp_proxy


@pytest.mark.parametrize(
    "key",
    ["mcp-servers-json", "mcp-servers-config", "ui-mcp-proxy", "tools", "tools-runtime", "agent"],
)
def test_no_preset_can_turn_them_on(key: str) -> None:
    with pytest.raises(ConfigError, match="router setting") as caught:
        parse_preset_text(f"[m]\nmodel = /m.gguf\n{key} = x\n", "p.ini")
    assert "p.ini:3:" in str(caught.value)


def test_children_do_not_inherit_them_from_the_agents_environment() -> None:
    base = {"LLAMA_ARG_MCP_SERVERS_JSON": "{}", "LLAMA_ARG_TOOLS": "all", "PATH": "/bin"}
    env = child_environment(ChildConfig("m", Path("/bin/true"), ()), base)
    assert "LLAMA_ARG_MCP_SERVERS_JSON" not in env and "LLAMA_ARG_TOOLS" not in env
    assert env["PATH"] == "/bin"
