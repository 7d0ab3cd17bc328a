"""The MCP server definitions: Cursor's ``{"mcpServers": {name: {command, args, env, cwd}}}``,
read the way llama.cpp reads them (``server_mcp_server_config::parse_cursor_format``)."""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from node_agent.errors import ConfigError

log = logging.getLogger("corral.mcp")

DEFAULT_TIMEOUT_MS = 30_000  # per tool call, llama.cpp's default


@dataclass(frozen=True, slots=True)
class McpServerConfig:
    name: str
    command: str
    args: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = ()
    """Set over the agent's own environment (empty: the agent's environment as it is)."""
    cwd: str | None = None
    timeout_ms: int = DEFAULT_TIMEOUT_MS


def load_servers(config_file: str | None, inline_json: str | None) -> tuple[McpServerConfig, ...]:
    """Every server from ``--mcp-servers-config`` then ``--mcp-servers-json``; a name given
    twice keeps its first definition (llama.cpp warns and skips the second)."""
    found: dict[str, McpServerConfig] = {}
    sources: list[tuple[str, str]] = []
    if config_file:
        try:
            sources.append((f"--mcp-servers-config {config_file}", Path(config_file).read_text()))
        except OSError as exc:
            raise ConfigError(
                f"--mcp-servers-config: failed to open MCP config file: {config_file} "
                f"({exc.strerror})"
            ) from exc
    if inline_json:
        sources.append(("--mcp-servers-json", inline_json))
    for where, text in sources:
        servers = parse_servers(text, where)
        if not servers:
            log.warning("MCP config: no servers found in JSON (%s)", where)
        for server in servers:
            if server.name in found:
                log.warning("MCP config: duplicate server name '%s', skipping", server.name)
                continue
            found[server.name] = server
    return tuple(found.values())


def parse_servers(text: str, where: str) -> list[McpServerConfig]:
    """The servers of one JSON document. No ``mcpServers`` object means none; an entry
    without a ``command`` is skipped with a warning; anything else malformed is an error."""
    try:
        document = json.loads(text)
    except ValueError as exc:
        raise ConfigError(f"{where}: failed to parse MCP config JSON: {exc}") from exc
    servers = document.get("mcpServers") if isinstance(document, dict) else None
    if not isinstance(servers, dict):
        return []
    result = []
    for name, entry in servers.items():
        server = _server(name, entry, f"{where}: mcpServers.{name}")
        if server is None:
            log.warning("MCP server '%s' has no command, skipping", name)
            continue
        result.append(server)
    return result


def _server(name: str, entry: Any, where: str) -> McpServerConfig | None:
    if not isinstance(entry, dict):
        raise ConfigError(f"{where} must be an object with a command, got {entry!r}")
    command = _text(entry, "command", where)
    if not command:
        return None
    args = entry.get("args", [])
    if not isinstance(args, list):
        args = []  # llama.cpp reads args only when it is an array
    if not all(isinstance(a, str) for a in args):
        raise ConfigError(f"{where}.args must hold strings only, got {args!r}")
    env = entry.get("env", {})
    if not isinstance(env, dict):
        env = {}
    if not all(isinstance(v, str) for v in env.values()):
        raise ConfigError(f"{where}.env values must be strings, got {env!r}")
    timeout = entry.get("timeout_ms", DEFAULT_TIMEOUT_MS)
    if not isinstance(timeout, int) or isinstance(timeout, bool) or timeout <= 0:
        raise ConfigError(f"{where}.timeout_ms must be a positive integer, got {timeout!r}")
    return McpServerConfig(
        name=name,
        command=command,
        args=tuple(args),
        env=tuple(env.items()),
        cwd=_text(entry, "cwd", where) or None,
        timeout_ms=timeout,
    )


def _text(entry: dict[str, Any], key: str, where: str) -> str:
    value = entry.get(key, "")
    if not isinstance(value, str):
        raise ConfigError(f"{where}.{key} must be a string, got {value!r}")
    return value
