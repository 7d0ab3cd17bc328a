"""JSON views of the registry in llama.cpp's router shapes (``GET /models``, ``GET /props``).

Corral's own figures go under a ``corral`` key per model, so every key and type llama.cpp
sends stays exactly as clients expect it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from node_agent.child.ports import CHILD_HOST
from node_agent.core.model_state import USABLE, ModelState
from node_agent.redact import redact, redact_args
from node_agent.sources.preset_env import env_lines
from node_agent.sources.spec import SOURCE_CACHE

if TYPE_CHECKING:
    from node_agent.api.state import RouterSettings
    from node_agent.runtime.registry import Registry


class _Listed(Protocol):
    @property
    def name(self) -> str: ...
    @property
    def source(self) -> str: ...
    @property
    def aliases(self) -> tuple[str, ...]: ...
    @property
    def options(self) -> tuple[tuple[str, str | bool], ...]: ...
    @property
    def mmproj(self) -> str | None: ...
    @property
    def env(self) -> tuple[tuple[str, str], ...]: ...
    def argv(self) -> tuple[str, ...]: ...


def child_args(binary: str, spec: _Listed, port: int | None) -> list[str]:
    """The child's full command line, as llama.cpp lists it in ``status.args`` (secrets
    hidden)."""
    return redact_args(
        [
            binary,
            "--host",
            CHILD_HOST,
            "--port",
            str(port or 0),
            "--alias",
            spec.name,
            *spec.argv(),
        ]
    )


# A listing of 1,000 models redacted every model's command line and preset on every
# GET /models (half its time, issue 30): what an entry takes from its spec depends only on the
# spec, the binary and the port, so it is worked out once. Specs are frozen, and a reload makes
# new ones. Keyed by the spec's identity, not its value: hashing a spec (its options and
# environment) on every lookup was a tenth of a listing. Each entry holds its spec, so no other
# spec can take its id while the entry lives; the table starts over when full, and holds two
# entries a model at least (a fixed 4,096 made every listing of 10,000 models start it over:
# 877 ms of the loop a GET /models, issue 50 row 7).
_LISTED_CACHE = 4096


@dataclass(frozen=True, slots=True)
class _FromSpec:
    spec: _Listed  # kept: its id is the key
    args: tuple[str, ...]  # the child's command line, secrets hidden
    preset: str
    input_modalities: tuple[str, ...]


_listed: dict[tuple[int, str, int | None], _FromSpec] = {}


def _from_spec(binary: str, spec: _Listed, port: int | None, models: int) -> _FromSpec:
    key = (id(spec), binary, port)
    fixed = _listed.get(key)
    if fixed is None:
        if len(_listed) >= max(_LISTED_CACHE, 2 * models):
            _listed.clear()
        fixed = _listed[key] = _FromSpec(
            spec,
            tuple(child_args(binary, spec, port)),
            preset_text(spec),
            ("text", "image") if spec.mmproj else ("text",),
        )
    return fixed


def forget_listed() -> None:
    """Drop every entry worked out so far (after many models left: their specs go with it)."""
    _listed.clear()


def preset_text(spec: _Listed) -> str:
    """The model's merged preset as an INI section (llama.cpp's ``status.preset``)."""
    lines = [f"[{spec.name}]"]
    for key, value in sorted(spec.options):
        text = ("true" if value else "false") if isinstance(value, bool) else value
        lines.append(f"{key} = {text}")
    lines.extend(env_lines(spec.env))
    return redact("\n".join(lines) + "\n\n")


def model_entry(
    registry: Registry,
    name: str,
    binary: str,
    now: int,
    streams: bool | None = None,
) -> dict[str, Any]:
    """One entry of ``GET /models``, in the shape of ``models_schema.ModelEntry`` (the schema
    the operator parses with): keys left unset there are absent here, as llama.cpp sends them.

    A plain dict, not the schema's models: their validation and dump were half the time of a
    listing of 1,000 models (issue 30); tests/unit/test_views.py holds every kind of entry to
    the schema (parsed, and dumped back to the same JSON)."""
    spec: Any = registry.spec(name)
    view = registry.scheduler.view(name)
    child = registry.child(name)
    fixed = _from_spec(
        binary, spec, child.port if child is not None else None, len(registry.specs())
    )
    downloading = registry.downloads.active(name)  # a preset's file, before its load
    download_failed = registry.downloads.failed(name)
    status: dict[str, Any] = {
        "value": "downloading" if downloading else view.state.value,
        "args": list(fixed.args),
        "preset": fixed.preset,
    }
    if view.failed and view.state is ModelState.UNLOADED:
        status["exit_code"] = view.exit_code
        status["failed"] = True
    elif view.state is ModelState.UNLOADED and not downloading and download_failed:
        status["failed"] = True  # its file's download failed: the load did too
    # The child's last error line, why the agent's download of its file failed, or why the
    # ledger cannot estimate it (its GGUF header: issue 26, rows 6 and 8).
    error = view.error if view.failed else download_failed
    # Seconds until a model in crash-loop backoff may load again (the clock read only then).
    retry_in = (
        math.ceil(max(0.0, view.retry_at - registry.now()) * 10) / 10 if view.retry_at else 0.0
    )
    corral: dict[str, Any] = {
        "stopping": view.stopping,
        "in_flight": view.in_flight,
        "queued": view.queued,
        "pid": child.pid if child is not None else None,
        "error": None,
        "failures": view.failures,
        "retry_in": retry_in,
    }
    if registry.memory is not None:
        # Estimated off the loop beforehand (models_routes): one still on its way has none yet.
        corral["memory"] = registry.memory.figures(name)
        unestimated = registry.memory.unestimated(name)
        if error is None and unestimated is not None:
            error = f"cannot estimate its memory: {unestimated}"
    if error is not None:
        corral["error"] = redact(error)
    corral["conversation_streams"] = streams
    warm = registry.warm_held(name)
    if warm is not None:
        corral["warm"] = {"files": warm[0], "bytes": warm[1]}
    served = registry.preset_hash(name)
    if served is not None:
        corral["preset_hash"] = served
    entry: dict[str, Any] = {
        "id": name,
        "aliases": list(spec.aliases),
        "tags": [],
        "object": "model",
        "owned_by": "llamacpp",
        "created": now,
        "status": status,
        "architecture": {
            "input_modalities": list(fixed.input_modalities),
            "output_modalities": ["text"],
        },
        "source": spec.source,
        "can_remove": spec.source == SOURCE_CACHE,
    }
    # The child's ``ready`` payload is its whole model entry ({id, aliases, …, meta}); llama.cpp
    # lists only the inner ``meta`` (n_vocab, n_ctx, n_params, size…) under the model.
    if child is not None and view.state in USABLE:
        info = getattr(child, "meta", None)
        meta = info.get("meta") if isinstance(info, Mapping) else None
        if isinstance(meta, Mapping):
            entry["meta"] = dict(meta)
    entry["corral"] = corral
    return entry


def router_props(settings: RouterSettings) -> dict[str, Any]:
    """``GET /props`` without a model: the router's own properties (llama.cpp's keys)."""
    return {
        "role": "router",
        "max_instances": settings.models_max,
        "models_autoload": settings.models_autoload,
        "model_alias": "llama-server",
        "model_path": "none",
        "default_generation_settings": {"params": None, "n_ctx": 0},
        "ui_settings": {},
        "build_info": settings.build_info,
        "cors_proxy_enabled": settings.cors_proxy,
    }
