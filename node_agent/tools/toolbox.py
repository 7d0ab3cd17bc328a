"""The built-in tools one agent serves, and the runtime they run in (``--tools-runtime``)."""

from __future__ import annotations

from typing import Any

from node_agent.errors import ConfigError
from node_agent.tools.builtin import TOOLS, Tool
from node_agent.tools.container import ContainerRuntime, RuntimeStartError
from node_agent.tools.names import container_spec


class Toolbox:
    """``names``: the enabled tools (checked at parse time); ``runtime``: the
    ``--tools-runtime`` value or None (the host)."""

    def __init__(self, names: tuple[str, ...], runtime: str | None) -> None:
        self.tools = {t.name: t for t in TOOLS if t.name in names}
        self.runtime = runtime
        spec = container_spec(runtime) if runtime else None
        self._container = ContainerRuntime(spec) if spec and not spec.attach else None

    async def start(self) -> None:
        if self._container is not None:
            try:
                await self._container.start()
            except RuntimeStartError as exc:
                raise ConfigError(f"--tools-runtime {self.runtime}: {exc}") from None

    async def close(self) -> None:
        if self._container is not None:
            await self._container.close()

    async def runtime_spec(self) -> str | None:
        """The runtime a call runs in when its client named none."""
        if self._container is not None:
            return await self._container.spec()
        return self.runtime

    def entries(self) -> list[dict[str, Any]]:
        return [t.entry() for t in self.tools.values()]

    def find(self, name: str) -> Tool | None:
        return self.tools.get(name)
