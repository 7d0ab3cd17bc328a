"""A GGUF header's counts are checked before anything is sized by them (issue 26, rows 6 and 8).

A 4 KB file claiming 20,000,000 layers made the shape reader build lists of 20 million items
and the estimator loop over them, on the event loop, for minutes; a float ``inf`` layer count
raised OverflowError, which no caller caught (``GET /models`` answered 500 for everyone).
llama.cpp refuses both: a count of the wrong type ("key … has wrong type") and more than
``LLAMA_MAX_LAYERS`` (512) layers.
"""

from __future__ import annotations

import math
import struct
import time
from pathlib import Path

import pytest

from node_agent.memory.gguf_header import GgufError, SkippedArray, read_header
from node_agent.memory.shape import MAX_LAYERS, read_shape
from tests.integration.model_attacks import crafted_gguf


def test_the_helper_writes_a_readable_header(tmp_path: Path) -> None:
    shape = read_shape(crafted_gguf(tmp_path / "ok.gguf", block_count=1))
    assert (shape.n_layer, shape.n_embd, shape.n_head) == (1, 64, 4)


def test_a_layer_count_past_llama_cpps_limit_is_refused_at_once(tmp_path: Path) -> None:
    path = crafted_gguf(tmp_path / "huge.gguf", block_count=20_000_000)
    start = time.monotonic()
    with pytest.raises(GgufError, match=r"block_count 20000000 .*at most 512"):
        read_shape(path)
    assert time.monotonic() - start < 0.5


def test_more_layers_than_the_file_has_tensors_is_refused(tmp_path: Path) -> None:
    # within llama.cpp's limit, but every layer has tensors and this file has one
    path = crafted_gguf(tmp_path / "hollow.gguf", block_count=MAX_LAYERS)
    with pytest.raises(GgufError, match=r"512 layers.*1 tensor"):
        read_shape(path)


def test_tensor_dimensions_beyond_the_file_are_refused(tmp_path: Path) -> None:
    """Dimensions are counts too: 2^40 x 2^20 floats in a 4 KB file sized the model at
    exabytes, so the ledger would evict every idle model for it (llama.cpp: "tensor data is
    not within the file bounds")."""
    path = crafted_gguf(tmp_path / "vast.gguf", dims=(1 << 40, 1 << 20))
    with pytest.raises(GgufError, match="data is not within the file bounds"):
        read_header(path)
    assert read_header(crafted_gguf(tmp_path / "ok.gguf")).tensors[0].nbytes == 64 * 8 * 4


INF, NAN = math.inf, math.nan


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"block_count": INF}, "block_count must be a whole number, not inf"),
        ({"block_count": NAN}, "block_count must be a whole number, not nan"),
        ({"block_count": 1.0}, "block_count must be a whole number, not 1.0"),
        ({"block_count": 0}, "block_count 0 is out of range"),
        ({"embedding_length": INF}, "embedding_length must be a whole number"),
        ({"attention.head_count": INF}, "head_count must be a whole number"),
        ({"attention.head_count_kv": NAN}, "head_count_kv must be a whole number"),
        ({"context_length": INF}, "context_length must be a whole number"),
        ({"feed_forward_length": INF}, "feed_forward_length must be a whole number"),
        ({"attention.sliding_window": INF}, "sliding_window must be a whole number"),
        ({"attention.key_length": INF}, "key_length must be a whole number"),
        ({"expert_used_count": INF}, "expert_used_count must be a whole number"),
        ({"ssm.conv_kernel": INF}, "conv_kernel must be a whole number"),
        ({"ssm.conv_kernel": 4, "ssm.state_size": INF}, "state_size must be a whole number"),
    ],
)
def test_a_count_that_is_not_a_whole_number_in_range_is_refused(
    tmp_path: Path, values: dict[str, int | float], message: str
) -> None:
    extra = dict(values)
    block_count = extra.pop("block_count", 1)
    path = crafted_gguf(tmp_path / "bad.gguf", block_count=block_count, extra=extra)
    with pytest.raises(GgufError, match=message):
        read_shape(path)


def test_reading_a_header_stops_at_its_time_bound(tmp_path: Path) -> None:
    """A large header (here 300,000 metadata keys) is read within a deadline or refused: the
    reader checks the clock as it goes, so it never runs unbounded in a worker either."""
    path = tmp_path / "many-keys.gguf"
    key = b"\x01\x00\x00\x00\x00\x00\x00\x00k\x04\x00\x00\x00\x00\x00\x00\x00"  # "k": u32 0
    count = 300_000
    path.write_bytes(b"GGUF\x03\x00\x00\x00" + bytes(8) + count.to_bytes(8, "little") + key * count)
    ticks = iter(range(10**9))
    with pytest.raises(GgufError, match="took longer than 2 s"):
        read_header(path, time_limit=2.0, clock=lambda: next(ticks) / 100)
    assert read_header(path).metadata == {"k": 0}


def _header(kvs: bytes, n_kv: int, tensors: bytes = b"", n_tensors: int = 0) -> bytes:
    u64 = struct.Struct("<Q").pack
    return b"GGUF" + struct.pack("<I", 3) + u64(n_tensors) + u64(n_kv) + kvs + tensors


def _str(data: bytes) -> bytes:
    return struct.pack("<Q", len(data)) + data


def test_long_strings_are_refused_or_skipped_before_any_copy(tmp_path: Path) -> None:
    """A string is copied and decoded in one C call that holds the GIL (the loop's too, even
    from a worker): a tensor name is at most llama.cpp's 63 bytes, a key 64 KiB, and a string
    value past 1 MiB is skipped by its length."""
    path = tmp_path / "long.gguf"
    name = _str(b"t" * 64) + struct.pack("<I", 1) + struct.pack("<Q", 1) + bytes(12)
    path.write_bytes(_header(b"", 0, name, 1) + bytes(64))
    with pytest.raises(GgufError, match="a tensor name of 64 bytes"):
        read_header(path)
    path.write_bytes(_header(_str(b"k" * 70_000) + struct.pack("<I", 4) + bytes(4), 1))
    with pytest.raises(GgufError, match="a metadata key of 70000 bytes"):
        read_header(path)
    big = _str(b"general.architecture") + struct.pack("<I", 8) + _str(b"x" * (2 << 20))
    path.write_bytes(_header(big, 1))
    assert read_header(path).metadata == {"general.architecture": SkippedArray(2 << 20)}
    with pytest.raises(GgufError, match=r"header lacks general\.architecture"):
        read_shape(path)
