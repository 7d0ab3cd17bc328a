"""MemoryWatch with automatic placement: which models it places, how their children start, and
how the ledger and ``--fit`` work together (memory.placing's docstring)."""

from __future__ import annotations

import logging
from collections.abc import Collection
from pathlib import Path

import pytest

from node_agent.core.ledger import DeviceReading
from node_agent.memory.devices import CompositeProbe
from node_agent.runtime.memory_watch import MemoryWatch
from node_agent.sources.spec import ModelSpec
from tests.unit.test_estimator import write_gguf

MIB = 1 << 20


class Gpus:
    """GPUs with a fixed amount free (what the ledger's own children hold is not modelled)."""

    def __init__(self, **free_mib: int) -> None:
        self.free = free_mib

    def read(self) -> list[DeviceReading]:
        return [DeviceReading(n, 1024 * MIB, f * MIB) for n, f in self.free.items()]

    def process_usage(self, pids: Collection[int]) -> dict[str, int]:
        return {}


@pytest.fixture
def gguf(tmp_path: Path) -> Path:
    return write_gguf(tmp_path / "m.gguf", n_layer=4, n_embd=256, n_head=8)


def watch(**free_mib: int) -> MemoryWatch:
    memory = MemoryWatch(margin_mib=1, limits={}, probe=CompositeProbe([Gpus(**free_mib)]))
    memory.refresh()
    return memory


def spec(name: str, path: Path, *options: tuple[str, str | bool], **extra: object) -> ModelSpec:
    return ModelSpec(name, "preset", (("model", str(path)), *options), **extra)  # type: ignore[arg-type]


def test_an_unpinned_model_starts_on_the_chosen_gpu_with_its_context_pinned(gguf: Path) -> None:
    memory = watch(CUDA0=900, CUDA1=300)
    model = spec("m", gguf)
    memory.prepare(model)
    placed = memory.placed(model)
    env = dict(placed.env)
    assert env["CUDA_VISIBLE_DEVICES"] == "1"  # the smaller room that fits: least waste
    assert env["GGML_VK_VISIBLE_DEVICES"] == "1"
    argv = placed.argv()
    # --fit would size the context to all the GPU has free; the agent pins what it admitted.
    assert argv[argv.index("--ctx-size") + 1] == "2048"  # min(4096, the trained 2048)
    memory.spawned("m")
    held = memory.ledger.held("m")
    assert set(held) <= {"host", "CUDA1"} and held["CUDA1"] > 0
    figures = memory.figures("m")
    assert figures["max"] == figures["min"]  # nothing left for --fit to grow into
    assert figures["placement"]["devices"] == ["CUDA1"]
    assert figures["placement"]["running"] is True
    memory.unloaded("m")
    assert memory.figures("m")["placement"]["running"] is False


def test_a_preset_context_is_kept(gguf: Path) -> None:
    memory = watch(CUDA0=900)
    model = spec("m", gguf, ("ctx-size", "1024"))
    memory.prepare(model)
    argv = memory.placed(model).argv()
    assert argv.count("--ctx-size") == 1
    assert argv[argv.index("--ctx-size") + 1] == "1024"


@pytest.mark.parametrize(
    ("options", "env"),
    [
        ((("device", "CUDA1"),), ()),
        ((("main-gpu", "1"),), ()),
        ((("tensor-split", "1,1"),), ()),
        ((("split-mode", "none"),), ()),
        ((("n-gpu-layers", "0"),), ()),
        ((), (("CUDA_VISIBLE_DEVICES", "1"),)),
    ],
)
def test_a_model_that_chooses_its_devices_is_not_placed(
    gguf: Path, options: tuple[tuple[str, str], ...], env: tuple[tuple[str, str], ...]
) -> None:
    memory = watch(CUDA0=900, CUDA1=300)
    model = spec("m", gguf, *options, env=env)
    memory.prepare(model)
    assert memory.placed(model) == model
    assert memory.figures("m")["placement"] is None


def test_without_gpus_nothing_is_placed(gguf: Path) -> None:
    memory = MemoryWatch(margin_mib=0, limits={"host": 512 * MIB}, probe=CompositeProbe([]))
    model = spec("m", gguf)
    memory.prepare(model)
    assert memory.placed(model) == model


def test_a_split_gets_its_tensor_split_in_the_order_of_the_visible_gpus(gguf: Path) -> None:
    memory = watch(CUDA0=12, CUDA1=13, CUDA2=3)  # MiB: it needs 13.1 on one GPU alone
    model = spec("m", gguf, ("ctx-size", "2048"))
    memory.prepare(model)
    placed = memory.placed(model)
    plan = memory.figures("m")["placement"]
    assert (plan["kind"], plan["devices"]) == ("split", ["CUDA1", "CUDA0"]), plan
    assert dict(placed.env)["CUDA_VISIBLE_DEVICES"] == ",".join(
        d.removeprefix("CUDA") for d in plan["devices"]
    )
    argv = placed.argv()
    fractions = [float(x) for x in argv[argv.index("--tensor-split") + 1].split(",")]
    assert fractions == pytest.approx(plan["split"], abs=1e-3)


def test_evictions_are_chosen_on_one_gpu_and_justified(
    gguf: Path, caplog: pytest.LogCaptureFixture
) -> None:
    memory = watch(CUDA0=900, CUDA1=900)
    for name in ("x", "y"):
        memory.prepare(spec(name, gguf, ("ctx-size", "2048")))
    memory.placed(spec("x", gguf, ("ctx-size", "2048")))
    memory.spawned("x")
    # Both GPUs fill up from outside; y only fits where x can go.
    need = memory.ledger.held("x")["CUDA0"]
    memory.probe = CompositeProbe([Gpus(CUDA0=need // MIB, CUDA1=need // MIB // 2)])
    memory.refresh()
    assert memory.shortfall("y", ["x"])
    assert memory.pick_victim("y", ["x"]) == "x"
    with caplog.at_level(logging.INFO, logger="corral"):
        memory.explain_eviction("y", "x")  # the owner, as it carries out the eviction
    assert "model=y: evicting x on CUDA0: CUDA0: no GPU has room" in caplog.text
