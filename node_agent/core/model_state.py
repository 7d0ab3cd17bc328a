"""A model's state as everyone may see it: the states, their transitions, and the scheduler's
snapshots (:class:`ModelView`, :class:`Statistics`).

The HTTP layer reads these; only the runtime's owner drives the scheduler that makes them.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final, NamedTuple


class ModelState(enum.Enum):
    """What a model's child is doing (llama.cpp's ``server_model_status`` names)."""

    UNLOADED = "unloaded"
    LOADING = "loading"
    LOADED = "loaded"
    SLEEPING = "sleeping"

    @property
    def running(self) -> bool:
        """A child process exists (it holds an instance slot)."""
        return self is not ModelState.UNLOADED


# Which state may follow which (a model's life: spawned, ready, asleep and awake, gone).
MODEL_TRANSITIONS: Final[Mapping[ModelState, frozenset[ModelState]]] = {
    ModelState.UNLOADED: frozenset({ModelState.LOADING}),
    ModelState.LOADING: frozenset({ModelState.LOADED, ModelState.UNLOADED}),
    ModelState.LOADED: frozenset({ModelState.SLEEPING, ModelState.UNLOADED}),
    ModelState.SLEEPING: frozenset({ModelState.LOADED, ModelState.UNLOADED}),
}


class IllegalTransition(ValueError):
    """A state change :data:`MODEL_TRANSITIONS` does not allow (a bug in the caller)."""


@dataclass(frozen=True)
class Transition:
    """One model's state change, recorded once for the log."""

    model: str
    old: ModelState
    new: ModelState


# The states in which a child takes requests.
USABLE = frozenset({ModelState.LOADED, ModelState.SLEEPING})


class ModelView(NamedTuple):
    """A frozen snapshot of one model's scheduling state.

    A named tuple, not a frozen dataclass: a listing of 1,000 models makes 1,000 of them, and
    a frozen dataclass's ``__init__`` (a guarded ``__setattr__`` per field) took three times as
    long, a third of ``GET /models`` (issue 30)."""

    name: str
    state: ModelState
    stopping: bool
    in_flight: int
    last_used: float
    queued: int
    failed: bool
    exit_code: int | None
    error: str | None
    failures: int
    retry_at: float
    claimed: bool = False  # a load was granted and its process does not exist yet
    ttl: float | None = None  # seconds idle before it is unloaded (None: never)
    pin: bool = False

    @property
    def usable(self) -> bool:
        """It takes a request now (loaded or asleep, not stopping): the one rule, for every
        caller that needs it (the conversation streams, the views)."""
        return self.state in USABLE and not self.stopping


@dataclass(frozen=True)
class Statistics:
    models_max: int
    running: int
    stopping: int
    claimed: int
    needed: int
    free: int | None
    queue: tuple[tuple[str, int], ...]  # (model, waiters) in queue order
