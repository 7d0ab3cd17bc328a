"""``GET /models`` entries as the real agent builds them (node_agent/api/views.py), for the
operator tests' fake agents: the same schema, the same keys, only the values are made up.
``tests/operator/test_real_agents.py`` checks the keys against a real agent's answer."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from node_agent.models_schema import (
    CorralInfo,
    Memory,
    ModelEntry,
    ModelList,
    ModelStatus,
    WarmCache,
    dump,
)


def model_entry(
    name: str,
    value: str = "loaded",
    *,
    exit_code: int | None = None,
    error: str | None = None,
    memory: Mapping[str, int] | None = None,
    preset_hash: str | None = None,
) -> dict[str, Any]:
    """One entry; ``exit_code`` makes it a failed one (``status.failed``, ``corral.error``)."""
    crash: dict[str, Any] = {}
    if exit_code is not None:
        crash = {"exit_code": exit_code, "failed": True}
    figures: dict[str, Any] = {}
    if memory is not None:
        figures["memory"] = Memory(
            min=dict(memory),
            max=dict(memory),
            effective=dict(memory),
            held=dict(memory),
            placement=None,  # the host only: nothing to place
        )
    entry = ModelEntry.model_validate(
        {
            "id": name,
            "aliases": [],
            "tags": [],
            "object": "model",
            "owned_by": "llamacpp",
            "created": 1_767_225_600,
            "status": ModelStatus.model_validate(
                {
                    "value": value,
                    "args": ["llama-server", "--alias", name],
                    "preset": f"[{name}]\n\n",
                    **crash,
                }
            ),
            "architecture": {"input_modalities": ["text"], "output_modalities": ["text"]},
            "source": "preset",
            "can_remove": False,
            "corral": CorralInfo(
                stopping=False,
                in_flight=0,
                queued=0,
                pid=None if value == "unloaded" else 4242,
                error=error if exit_code is not None else None,
                failures=1 if exit_code is not None else 0,
                retry_in=0.0,
                conversation_streams=None,  # no child of the binary asked yet
                preset_hash=preset_hash,
                warm=WarmCache(files=0, bytes=0),  # warm swaps are on by default
                **figures,
            ),
        }
    )
    return dump(entry)


def model_list(entries: list[dict[str, Any]]) -> dict[str, Any]:
    return dump(ModelList.model_validate({"object": "list", "data": entries}))
