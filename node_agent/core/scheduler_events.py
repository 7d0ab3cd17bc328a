"""What goes into the scheduler and what comes out: :meth:`Scheduler.handle`'s vocabulary.

The runtime's owner turns everything that happens (a request arrives or leaves, a child was
spawned, became ready or exited, a timer fired) into one :data:`Event`, hands it to
``Scheduler.handle(event, now)`` and carries out the :data:`Effect` list it gets back, in
order: grant or refuse waiting requests, spawn a child, begin a drain, stop a child. The
owner decides nothing itself.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass

from node_agent.core.model_state import Transition

# -- the scheduler's view of a model and a lease ----------------------------------------------


class Keep(enum.Enum):
    """A request that gave no ``keep_alive``: after it, its model keeps its own idle time (its
    preset's ``ttl``, else ``--models-ttl``)."""

    DEFAULT = "default"


# A request's keep_alive (Ollama's): how long its model stays once idle after that request, in
# seconds (None: forever). It governs that request's aftermath only, as Ollama's API says
# ("how long the model will stay loaded into memory following the request"): the next request
# that gives none brings the model's own back, and a run that ends forgets it.
KeepAliveValue = float | None | Keep


@dataclass(frozen=True)
class ModelConfig:
    """What the scheduler needs of one model's preset."""

    pin: bool = False
    priority: int = 0
    slots: int = 0  # requests its child serves at once (its -np); 0: no bound
    ttl: float | None = None  # seconds idle before it is unloaded; None: never
    stop_timeout: float = 10.0  # seconds its requests in flight may run once it stops
    # Its child computes on the CPU with a thread per core (no GPU, no -t of its own): it takes
    # turns with the other such models (Scheduler.turn), since two of them computing at once
    # run twice as many threads as there are cores, and both slow down many times over.
    turns: bool = False


@dataclass(frozen=True)
class Lease:
    """The right to send one request to a model's child; release it when the response ends.

    It carries where the child listens, so the request goes there without asking again.
    ``slot``: the request takes one of the child's slots (a generation); the conversation
    streams' replays and stops take none."""

    model: str
    id: int
    inference: bool
    slot: bool = True
    port: int | None = None
    keep_alive: KeepAliveValue = Keep.DEFAULT  # its request's, applied when it is released


# -- events -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Request:
    """A request wants ``model``. ``waiter`` is the owner's id for it (answered by a Grant,
    Started or Refuse effect). ``may_load`` False: autoload is off. ``direct``: a
    ``POST /models/load``, answered once the model's child exists. ``deadline``: when it gives
    up (``--queue-timeout``, counted from its arrival, downloads included). ``keep_alive``:
    see :data:`KeepAliveValue`."""

    waiter: int
    model: str
    inference: bool = True
    slot: bool = True
    may_load: bool = True
    direct: bool = False
    deadline: float | None = None
    keep_alive: KeepAliveValue = Keep.DEFAULT


@dataclass(frozen=True)
class Leave:
    """A waiter's client went away; a load it started goes on."""

    waiter: int


class ChildFault(enum.Enum):
    """How a request found its child failing (issue 28: a wedged child)."""

    STALLED = "stalled"  # it accepted the request, then sent no byte within --timeout
    SERVER_ERROR = "server_error"  # it answered with a 5xx of its own


@dataclass(frozen=True)
class Release:
    """A leased request's response ended (or failed); ``fault``: the child's doing."""

    lease: Lease
    fault: ChildFault | None = None


@dataclass(frozen=True)
class Spawned:
    """The child of a granted load exists now and listens on ``port``."""

    model: str
    port: int | None


@dataclass(frozen=True)
class SpawnFailed:
    """A granted load ended before any process existed (binary missing, agent closing)."""

    model: str
    reason: str
    count: bool = True  # held against the model (False: withdrawn, e.g. at shutdown)


@dataclass(frozen=True)
class Ready:
    """The child serves now, on ``port`` (not always the spawn's: a port taken before the
    child bound it is retried on another)."""

    model: str
    port: int | None = None


@dataclass(frozen=True)
class Sleeping:
    model: str


@dataclass(frozen=True)
class Woke:
    model: str


@dataclass(frozen=True)
class Exited:
    """The child is gone (and, with the ledger, its memory shows free again)."""

    model: str
    code: int | None
    reason: str = ""


@dataclass(frozen=True)
class Unload:
    """Stop ``model`` if it runs (``reason``: manual, remove, reload)."""

    model: str
    reason: str


@dataclass(frozen=True)
class Catalog:
    """The catalog now: models added or updated; those absent leave once stopped; those in
    ``changed`` (new arguments) are stopped and load again on their next request."""

    models: Mapping[str, ModelConfig]
    changed: frozenset[str] = frozenset()


@dataclass(frozen=True)
class Probed:
    """The owner's probe of ``model``'s child on ``port`` ended: ``broken`` says how the child
    failed it (None: it answered as a healthy child does)."""

    model: str
    port: int
    broken: str | None


@dataclass(frozen=True)
class Tick:
    """Time passed: a deadline, a TTL or a minimum residency may be due."""


@dataclass(frozen=True)
class Close:
    """The agent is shutting down: refuse everyone, drain what runs until ``drain_until``."""

    drain_until: float


Event = (
    Request
    | Leave
    | Release
    | Spawned
    | SpawnFailed
    | Ready
    | Sleeping
    | Woke
    | Exited
    | Unload
    | Catalog
    | Probed
    | Tick
    | Close
)

# -- effects -----------------------------------------------------------------------------------


class Refusal(enum.Enum):
    """Why a waiter is turned away (the owner words each as llama.cpp does)."""

    FAILED = "failed"  # the load it waited for failed (``reason`` says why)
    GONE = "gone"  # the model left the catalog
    BACKOFF = "backoff"  # the model keeps failing: no load before ``retry_after`` seconds
    UNLOADED = "unloaded"  # it would need a load, and autoload is off
    CLOSING = "closing"  # the agent is shutting down
    TIMEOUT = "timeout"  # it waited until its deadline (``reason``: what it waited for)
    FULL = "full"  # --max-queue requests already wait for the model
    RUNNING = "running"  # a direct load of a model that already runs
    LIMIT = "limit"  # a direct load that only busy models could make room for


@dataclass(frozen=True)
class Grant:
    waiter: int
    lease: Lease


@dataclass(frozen=True)
class Started:
    """A direct load's child exists now (or the model already ran for it)."""

    waiter: int


@dataclass(frozen=True)
class Refuse:
    waiter: int
    kind: Refusal
    reason: str = ""
    retry_after: float = 0.0
    limit: float = 0.0  # TIMEOUT: the timeout; FULL: the queue bound


@dataclass(frozen=True)
class Queued:
    """A waiter could not go ahead at once (``slot``: it waits only for a free slot)."""

    waiter: int
    model: str
    reason: str
    slot: bool


@dataclass(frozen=True)
class Spawn:
    model: str


@dataclass(frozen=True)
class Drain:
    """``model`` stops: no new lease; its requests in flight may run until ``until``.
    ``evicted_for``: the model a memory or count eviction makes room for."""

    model: str
    reason: str
    until: float
    evicted_for: str | None = None


@dataclass(frozen=True)
class Stop:
    """The drain is over: ask the child to exit (``cut``: requests are still in flight, so
    kill it; llama-server would finish them first)."""

    model: str
    cut: bool


@dataclass(frozen=True)
class Probe:
    """Ask ``model``'s child on ``port`` what any healthy child answers (``suspicion``: why,
    for the log), and report a :class:`Probed`: its requests' failures may be their own."""

    model: str
    port: int
    suspicion: str


@dataclass(frozen=True)
class Removed:
    """A model that left the catalog is gone from the scheduler too."""

    model: str


Effect = Transition | Grant | Started | Refuse | Queued | Spawn | Drain | Stop | Probe | Removed
