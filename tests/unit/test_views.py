"""``GET /models`` entries (``api.views.model_entry``) held to the schema the operator parses
with (``models_schema.ModelEntry``): the entries are plain dicts (pydantic's validation and dump
were half a 1,000-model listing's time, issue 30), so every kind of entry is parsed with the
schema here and must dump back to the same JSON, keys and their order included."""

from __future__ import annotations

import copy
import itertools
import json
from dataclasses import dataclass, field
from typing import Any

from node_agent.api.views import model_entry
from node_agent.core.model_state import ModelState, ModelView
from node_agent.models_schema import ModelEntry, dump
from node_agent.sources.spec import SOURCE_CACHE, ModelSpec

FIGURES = {
    "min": {"host": 10},
    "max": {"host": 20},
    "effective": None,
    "held": {},
    "placement": {"devices": ["CUDA0"], "running": False, "env": {}, "context": 4096},
}


@dataclass
class Child:
    port: int = 41000
    pid: int = 4321
    meta: dict[str, Any] | None = None


@dataclass
class Downloads:
    active_for: bool = False
    failed_why: str | None = None

    def active(self, name: str) -> bool:
        return self.active_for

    def failed(self, name: str) -> str | None:
        return self.failed_why


@dataclass
class Memory:
    unestimated_why: str | None = None

    def figures(self, name: str) -> dict[str, Any]:
        return copy.deepcopy(FIGURES)

    def unestimated(self, name: str) -> str | None:
        return self.unestimated_why


@dataclass
class Scheduler:
    model: ModelView

    def view(self, name: str) -> ModelView:
        return self.model


@dataclass
class Registry:
    """What ``model_entry`` reads of the registry, each answer chosen by the test."""

    the_spec: ModelSpec
    scheduler: Scheduler
    the_child: Child | None = None
    downloads: Downloads = field(default_factory=Downloads)
    memory: Memory | None = None
    warm: tuple[int, int] | None = None
    hash: str | None = None

    def spec(self, name: str) -> ModelSpec:
        return self.the_spec

    def specs(self) -> dict[str, ModelSpec]:
        return {self.the_spec.name: self.the_spec}

    def child(self, name: str) -> Child | None:
        return self.the_child

    def now(self) -> float:
        return 100.0

    def warm_held(self, name: str) -> tuple[int, int] | None:
        return self.warm

    def preset_hash(self, name: str) -> str | None:
        return self.hash


def view(state: ModelState, *, failed: bool = False, retry_at: float = 0.0) -> ModelView:
    return ModelView(
        name="m",
        state=state,
        stopping=state is ModelState.LOADED and failed,
        in_flight=2 if state is ModelState.LOADED else 0,
        last_used=1.0,
        queued=1,
        failed=failed,
        exit_code=3 if failed else None,
        error="error: 401 from --hf-repo with Bearer hf_secretsecret1" if failed else None,
        failures=1 if failed else 0,
        retry_at=retry_at,
    )


SPECS = [
    ModelSpec(name="m", source="models_dir", options=(("model", "/m/m.gguf"),)),
    ModelSpec(
        name="m",
        source=SOURCE_CACHE,
        options=(("hf-repo", "org/repo"), ("mmproj", "/m/proj.gguf"), ("api-key", "sk-x")),
        aliases=("a", "b"),
    ),
]
CASES = list(
    itertools.product(
        SPECS,
        [
            view(ModelState.UNLOADED),
            view(ModelState.UNLOADED, failed=True, retry_at=102.34),
            view(ModelState.LOADING),
            view(ModelState.LOADED),
            view(ModelState.LOADED, failed=True),
            view(ModelState.SLEEPING),
        ],
        [None, Child(), Child(meta={"meta": {"n_ctx": 512, "size": 1}})],
        [Downloads(), Downloads(active_for=True), Downloads(failed_why="404 from the Hub")],
        [None, Memory(), Memory(unestimated_why="a header past its bounds")],
        [None, (2, 4096)],
        [None, "h1"],
        [None, True],
    )
)


def test_every_kind_of_entry_is_what_the_schema_parses_and_dumps() -> None:
    differ = []
    for spec, model, child, downloads, memory, warm, hash_, streams in CASES:
        registry: Any = Registry(spec, Scheduler(model), child, downloads, memory, warm, hash_)
        entry = model_entry(registry, "m", "/bin/llama-server", 1_700_000_000, streams)
        if json.dumps(dump(ModelEntry.model_validate(entry))) != json.dumps(entry):
            differ.append(entry)
    assert len(CASES) == 2592 and differ == []


def test_an_entry_says_what_llama_cpp_and_corral_say_of_the_model() -> None:
    """The values, for one failed model and one loaded one (the round trip above checks only
    the shape)."""
    spec = SPECS[1]
    failed = Registry(spec, Scheduler(view(ModelState.UNLOADED, failed=True, retry_at=102.34)))
    entry = model_entry(failed, "m", "/bin/llama-server", 7, None)  # type: ignore[arg-type]
    assert entry["status"]["exit_code"] == 3 and entry["status"]["failed"] is True
    assert entry["corral"]["retry_in"] == 2.4  # rounded up to a tenth
    assert "secretsecret" not in json.dumps(entry) and "sk-x" not in json.dumps(entry)
    assert entry["can_remove"] is True and entry["aliases"] == ["a", "b"]
    assert entry["architecture"]["input_modalities"] == ["text", "image"]
    loaded = Registry(
        spec,
        Scheduler(view(ModelState.LOADED)),
        Child(meta={"meta": {"n_ctx": 512}}),
        memory=Memory(unestimated_why="no header"),
        warm=(2, 4096),
        hash="h1",
    )
    entry = model_entry(loaded, "m", "/bin/llama-server", 7, True)  # type: ignore[arg-type]
    assert entry["status"]["value"] == "loaded" and "failed" not in entry["status"]
    assert entry["status"]["args"][:5] == [
        "/bin/llama-server",
        "--host",
        "127.0.0.1",
        "--port",
        "41000",
    ]
    assert entry["meta"] == {"n_ctx": 512} and entry["created"] == 7
    assert entry["corral"]["error"] == "cannot estimate its memory: no header"
    assert entry["corral"]["warm"] == {"files": 2, "bytes": 4096}
    assert (entry["corral"]["preset_hash"], entry["corral"]["in_flight"]) == ("h1", 2)
    assert entry["corral"]["memory"] == FIGURES and entry["corral"]["pid"] == 4321
