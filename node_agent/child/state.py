"""A child's states, the transitions allowed between them, and the events it reports."""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final


class ChildState(enum.Enum):
    STARTING = "starting"  # spawned; no sign of loading yet
    LOADING = "loading"  # a `loading` state line (or /health 503) was seen
    READY = "ready"  # `ready` line confirmed by /health 200 (or /health 200 alone)
    SLEEPING = "sleeping"  # alive, model unloaded by --sleep-idle-seconds; wakes on a request
    STOPPING = "stopping"  # asked to exit (or being killed)
    EXITED = "exited"  # reaped; final


ALLOWED: Final[Mapping[ChildState, frozenset[ChildState]]] = {
    ChildState.STARTING: frozenset(
        {ChildState.LOADING, ChildState.READY, ChildState.STOPPING, ChildState.EXITED}
    ),
    ChildState.LOADING: frozenset({ChildState.READY, ChildState.STOPPING, ChildState.EXITED}),
    ChildState.READY: frozenset({ChildState.SLEEPING, ChildState.STOPPING, ChildState.EXITED}),
    ChildState.SLEEPING: frozenset({ChildState.READY, ChildState.STOPPING, ChildState.EXITED}),
    ChildState.STOPPING: frozenset({ChildState.EXITED}),
    ChildState.EXITED: frozenset(),
}

# States in which the model is not loaded yet: a stop kills at once instead of asking.
NOT_LOADED: Final = frozenset({ChildState.STARTING, ChildState.LOADING})


class EventKind(enum.Enum):
    SPAWNED = "spawned"  # the process exists (repeats when a lost port makes it respawn)
    LOADING = "loading"  # loading progress (repeats while loading)
    READY = "ready"
    SLEEPING = "sleeping"
    WOKE = "woke"  # ready again after sleeping
    STOPPING = "stopping"
    EXITED = "exited"


@dataclass(frozen=True)
class ChildEvent:
    """What a child reports to its ``on_event`` callback.

    ``expected`` (on EXITED) is True when the exit followed a ``stop()``; a failed start and a
    crash are both unexpected, and ``reason`` then says why.
    """

    name: str
    kind: EventKind
    state: ChildState
    pid: int | None
    port: int | None
    progress: float | None = None
    meta: Mapping[str, Any] | None = None
    exit_code: int | None = None
    expected: bool = True
    reason: str | None = None
    loading: Mapping[str, Any] | None = None
    """On LOADING: the child's own progress payload (``stages``, ``current``, ``value``)."""


@dataclass(frozen=True)
class ChildSnapshot:
    """A frozen view of one child, for readers other than its owner."""

    name: str
    state: ChildState
    pid: int | None
    port: int | None
    progress: float | None
    exit_code: int | None
    speaks_protocol: bool
    ready_after: float | None  # seconds from spawn to ready
    spawn_attempts: int
    log_lines: int
