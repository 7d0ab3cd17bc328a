"""What the agent does while it starts, for the loop's sake (issue 30, bench S6: 1,000 models):
no garbage collection until start-up is over, and a start-up file check that leaves the loop
the GIL."""

from __future__ import annotations

import asyncio
import gc
import itertools
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from node_agent import agent, binary_probe, cli, model_files, serve
from tests.integration.model_attacks import crafted_gguf
from tests.unit.fake_child import spec


@pytest.fixture
def collector_restored() -> Iterator[None]:
    yield
    gc.enable()


def test_the_collector_is_off_while_the_agent_starts(
    monkeypatch: pytest.MonkeyPatch, collector_restored: None
) -> None:
    """Two full collections walked what start-up made (37 ms before the agent listened, 59 ms
    in a GET /models just after): the agent runs with the collector off until it froze that,
    and an agent that ends before (a bad flag) leaves it on."""
    seen: list[bool] = []

    def serve_main(argv: Sequence[str], probe: Any) -> int:
        seen.append(gc.isenabled())
        return 2

    monkeypatch.setattr(binary_probe, "BinaryProbe", lambda argv, env: None)
    monkeypatch.setattr(serve, "main", serve_main)
    assert cli.main(["agent", "--port", "0"]) == 2
    assert seen == [False]
    assert gc.isenabled()


async def test_start_up_ends_with_the_collector_on_and_what_it_made_frozen(
    collector_restored: None,
) -> None:
    frozen = gc.get_freeze_count()
    gc.disable()
    await agent._import_then_freeze(["json"])
    assert gc.isenabled()
    assert gc.get_freeze_count() > frozen
    gc.disable()
    with pytest.raises(ModuleNotFoundError):  # even when an import fails
        await agent._import_then_freeze(["node_agent.no_such_module"])
    assert gc.isenabled()


def test_the_file_check_pauses_as_long_as_each_file_took(tmp_path: Path) -> None:
    """The walk holds the GIL; GET /models took twice as long while it ran at start."""
    good = crafted_gguf(tmp_path / "good.gguf")
    broken = tmp_path / "broken.gguf"
    broken.write_bytes(b"GGUF" + bytes(8))
    specs = [spec(p.stem, options=(("model", str(p)),)) for p in (good, broken)]
    ticks = iter([10.0, 10.25, 11.0, 11.5])
    pauses: list[float] = []
    warnings = model_files.check_model_files(specs, clock=lambda: next(ticks), pause=pauses.append)
    assert pauses == [0.25, 0.5]
    assert len(warnings) == 1
    assert warnings[0].startswith(f"model broken: its model file {broken} cannot be loaded")


def test_the_file_check_ends_with_its_task(tmp_path: Path) -> None:
    """The agent's shutdown cancels its tasks, and the process then waits for the threads
    they left (asyncio.run: the default executor): the check went on walking and pausing, as
    long again as its walks, after the agent had stopped (20 walks of 0.2 s: exit after
    4.3 s)."""
    paths = [crafted_gguf(tmp_path / f"m{i}.gguf") for i in range(20)]
    specs = [spec(p.stem, options=(("model", str(p)),)) for p in paths]
    ticks = itertools.count(step=0.2)  # each walk seems to take 0.2 s: each pause is 0.2 s

    async def start_then_stop() -> None:
        check = asyncio.create_task(
            model_files.log_model_file_problems(specs, clock=lambda: next(ticks))
        )
        await asyncio.sleep(0.1)
        check.cancel()

    started = time.monotonic()
    asyncio.run(start_then_stop())
    assert time.monotonic() - started < 1.5
