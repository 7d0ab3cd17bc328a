"""The ledger's GGUF headers: one bad file is one model without an estimate, with its reason,
and headers are read and estimates made off the event loop, once per file version (issue 26,
rows 6 and 8).

With fake children and the real HTTP app (``fake_child.fake_agent``), so ``GET /models`` runs
exactly as in the agent.
"""

from __future__ import annotations

import asyncio
import math
import os
import time
from collections.abc import Callable
from pathlib import Path

import aiohttp
import gguf
import numpy as np
import pytest

from node_agent.memory.devices import CompositeProbe
from node_agent.memory.shape import ModelShape, VisionShape
from node_agent.memory.shape_cache import FileKey, ShapeCache, Unreadable, file_key, read_file
from node_agent.runtime.memory_watch import MemoryWatch
from tests.integration.model_attacks import crafted_gguf
from tests.unit.fake_child import Plan, fake_agent, spec

pytestmark = pytest.mark.timeout(30)
GIB = 1 << 30


def watch() -> MemoryWatch:
    return MemoryWatch(margin_mib=0, limits={"host": 8 * GIB}, probe=CompositeProbe([]))


def many_keys(path: Path, count: int) -> Path:
    """A valid header of ``count`` metadata keys and no model: slow to walk, quick to write."""
    key = b"\x01\x00\x00\x00\x00\x00\x00\x00k\x04\x00\x00\x00\x00\x00\x00\x00"
    path.write_bytes(b"GGUF\x03\x00\x00\x00" + bytes(8) + count.to_bytes(8, "little") + key * count)
    return path


async def test_one_bad_header_is_one_model_with_its_reason(tmp_path: Path) -> None:
    good = crafted_gguf(tmp_path / "good.gguf", block_count=1)
    inf = crafted_gguf(tmp_path / "inf.gguf", block_count=math.inf)
    huge = crafted_gguf(tmp_path / "huge.gguf", block_count=20_000_000)
    specs = [spec(p.stem, options=(("model", str(p)),)) for p in (good, inf, huge)]
    async with fake_agent(Plan(), specs, memory=watch()) as agent:
        for path in ("/models", "/v1/models"):
            start = time.monotonic()
            async with agent.client.get(agent.url + path) as response:
                assert response.status == 200, await response.text()
                body = await response.json()
            assert time.monotonic() - start < 2
        entries = {m["id"]: m["corral"] for m in body["data"]}
        assert entries["good"]["memory"]["min"]["host"] > 0
        assert entries["good"]["error"] is None
        assert "block_count must be a whole number, not inf" in entries["inf"]["error"]
        assert "block_count 20000000 is out of range" in entries["huge"]["error"]
        assert entries["huge"]["memory"]["min"] == {}


def wide_models(folder: Path) -> list[Path]:
    """Ten headers at llama.cpp's limits (512 layers, a trained context of 2^32 - 1): their
    estimates are ~0.2 s of arithmetic each."""
    return [
        crafted_gguf(
            folder / f"wide{i}.gguf",
            block_count=512,
            layer_tensors=512,
            extra={"context_length": 2**32 - 1 - i, "embedding_length": 2**20},
        )
        for i in range(10)
    ]


@pytest.mark.parametrize(
    "models",
    [
        # a header that takes a while to walk (~1 s: a million metadata keys)
        lambda folder: [many_keys(folder / "slow.gguf", 1_000_000)],
        wide_models,
    ],
    ids=["slow-header", "costly-estimates"],
)
async def test_headers_and_estimates_run_off_the_loop(
    tmp_path: Path, models: Callable[[Path], list[Path]]
) -> None:
    """Reading headers and estimating never holds the loop: /health answers quickly all
    along, and GET /models does not wait past its bound."""
    specs = [spec(p.stem, options=(("model", str(p)),)) for p in models(tmp_path)]
    memory = MemoryWatch(margin_mib=0, limits={"host": 1 << 60}, probe=CompositeProbe([]))
    async with fake_agent(Plan(), specs, memory=memory) as agent:
        listing = asyncio.ensure_future(agent.client.get(agent.url + "/models"))
        worst = 0.0
        while not listing.done():
            start = time.monotonic()
            async with (
                aiohttp.ClientSession() as other,  # a client of its own
                other.get(agent.url + "/health") as response,
            ):
                assert response.status == 200
            worst = max(worst, time.monotonic() - start)
            await asyncio.sleep(0.02)
        async with await listing as response:
            assert response.status == 200
        assert worst < 0.25


