"""The built-in tools one agent serves, and the runtime they run in (``--tools-runtime``)."""

from __future__ import annotations

import asyncio
from typing import Any

from node_agent.errors import ConfigError
from node_agent.tools.builtin import TOOLS, Result, Tool
from node_agent.tools.container import ContainerRuntime, RuntimeStartError
from node_agent.tools.names import container_spec
from node_agent.tools.process import OnChunk

CANCELLED: Result = {"error": "cancelled"}


class ToolboxClosed(Exception):
    """The agent is shutting down: no call starts (nor a container for one)."""


class Toolbox:
    """``names``: the enabled tools (checked at parse time); ``runtime``: the
    ``--tools-runtime`` value or None (the host)."""

    def __init__(self, names: tuple[str, ...], runtime: str | None) -> None:
        self.tools = {t.name: t for t in TOOLS if t.name in names}
        self.runtime = runtime
        spec = container_spec(runtime) if runtime else None
        self._container = ContainerRuntime(spec) if spec and not spec.attach else None
        self._running: set[asyncio.Task[Result]] = set()
        self._closing = asyncio.Event()

    async def start(self) -> None:
        if self._container is not None:
            try:
                await self._container.start()
            except RuntimeStartError as exc:
                raise ConfigError(f"--tools-runtime {self.runtime}: {exc}") from None

    async def invoke(self, tool: Tool, params: Any, on_chunk: OnChunk | None) -> Result:
        """Run one call; the agent's shutdown ends it (its program killed) with llama.cpp's
        word for that, as an MCP call's: the shutdown does not wait for a minute's command."""
        if self._closing.is_set():
            return CANCELLED
        task = asyncio.ensure_future(tool.invoke(params, on_chunk))
        self._running.add(task)
        try:
            return await task
        except asyncio.CancelledError:
            current = asyncio.current_task()
            if self._closing.is_set() and current is not None and not current.cancelling():
                return CANCELLED  # ended by close(), not by this request's own cancellation
            raise
        finally:
            self._running.discard(task)

    async def close(self) -> None:
        """End the calls still running, then remove the container (if the agent owns one)."""
        self._closing.set()
        for task in list(self._running):
            task.cancel()
        await asyncio.gather(*self._running, return_exceptions=True)
        if self._container is not None:
            await self._container.close()

    async def runtime_spec(self) -> str | None:
        """The runtime a call runs in when its client named none."""
        if self._closing.is_set():  # else a call in the shutdown's window respawns `run`
            raise ToolboxClosed
        if self._container is not None:
            return await self._container.spec()
        return self.runtime

    def entries(self) -> list[dict[str, Any]]:
        return [t.entry() for t in self.tools.values()]

    def find(self, name: str) -> Tool | None:
        return self.tools.get(name)
