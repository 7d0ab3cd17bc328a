"""Automatic GPU placement on a fake 4-GPU machine, with real llama-server children on the CPU.

The GPUs are a fake behind the ``DeviceProbe`` seam (no GPU here): 24/24/12/80 GiB at 1/100
scale, so that the demo model's real estimates (83 MiB at 4096 cells…) fill them the way
8–28 GiB models fill real ones; CUDA3 has an external user holding 70 of its 80. The fake
reports, for each live child, the ledger's estimate on the GPUs that child was really told to
use: it reads ``CUDA_VISIBLE_DEVICES`` from the child's own ``/proc/PID/environ``, so a child
started on the wrong GPUs shows up on the wrong GPUs.

Acceptance 1 of issue 19: a scripted sequence of loads, the placement of each, the evictions,
each justified in the log and asserted; no eviction on a GPU the new model does not use.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Collection
from pathlib import Path
from typing import Any

import pytest

from node_agent.agent import child_config
from node_agent.child.logs import LogRing
from node_agent.child.process import ChildConfig, ChildProcess
from node_agent.child.state import ChildEvent
from node_agent.core.ledger import DeviceReading
from node_agent.memory.devices import CompositeProbe
from node_agent.runtime.memory_watch import MemoryWatch
from node_agent.runtime.registry import Registry
from node_agent.sources.spec import ModelSpec
from tests.integration.harness import alive
from tests.integration.test_status_page import CHROMIUM, CHROMIUM_ARGS
from tests.unit.fake_child import chat, fake_agent

pytestmark = pytest.mark.timeout(120)

SCALE = 100
GIB = 1 << 30
TOTALS = {"CUDA0": 24, "CUDA1": 24, "CUDA2": 12, "CUDA3": 80}  # GiB before scaling
EXTERNAL = {"CUDA3": 70}  # another user's process on CUDA3
MIB = 1 << 20
HAVE_CHROMIUM = Path(CHROMIUM).exists()


def scaled(gib: int) -> int:
    return gib * GIB // SCALE


class FakeGpus:
    """Four NVIDIA GPUs as NVML would report them, given which children run where."""

    def __init__(self) -> None:
        self.registry: Registry | None = None
        self.memory: MemoryWatch | None = None

    def _visible(self, pid: int) -> list[str]:
        try:
            environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:
            return []  # exited: it holds nothing
        for entry in environ:
            if entry.startswith(b"CUDA_VISIBLE_DEVICES="):
                value = entry.split(b"=", 1)[1].decode()
                return [f"CUDA{i}" for i in value.split(",") if i]
        return list(TOTALS)  # no variable: a CUDA child would see every GPU

    def _usage(self) -> dict[int, dict[str, int]]:
        usage: dict[int, dict[str, int]] = {}
        if self.registry is None or self.memory is None:
            return usage  # before the agent runs: no children
        for name in self.registry.specs():
            child = self.registry.child(name)
            pid = child.pid if child is not None else None
            if pid is None:
                continue
            need = self.memory.ledger.figures(name).min
            usage[pid] = {gpu: need.get(gpu, 0) for gpu in self._visible(pid)}
        return usage

    def read(self) -> list[DeviceReading]:
        used = {gpu: scaled(EXTERNAL.get(gpu, 0)) for gpu in TOTALS}
        for per_gpu in self._usage().values():
            for gpu, size in per_gpu.items():
                used[gpu] += size
        return [DeviceReading(g, scaled(t), scaled(t) - used[g]) for g, t in TOTALS.items()]

    def process_usage(self, pids: Collection[int]) -> dict[str, int]:
        out: dict[str, int] = {}
        for pid, per_gpu in self._usage().items():
            if pid in pids:
                for gpu, size in per_gpu.items():
                    if size:
                        out[gpu] = out.get(gpu, 0) + size
        return out


class RealChildren:
    """The registry's child factory: real llama-server processes, as the agent makes them."""

    def __init__(self, binary: str) -> None:
        self.binary = Path(binary)
        self.configs: dict[str, ChildConfig] = {}

    def factory(self, spec: ModelSpec, on_event: Callable[[ChildEvent], None]) -> ChildProcess:
        config = self.configs[spec.name] = child_config(spec, self.binary)
        return ChildProcess(config, on_event=on_event, logs=LogRing(200))


def model(name: str, path: Path, ctx: int | None, **extra: Any) -> ModelSpec:
    options: tuple[tuple[str, str | bool], ...] = (("model", str(path)),)
    if ctx is not None:
        options += (("ctx-size", str(ctx)),)
    return ModelSpec(name=name, source="preset", options=options, stop_timeout=5, **extra)