def test_headers_are_kept_per_file_version_and_bounded(tmp_path: Path) -> None:
    path = crafted_gguf(tmp_path / "m.gguf", block_count=1)
    key = file_key(str(path), "model")
    assert not isinstance(read_file(key), Unreadable)
    os.utime(path, ns=(1, 1))
    assert file_key(str(path), "model") != key  # a new version is read again
    cache = ShapeCache(limit=2)
    keys = [FileKey("model", f"/m{i}", 0, 0) for i in range(3)]
    for k in keys:
        cache.put(k, Unreadable("x"))
    assert len(cache) == 2
    assert cache.get(keys[0]) is None  # the least recently used went first
    assert cache.get(keys[2]) == Unreadable("x")


def test_an_unreadable_header_is_kept_with_its_reason(tmp_path: Path) -> None:
    path = crafted_gguf(tmp_path / "inf.gguf", block_count=math.inf)
    found = read_file(file_key(str(path), "model"))
    assert isinstance(found, Unreadable)
    assert "block_count must be a whole number" in found.reason
    memory = watch()
    model = spec("inf", options=(("model", str(path)),))
    memory.prepare(model)  # no OverflowError: the model has no estimate, and says why
    reason = memory.unestimated("inf")
    assert reason is not None and "block_count" in reason
    assert memory.figures("inf")["min"] == {}


class CountedShapes(ShapeCache):
    """A small shape cache that counts the headers read (each is put here once read)."""

    def __init__(self) -> None:
        super().__init__(limit=4)
        self.read: list[str] = []

    def put(self, key: FileKey, value: ModelShape | VisionShape | Unreadable) -> None:
        self.read.append(key.path)
        super().put(key, value)


async def test_a_catalog_larger_than_the_shape_cache_is_read_once(tmp_path: Path) -> None:
    """More models than the cache keeps shapes (1,000 of 512 in bench S6): every GET /models
    read every header again, the listing waited its whole bound for them each time, and half
    the models were never estimated (each read evicted a shape whose estimate was not made)."""
    paths = [crafted_gguf(tmp_path / f"m{i}.gguf", block_count=1) for i in range(10)]
    specs = [spec(p.stem, options=(("model", str(p)),)) for p in paths]
    shapes = CountedShapes()
    memory = MemoryWatch(
        margin_mib=0, limits={"host": 8 * GIB}, probe=CompositeProbe([]), shapes=shapes
    )
    await memory.prepare_off_loop(specs, wait=10)
    assert [s.name for s in specs if not memory.figures(s.name)["min"]] == []
    # A shape is kept for an estimate: one made is not read for again, even once evicted.
    for i in range(100):
        shapes.put(FileKey("model", f"/elsewhere{i}", 0, 0), Unreadable("not here"))
    await memory.prepare_off_loop(specs, wait=10)
    assert sorted(p for p in shapes.read if p.endswith(".gguf")) == sorted(map(str, paths))


def projector(path: Path, n_embd: int) -> Path:
    """A vision projector (``--mmproj``) whose weights grow with ``n_embd``."""
    writer = gguf.GGUFWriter(str(path), "clip")
    writer.add_uint32("clip.vision.patch_size", 14)
    writer.add_uint32("clip.vision.image_size", 224)
    writer.add_uint32("clip.vision.embedding_length", n_embd)
    writer.add_uint32("clip.vision.feed_forward_length", 4 * n_embd)
    writer.add_tensor("v.patch_embd.weight", np.zeros((n_embd, 588), np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


async def test_a_replaced_projector_is_estimated_again(tmp_path: Path) -> None:
    """The estimate was kept per model file and options: a projector replaced by a larger
    one left the model counted at the old one's size."""
    model = crafted_gguf(tmp_path / "m.gguf", block_count=1)
    mmproj = projector(tmp_path / "mmproj.gguf", 64)
    vision = spec("m", options=(("model", str(model)), ("mmproj", str(mmproj))))
    memory = watch()
    await memory.prepare_off_loop([vision], wait=10)
    before = memory.figures("m")["min"]["host"]
    projector(mmproj, 1024)
    await memory.prepare_off_loop([vision], wait=10)
    assert memory.figures("m")["min"]["host"] > before
