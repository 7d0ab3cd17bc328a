"""What a router outside the agent reads to choose a node, served without credentials on a
port of its own (``--routing-metrics-port``).

The Gateway API Inference Extension's endpoint picker (an InferencePool's) scrapes each pod of
its pool many times a second, with no credentials, and reads the gauges its flags name: the
requests a server queues (``--total-queued-requests-metric``) and a vLLM-style info gauge of
the LoRA adapters a server holds (``--lora-info-metric``: labels ``running_lora_adapters``,
``waiting_lora_adapters`` and ``max_lora``). To the picker, each model an agent runs is such
an adapter: it prefers the pods where a request's model is loaded, then those with room to
load it, then those where it is loading. Only these figures are here: the agent's own
``/metrics`` stays behind its keys, and nothing here takes a request body or a key.

A model's name reaches the picker as is or not at all: a name with a comma (the picker splits
the lists on commas) or that :func:`~node_agent.redact.redact` would change (made from a URL
with a secret) is left out, so such a model is simply not preferred anywhere.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol

from aiohttp import web

from node_agent.core.model_state import Statistics
from node_agent.redact import redact

QUEUED = "corral_queued_requests"
RESIDENT = "corral_resident_models_info"
# Prometheus' text format, as the picker's parser (expfmt.TextParser) reads it.
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class Residents(Protocol):
    """What the text is made of (``core.scheduler.Scheduler`` is one)."""

    def residents(self) -> tuple[list[str], list[str]]: ...
    def statistics(self) -> Statistics: ...


def shown(names: Iterable[str]) -> list[str]:
    """The names the picker can be told: no comma, nothing redaction would hide."""
    return [n for n in names if n and "," not in n and redact(n) == n]


def _label_value(text: str) -> str:
    # The text format's three escapes; names are the catalog's, any character may be there.
    return text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


# The picker skips a series whose two lists are both empty and then keeps the pod's previous
# lists: an agent that unloaded its last model would stay preferred for it. Running nothing is
# said as the list of two empty names instead (no request names the empty model).
NOTHING = ","


def routing_text(residents: Residents) -> bytes:
    """The scrape's body. The picker sees room to load a model where it is told of fewer
    adapters than ``max_lora``: that is the names it is told plus the free instance slots
    (``--models-max``; without a limit, one: the memory ledger may still unload an idle model
    to make room, as for any request)."""
    usable, loading = (shown(names) for names in residents.residents())
    stats = residents.statistics()
    queued = sum(waiting for _, waiting in stats.queue)
    running = _label_value(",".join(usable) if usable or loading else NOTHING)
    waiting = _label_value(",".join(loading))
    told = len(usable) + len(loading) or 1  # NOTHING is one (empty) name to the picker
    room = told + (1 if stats.free is None else max(stats.free, 0))
    return (
        f"# HELP {QUEUED} Requests waiting for a model on this agent now, all models.\n"
        f"# TYPE {QUEUED} gauge\n"
        f"{QUEUED} {queued}\n"
        f"# HELP {RESIDENT} The models this agent serves now (running_lora_adapters), those "
        "loading (waiting_lora_adapters), and more than those in max_lora while it has room "
        "to load another, in the labels of vLLM's vllm:lora_requests_info; always 1.\n"
        f"# TYPE {RESIDENT} gauge\n"
        f'{RESIDENT}{{running_lora_adapters="{running}",waiting_lora_adapters="{waiting}",'
        f'max_lora="{room}"}} 1\n'
    ).encode()


def routing_app(residents: Residents) -> web.Application:
    """``GET /metrics`` and nothing else (any other path: 404)."""

    async def metrics(request: web.Request) -> web.Response:
        return web.Response(body=routing_text(residents), headers={"Content-Type": CONTENT_TYPE})

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    return app