async def test_a_scripted_sequence_of_placements_and_evictions(
    demo_dir: Path, llama_server: str, caplog: pytest.LogCaptureFixture
) -> None:
    gguf = demo_dir / "demo-medium.gguf"
    gpus = FakeGpus()
    memory = MemoryWatch(margin_mib=2, limits={}, probe=CompositeProbe([gpus]))
    children = RealChildren(llama_server)
    specs = [
        model("a", gguf, None),  # 83 MiB at the 4096 cells the agent pins
        model("b", gguf, 4096),  # 83 MiB
        model("c", gguf, 16384),  # 167 MiB
        model("d", gguf, 16384, priority=1),  # 167 MiB, worth more than c
        model("e", gguf, 12288),  # 139 MiB
        model("f", gguf, 32768),  # 279 MiB: more than any GPU has
    ]
    caplog.set_level(logging.INFO, logger="corral")
    async with fake_agent(children, specs, models_max=0, memory=memory) as agent:
        gpus.registry, gpus.memory = agent.registry, memory

        async def ask(name: str) -> dict[str, Any]:
            async with agent.client.post(
                f"{agent.url}/v1/chat/completions", json=chat(name)
            ) as response:
                assert response.status == 200, await response.text()
            async with agent.client.get(f"{agent.url}/models") as response:
                models = {m["id"]: m for m in (await response.json())["data"]}
            return models

        def placement(models: dict[str, Any], name: str) -> dict[str, Any]:
            shown: dict[str, Any] = models[name]["corral"]["memory"]["placement"]
            assert shown["running"] is True
            return shown

        def running(models: dict[str, Any]) -> set[str]:
            return {n for n, m in models.items() if m["status"]["value"] == "loaded"}

        # Rooms (MiB, margin 2 off): CUDA0 243.8, CUDA1 243.8, CUDA2 120.9, CUDA3 100.4.
        models = await ask("a")
        assert placement(models, "a")["devices"] == ["CUDA3"]  # least waste: 17 MiB left
        assert placement(models, "a")["kind"] == "fits"
        assert placement(models, "a")["context"] == 4096
        assert children.configs["a"].env["CUDA_VISIBLE_DEVICES"] == "3"
        assert "--ctx-size" in children.configs["a"].args  # pinned: --fit picks no context

        models = await ask("b")
        assert placement(models, "b")["devices"] == ["CUDA2"]  # 37.9 left, CUDA3 is full
        models = await ask("c")
        assert placement(models, "c")["devices"] == ["CUDA0"]  # the first of two equals
        models = await ask("d")
        assert placement(models, "d")["devices"] == ["CUDA1"]
        assert running(models) == {"a", "b", "c", "d"}

        # e needs 139 MiB: no GPU has it. Evicting b (CUDA2) or a (CUDA3) would not make
        # room; c (CUDA0) or d (CUDA1) would, and c is worth less (priority 0 < 1).
        models = await ask("e")
        assert placement(models, "e")["devices"] == ["CUDA0"]
        assert running(models) == {"a", "b", "d", "e"}
        assert re.search(r"model=e: evicting c on CUDA0: .*fewest, least valuable", caplog.text)
        assert "model=e placed on CUDA0: CUDA0: fits with the least waste" in caplog.text
        evictions = re.findall(r"evicting model=(\w+)", caplog.text)
        assert evictions == ["c"]  # nothing on CUDA1, CUDA2 or CUDA3 was touched

        # f needs 279 MiB: more than any GPU, even emptied. With d unloaded it splits over
        # the two GPUs with the most room, in proportion to it; no eviction.
        async with agent.client.post(f"{agent.url}/models/unload", json={"model": "d"}) as r:
            assert r.status == 200
        models = await ask("f")  # waits for d's exit: no decision while a model is stopping
        shown = placement(models, "f")
        assert (shown["kind"], shown["devices"]) == ("split", ["CUDA1", "CUDA0"])
        assert shown["split"] == pytest.approx([0.7, 0.3], abs=0.01)
        assert children.configs["f"].env["CUDA_VISIBLE_DEVICES"] == "1,0"
        assert "--tensor-split" in children.configs["f"].args
        assert re.findall(r"evicting model=(\w+)", caplog.text) == ["c"]
        assert running(models) == {"a", "b", "e", "f"}
        # Every placement is justified in the log, in the order of the loads.
        placed = re.findall(r"model=(\w) placed on ([\w,]+): (\S+ \w+)", caplog.text)
        assert placed == [
            ("a", "CUDA3", "CUDA3: fits"),
            ("b", "CUDA2", "CUDA2: fits"),
            ("c", "CUDA0", "CUDA0: fits"),
            ("d", "CUDA1", "CUDA1: fits"),
            ("e", "CUDA0", "CUDA0: fits"),
            ("f", "CUDA1,CUDA0", "split CUDA1"),
        ]

        # What the fake GPUs show is what the ledger holds: nothing is over-committed.
        for reading in gpus.read():
            assert reading.free >= 0, reading
        held = {g: sum(memory.ledger.held(n).get(g, 0) for n in "abef") for g in TOTALS}
        assert (
            held["CUDA0"]
            == memory.ledger.figures("e").min["CUDA0"] + (memory.ledger.figures("f").min["CUDA0"])
        )
        for name in "abef":
            child = agent.registry.child(name)
            assert child is not None and child.pid is not None
            assert alive(child.pid)
        await status_page_shows(agent.url, {"a": "on CUDA3", "f": "on CUDA1 70% + CUDA0 30%"})


async def status_page_shows(url: str, expected: dict[str, str]) -> None:
    """The status page (/ui) in a real browser shows each model's placement."""
    if not HAVE_CHROMIUM:
        pytest.skip("chromium is not installed (hack/setup.sh installs it)")
    async_api = pytest.importorskip("playwright.async_api", reason="playwright is not installed")
    async with async_api.async_playwright() as playwright:
        browser = await playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            page = await browser.new_page()
            await page.goto(f"{url}/ui")
            for name, text in expected.items():
                cell = page.locator(f'#models tr[data-model="{name}"] .placement')
                await async_api.expect(cell).to_have_text(text)
        finally:
            await browser.close()
