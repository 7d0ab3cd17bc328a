"""The one schema of ``GET /models``: the agent's answer has its shape (``api.views`` builds
plain dicts, for speed; tests/unit/test_views.py holds every kind of entry to this schema), the
operator (and any client) parses with it.

The keys and types are llama.cpp's router's (``{"object": "list", "data": [{id, aliases, tags,
object, owned_by, created, status: {value, args, preset, failed?, exit_code?}, architecture,
source, can_remove, meta?}]}``); Corral's own figures sit under one extra ``corral`` key per
model, so a client written for llama.cpp sees nothing it does not know. Optional keys are absent
(not null) when they do not apply, as llama.cpp sends them: serialise with :func:`dump`, which
leaves out what was never set.

A leaf module: pydantic only, so the operator can import it without the agent's runtime.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, ValidationError

State = Literal["unloaded", "loading", "loaded", "sleeping", "downloading"]


class _Schema(BaseModel):
    # Unknown keys are ignored when parsing (a newer agent, or llama.cpp's own router, may send
    # more); the agent only ever builds these models from its own fields.
    model_config = ConfigDict(frozen=True, extra="ignore")


class ModelStatus(_Schema):
    value: State
    args: list[str]
    preset: str | None = None  # the merged preset as an INI section (absent from b10434)
    exit_code: int | None = None  # only after a crash or a failed load, with ``failed``
    failed: bool | None = None


class Memory(_Schema):
    """The ledger's figures for one model, bytes per device (``host``, ``CUDA0``…)."""

    min: dict[str, int]
    max: dict[str, int] | None
    effective: dict[str, int] | None
    held: dict[str, int]
    # Where the ledger placed it (automatic GPU placement), None when it does not place it.
    placement: dict[str, Any] | None = None


class WarmCache(_Schema):
    """A model's prompt caches saved for its next load (warm swaps)."""

    files: int
    bytes: int


class CorralInfo(_Schema):
    """Corral's own per-model figures (absent from llama.cpp's router)."""

    stopping: bool
    in_flight: int
    queued: int
    pid: int | None
    # The child's own last error line while the model is failed; else why its download failed,
    # or why the ledger cannot estimate it (an unreadable or implausible GGUF header).
    error: str | None
    failures: int
    retry_in: float  # seconds until a model in crash-loop backoff may load again
    memory: Memory | None = None  # only with the memory ledger on
    # Whether the binary's children keep conversation sessions (``/v1/stream``); None until a
    # child of it answered a stream route.
    conversation_streams: bool | None = None
    # Warm swaps: its saved prompt caches (absent when warm swaps are off, or do not apply).
    warm: WarmCache | None = None
    # Which version of its preset section it serves (the running child's, else the next
    # load's); absent without a preset section. The operator's Ready waits for it.
    preset_hash: str | None = None


class ModelEntry(_Schema):
    id: str
    aliases: list[str]
    tags: list[str]
    object: Literal["model"]
    owned_by: str
    created: int
    status: ModelStatus
    architecture: dict[str, Any]
    source: str
    can_remove: bool
    meta: dict[str, Any] | None = None  # the child's model info, while loaded or sleeping
    corral: CorralInfo | None = None


class RefusedPreset(_Schema):
    """Corral: a preset the agent refused alone (a restricted one that broke a rule); the
    node's other models are served. Listed under ``refused``, absent when there is none."""

    origin: str  # file:line
    reason: str
    models: list[str]  # the model names its sections claimed


class ModelList(_Schema):
    object: Literal["list"]
    data: list[ModelEntry]
    refused: list[RefusedPreset] | None = None


def dump(model: BaseModel) -> dict[str, Any]:
    """The JSON object for ``model``: keys never set are left out (llama.cpp's optional keys)."""
    return model.model_dump(mode="json", exclude_unset=True)


def parse_entries(body: object) -> tuple[dict[str, ModelEntry], list[str]]:
    """A ``GET /models`` body → its entries by id, and why each malformed entry was skipped.

    One odd entry must not blank the status of a node's other models, so entries are checked
    one by one; a body that is not a model list at all raises ValueError.
    """
    if not isinstance(body, dict) or body.get("object") != "list":
        raise ValueError("not a model list (expected {'object': 'list', 'data': [...]})")
    data = body.get("data")
    if not isinstance(data, list):
        raise ValueError("not a model list ('data' is not an array)")
    entries: dict[str, ModelEntry] = {}
    skipped: list[str] = []
    for raw in data:
        try:
            entry = ModelEntry.model_validate(raw)
        except ValidationError as exc:
            name = raw.get("id") if isinstance(raw, dict) else None
            skipped.append(f"model {name!r}: {exc.errors()[0]['msg']}")
            continue
        entries[entry.id] = entry
    return entries, skipped
