"""The agent's MCP servers: found at start, started on demand, restarted after a crash.

llama.cpp's ``server_mcp``: at start each server is spawned once, its tools listed (at most
10 s each) and the server closed again; that list is what ``GET /tools`` shows for the agent's
life. A tool call starts its server when it is not running (again after a crash); a server
that fails to start is not tried again for 5 s. A server that cannot be spawned at all is
logged and left out; it never stops the agent.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from node_agent.mcp.config import McpServerConfig
from node_agent.mcp.stdio import StdioSession, ToolDef

log = logging.getLogger("corral.mcp")

WARMUP_TIMEOUT_SECONDS = 10.0
COOLDOWN_SECONDS = 5.0


@dataclass(frozen=True, slots=True)
class McpStatistics:
    configured: int
    tools: int
    running: tuple[str, ...]
    cooling_down: tuple[str, ...]
    closed: bool


class McpServers:
    """Owns every MCP server process the agent runs."""

    def __init__(
        self, configs: tuple[McpServerConfig, ...], clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._configs = {c.name: c for c in configs}
        self._clock = clock
        self._tools: list[ToolDef] = []
        self._sessions: dict[str, StdioSession] = {}
        self._retry_at: dict[str, float] = {}  # name -> when a failed start may be retried
        self._starting: dict[str, asyncio.Lock] = {}
        self._closed = False

    def __bool__(self) -> bool:
        return bool(self._configs)

    @property
    def tools(self) -> list[ToolDef]:
        return list(self._tools)

    async def warm_up(self) -> None:
        """List every server's tools (one server after the other, as llama.cpp does)."""
        found: list[ToolDef] = []
        for config in self._configs.values():
            session = StdioSession(config)
            if not await session.start():
                log.warning(
                    "MCP warmup: failed to spawn '%s': %s", config.name, session.diagnostics()
                )
                continue
            try:
                tools = await session.list_tools(WARMUP_TIMEOUT_SECONDS)
            finally:
                await session.close()
            if not tools and session.last_error:
                log.warning("MCP warmup: '%s': %s", config.name, session.diagnostics())
            log.info("MCP warmup: '%s' discovered %d tools", config.name, len(tools))
            found.extend(tools)
        self._tools = found

    async def call_tool(self, server: str, tool: str, arguments: Any) -> dict[str, Any]:
        session = await self._session(server)
        if session is None:
            return {"error": f"MCP server unavailable: {server}"}
        return await session.call_tool(tool, arguments)

    async def _session(self, name: str) -> StdioSession | None:
        """The server's running session, started now if it is not running."""
        config = self._configs.get(name)
        if config is None or self._closed:
            return None
        # One start at a time per server: two calls after a crash must not spawn two.
        async with self._starting.setdefault(name, asyncio.Lock()):
            session = self._sessions.get(name)
            if session is not None and session.alive:
                return session
            if session is not None:
                log.warning("MCP '%s' is no longer alive: %s", name, session.diagnostics())
                del self._sessions[name]
                await session.close()
            if self._clock() < self._retry_at.get(name, 0.0) or self._closed:
                return None
            fresh = StdioSession(config)
            if await fresh.start() and not self._closed:
                self._sessions[name] = fresh
                self._retry_at.pop(name, None)
                return fresh
            log.warning("MCP '%s': failed to start: %s", name, fresh.diagnostics())
            self._retry_at[name] = self._clock() + COOLDOWN_SECONDS
            await fresh.close()
            return None

    def statistics(self) -> McpStatistics:
        now = self._clock()
        return McpStatistics(
            configured=len(self._configs),
            tools=len(self._tools),
            running=tuple(n for n, s in self._sessions.items() if s.alive),
            cooling_down=tuple(n for n, at in self._retry_at.items() if now < at),
            closed=self._closed,
        )

    async def close(self) -> None:
        """Refuse further calls and end every running server; a call in flight answers
        "cancelled" (llama.cpp's shutdown flag), so it does not hold the shutdown up."""
        self._closed = True
        sessions = list(self._sessions.values())
        self._sessions.clear()
        await asyncio.gather(*(s.close("cancelled") for s in sessions))
