"""A running model's records: the child protocol the registry drives, the events it reports,
and what the registry keeps for each child while it runs."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from node_agent.child.state import ChildEvent, EventKind
from node_agent.sources.download import DownloadPlan
from node_agent.sources.spec import ModelSpec

if TYPE_CHECKING:
    from node_agent.router.registry import Registry


class Child(Protocol):
    """One running llama-server, as the registry drives it (``child.process.ChildProcess``)."""

    @property
    def port(self) -> int | None: ...
    @property
    def pid(self) -> int | None: ...
    async def start(self) -> None: ...
    async def stop(self) -> int | None: ...
    async def wait_exited(self) -> int: ...


ChildFactory = Callable[[ModelSpec, "ModelEvents"], Child]


@dataclass
class ModelEvents:
    """The child's window onto the registry: what its stdout protocol reports, as it happens.

    Ready and exit are not here: the child's owner task sees those as ``start()`` returning
    and ``wait_exited()`` returning, in order.
    """

    registry: Registry
    name: str

    def dispatch(self, event: ChildEvent) -> None:
        if event.kind is EventKind.LOADING and event.progress is not None:
            progress = dict(event.loading) if event.loading else {"value": event.progress}
            data = {"status": "loading", "progress": progress}
            self.registry._publish(self.name, "status_change", data)
        elif event.kind is EventKind.SLEEPING:
            self.registry._child_slept(self.name)
        elif event.kind is EventKind.WOKE:
            self.registry._child_woke(self.name)


@dataclass
class Running:
    """One model's child as the registry holds it while it runs (its owner task's record)."""

    child: Child
    task: asyncio.Task[None] | None = None
    stop_task: asyncio.Task[None] | None = None
    # Free memory per device just before the stop, and what the model held: after the exit
    # the registry waits until that memory shows free again (GPUs report it late).
    freed_check: tuple[dict[str, int], dict[str, int]] | None = None
    stop_reason: str | None = None  # manual, evict, ttl, reload, shutdown; None: it crashed
    log_seq: int = 0  # the model's log ring position when this child started
    download: DownloadPlan | None = None  # the model's file, fetched before the child starts
    fetching: asyncio.Task[Path] | None = None  # that download, while it runs
