"""A crafted GGUF header is refused at once, not read by the billions (issue 16, row 17)."""

from __future__ import annotations

import re
import struct
from pathlib import Path

import pytest

from node_agent.memory.gguf_header import GgufError, read_header

U32, U64 = struct.Struct("<I"), struct.Struct("<Q")
HUGE = 1 << 62


def gguf(n_tensors: int, n_kv: int, body: bytes, padding: int = 1 << 20) -> bytes:
    # padding: a file of some size, which a reader without bounds would loop through
    return b"GGUF" + U32.pack(3) + U64.pack(n_tensors) + U64.pack(n_kv) + body + bytes(padding)


def string(text: str) -> bytes:
    return U64.pack(len(text)) + text.encode()


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (gguf(0, HUGE, b""), "claims 4611686018427387904 metadata keys"),
        (gguf(HUGE, 0, b""), "claims 4611686018427387904 tensors"),
        # a string array of 2^62 (empty) strings: 8 bytes each at least
        (gguf(0, 1, string("k") + U32.pack(9) + U32.pack(8) + U64.pack(HUGE)), "array items"),
        (gguf(0, 1, string("k") + U32.pack(9) + U32.pack(4) + U64.pack(HUGE)), "array items"),
        # a tensor with 2^32 - 1 dimensions
        (gguf(1, 0, string("t") + U32.pack(0xFFFFFFFF)), "dimensions (GGUF allows 4)"),
    ],
)
def test_crafted_counts_are_refused_at_once(data: bytes, message: str, tmp_path: Path) -> None:
    path = tmp_path / "crafted.gguf"
    path.write_bytes(data)
    # refused by the bound, before any loop over the file or allocation by the claimed count
    with pytest.raises(GgufError, match=re.escape(message)):
        read_header(path)
