"""What a router outside the agent reads to choose a node, served without credentials on a
port of its own (``--routing-metrics-port``).

The Gateway API Inference Extension's endpoint picker (an InferencePool's) scrapes each pod of
its pool many times a second, with no credentials, and reads the gauges its flags name: the
requests a server queues (``--total-queued-requests-metric``) and a vLLM-style info gauge of
the LoRA adapters a server holds (``--lora-info-metric``: labels ``running_lora_adapters``,
``waiting_lora_adapters`` and ``max_lora``). To the picker, each model this agent has or is
getting (the states peers are told and rank above a new load: loaded, asleep, loading,
downloading, or queued for: ``peer_rank.RESIDENT``) is a running adapter; it prefers the pods
where a request's model is one, then those with room to load it (``max_lora`` above the
count), then the least queued. Only these figures are here: the agent's own ``/metrics`` stays
behind its keys, and nothing here reads a request body or a key.

A model's name reaches the picker as is or not at all: a name with a comma (the picker splits
the lists on commas), one that :func:`~node_agent.redact.redact` would change (made from a URL
with a secret), or one that is not valid UTF-8 (a file name's stray bytes) is left out, so
such a model is simply not preferred anywhere.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol

from aiohttp import web

from node_agent.core.model_state import ModelView, Statistics
from node_agent.core.peer_rank import DOWNLOADING, RESIDENT, fits, ranked_state
from node_agent.redact import redact

QUEUED = "corral_queued_requests"
RESIDENT_INFO = "corral_resident_models_info"
# Prometheus' text format, as the picker's parser (expfmt.TextParser) reads it.
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
# The picker skips a series whose two lists are both empty and then keeps the pod's previous
# lists: an agent that unloaded its last model would stay preferred for it. Having nothing is
# said as the list of two empty names instead (no request names the empty model).
NOTHING = ","


class Scheduler(Protocol):
    """``core.scheduler.Scheduler`` is one."""

    def residents(self) -> list[str]: ...
    def view(self, name: str) -> ModelView: ...
    def statistics(self) -> Statistics: ...


class Downloads(Protocol):
    """``runtime.model_downloads.ModelDownloads`` is one."""

    def active(self, name: str) -> bool: ...
    def names(self) -> list[str]: ...


def shown(names: Iterable[str]) -> list[str]:
    """The names the picker can be told: no comma, nothing redaction would hide, UTF-8."""
    return [n for n in names if n and "," not in n and redact(n) == n and _utf8(n)]


def _utf8(name: str) -> bool:
    try:
        name.encode()
    except UnicodeEncodeError:  # a lone surrogate: a file name's byte that was not UTF-8
        return False
    return True


def _label_value(text: str) -> str:
    # The text format's three escapes; names are the catalog's, any character may be there.
    return text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def resident_states(
    scheduler: Scheduler, downloads: Downloads, queue: Iterable[tuple[str, int]]
) -> dict[str, str]:
    """Each model this agent has or is getting, with its state as peers are told it. Looks at
    the running, queued (``queue``: the scheduler's) and downloading models only (not the
    whole catalog)."""
    queued = [model for model, waiting in queue if waiting]
    states: dict[str, str] = {}
    for name in dict.fromkeys([*scheduler.residents(), *queued]):
        view = scheduler.view(name)
        states[name] = ranked_state(view.state.value, view.queued, downloading=False)
    for name in downloads.names():
        if downloads.active(name):
            states[name] = DOWNLOADING
    return {name: state for name, state in states.items() if state in RESIDENT}


def routing_text(scheduler: Scheduler, downloads: Downloads) -> bytes:
    """The scrape's body. The picker sees room to load a model where it is told of fewer
    adapters than ``max_lora``: one more than it is told while the agent has a free instance
    slot (``--models-max``, counted as peers count it), else as many."""
    stats = scheduler.statistics()
    states = resident_states(scheduler, downloads, stats.queue)
    names = shown(states)
    queued = sum(waiting for _, waiting in stats.queue)
    running = _label_value(",".join(names) if names else NOTHING)
    told = len(names) or 1  # NOTHING is one (empty) name to the picker
    room = told + (1 if fits(list(states.values()), stats.models_max) else 0)
    return (
        f"# HELP {QUEUED} Requests waiting for a model on this agent now, all models.\n"
        f"# TYPE {QUEUED} gauge\n"
        f"{QUEUED} {queued}\n"
        f"# HELP {RESIDENT_INFO} The models this agent has or is getting "
        "(running_lora_adapters), and one more than those in max_lora while it has room to "
        "load another, in the labels of vLLM's vllm:lora_requests_info; always 1.\n"
        f"# TYPE {RESIDENT_INFO} gauge\n"
        f'{RESIDENT_INFO}{{running_lora_adapters="{running}",waiting_lora_adapters="",'
        f'max_lora="{room}"}} 1\n'
    ).encode()


def routing_app(scheduler: Scheduler, downloads: Downloads) -> web.Application:
    """``GET /metrics`` and nothing else (any other path: 404)."""

    async def metrics(request: web.Request) -> web.Response:
        body = routing_text(scheduler, downloads)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE})

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    return app
