"""A minimal GGUF header reader: metadata and the tensor-info table, never tensor data.

Why not gguf-py's ``GGUFReader``: it builds numpy views of every field and every tensor, which
costs ~10 ms a file; admission estimates a model's memory before each load and ``GET /models``
shows the figures for every model, so we parse only what the estimator needs. The file is
memory-mapped and the walk stops at the end of the tensor-info table, so only the header's
pages are touched (a 40 GB model costs the same as a 1 MB one).

Format (GGUF v2/v3, little-endian): magic ``GGUF``, u32 version, u64 tensor count, u64
metadata count, the metadata (key string, u32 type, value), then per tensor its name, u32
n_dims, u64 dims, u32 ggml type and u64 offset. Big arrays (the vocabulary) are skipped, only
their length is kept: the estimator needs ``n_vocab``, not the tokens.
"""

from __future__ import annotations

import mmap
import struct
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from node_agent.errors import CorralError
from node_agent.memory.ggml_types import BLOCKS


class GgufError(CorralError):
    """A file that is not a readable GGUF header."""


@dataclass(frozen=True)
class SkippedArray:
    """An array whose items were not kept (string and large arrays), or a string value too
    long to keep: its length."""

    length: int


MetaValue = int | float | bool | str | tuple[int | float | bool | str, ...] | SkippedArray


@dataclass(frozen=True)
class TensorInfo:
    name: str
    shape: tuple[int, ...]
    ggml_type: int

    @property
    def nbytes(self) -> int:
        """Bytes of the tensor's data, from its type's block size and block bytes."""
        elements = 1
        for dim in self.shape:
            elements *= dim
        block, size = BLOCKS[self.ggml_type]
        return elements // block * size


@dataclass(frozen=True)
class GgufHeader:
    version: int
    metadata: Mapping[str, MetaValue]
    tensors: tuple[TensorInfo, ...]


# Value type ids (gguf spec) → struct format of a scalar; 8 = string, 9 = array.
_SCALARS: dict[int, struct.Struct] = {
    0: struct.Struct("<B"),
    1: struct.Struct("<b"),
    2: struct.Struct("<H"),
    3: struct.Struct("<h"),
    4: struct.Struct("<I"),
    5: struct.Struct("<i"),
    6: struct.Struct("<f"),
    7: struct.Struct("<?"),
    10: struct.Struct("<Q"),
    11: struct.Struct("<q"),
    12: struct.Struct("<d"),
}
_STRING, _ARRAY = 8, 9
_U32 = struct.Struct("<I")
_U64 = struct.Struct("<Q")
# Numeric arrays up to this length are kept (per-layer head counts, SWA patterns); longer ones
# (token scores, types, merges) are skipped by length without decoding.
_KEEP_ARRAY = 4096
MAX_DIMS = 4  # ggml's GGML_MAX_DIMS
GGML_MAX_NAME = 64  # ggml's: a tensor's name and its NUL
# Metadata keys are short names; string values are kept up to this size (a chat template is
# tens of KB), longer ones skipped by length (only their length was ever needed).
_MAX_KEY = 64 * 1024
_KEEP_STRING = 1 << 20
DEFAULT_ALIGNMENT = 32  # GGUF_DEFAULT_ALIGNMENT: where the tensor data starts, and each tensor
_KNOWN_TYPES = frozenset(BLOCKS)
# How many items the walk handles between two looks at the clock (a look costs ~50 ns; a
# metadata key or tensor ~1 µs, a skipped string ~0.1 µs).
_CLOCK_EVERY = 1024
_CLOCK_EVERY_STRING = 65536


class _Cursor:
    __slots__ = ("buf", "clock", "deadline", "limit", "pos")

    def __init__(
        self,
        buf: mmap.mmap | bytes,
        time_limit: float | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.buf = buf
        self.pos = 0
        self.clock = clock
        self.limit = time_limit
        self.deadline = None if time_limit is None else clock() + time_limit

    def check_time(self) -> None:
        """Refuse a header that takes longer than its time bound to walk: the counts are
        bounded by the file's size, but a crafted file of a few GB still holds hundreds of
        millions of items."""
        if self.deadline is not None and self.clock() > self.deadline:
            raise GgufError(f"reading the header took longer than {self.limit:g} s")

    def u32(self) -> int:
        (value,) = _U32.unpack_from(self.buf, self.pos)
        self.pos += 4
        return int(value)

    def u64(self) -> int:
        (value,) = _U64.unpack_from(self.buf, self.pos)
        self.pos += 8
        return int(value)

    def string(self, limit: int | None = None, what: str = "string") -> str:
        """A string; longer than ``limit`` bytes is refused, before any copy or decoding."""
        length = self.u64()
        if limit is not None and length > limit:
            raise GgufError(f"a {what} of {length} bytes (at most {limit})")
        start = self.pos
        self.pos += length
        if self.pos > len(self.buf):
            raise GgufError("string runs past the end of the file")
        return bytes(self.buf[start : self.pos]).decode("utf-8", errors="replace")

    def text_value(self) -> MetaValue:
        """A string value; one past :data:`_KEEP_STRING` is skipped by length (a gigabyte one
        would be copied and decoded in one C call, holding the GIL: the loop's too)."""
        length = _U64.unpack_from(self.buf, self.pos)[0]
        if length <= _KEEP_STRING:
            return self.string()
        self.pos += 8 + length
        if self.pos > len(self.buf):
            raise GgufError("string runs past the end of the file")
        return SkippedArray(length)

    def count(self, what: str, min_bytes: int) -> int:
        """A u64 count of items of at least ``min_bytes`` each (see :meth:`room_for`)."""
        return self.room_for(self.u64(), what, min_bytes)

    def room_for(self, count: int, what: str, min_bytes: int) -> int:
        """``count``, refused when the rest of the file cannot hold that many items: a crafted
        header must not make us loop or allocate by the billions before the end of the file
        would stop us."""
        room = (len(self.buf) - self.pos) // min_bytes
        if count > room:
            raise GgufError(f"the header claims {count} {what}; the file has room for {room}")
        return count

    def skip_strings(self, count: int) -> None:
        buf, pos, unpack = self.buf, self.pos, _U64.unpack_from
        for i in range(count):
            pos += 8 + unpack(buf, pos)[0]
            if not i % _CLOCK_EVERY_STRING:
                self.check_time()
        self.pos = pos

    def value(self, vtype: int) -> MetaValue:
        if vtype == _STRING:
            return self.text_value()
        if vtype == _ARRAY:
            return self.array()
        fmt = _SCALARS.get(vtype)
        if fmt is None:
            raise GgufError(f"unknown metadata value type {vtype}")
        (value,) = fmt.unpack_from(self.buf, self.pos)
        self.pos += fmt.size
        return value  # type: ignore[no-any-return]

    def array(self) -> MetaValue:
        itype = self.u32()
        fmt = _SCALARS.get(itype)
        count = self.count("array items", 8 if itype == _STRING else fmt.size if fmt else 1)
        if itype == _STRING:
            self.skip_strings(count)
            return SkippedArray(count)
        if fmt is None:
            raise GgufError(f"unsupported array item type {itype}")
        if count > _KEEP_ARRAY:
            self.pos += count * fmt.size
            return SkippedArray(count)
        # One C call for the whole array (an item at a time was two thirds of a small model's
        # header walk: 1,000 demo models listed at start, issue 30).
        items = struct.unpack_from(f"<{count}{fmt.format[-1]}", self.buf, self.pos)
        self.pos += count * fmt.size
        return items


def read_header(
    path: Path, *, time_limit: float | None = None, clock: Callable[[], float] = time.monotonic
) -> GgufHeader:
    """Read a GGUF file's metadata and tensor-info table; raises :class:`GgufError`, also when
    the walk takes longer than ``time_limit`` seconds (``clock``'s)."""
    try:
        with open(path, "rb") as file, mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ) as buf:
            return _parse(_Cursor(buf, time_limit, clock))
    except (OSError, ValueError) as exc:  # ValueError: mmap of an empty file
        raise GgufError(f"{path}: cannot read GGUF header: {exc}") from exc
    except (struct.error, IndexError) as exc:
        raise GgufError(f"{path}: truncated GGUF header") from exc


def _parse(cur: _Cursor) -> GgufHeader:
    if cur.buf[:4] != b"GGUF":
        raise GgufError("not a GGUF file (bad magic)")
    cur.pos = 4
    version = cur.u32()
    if version not in (2, 3):
        raise GgufError(f"unsupported GGUF version {version}")
    n_tensors = cur.u64()
    # a key-value pair takes at least a key length, a type and a 1-byte value
    n_kv = cur.count("metadata keys", 8 + 4 + 1)
    metadata: dict[str, MetaValue] = {}
    for i in range(n_kv):
        if not i % _CLOCK_EVERY:
            cur.check_time()
        key = cur.string(_MAX_KEY, "metadata key")
        metadata[key] = cur.value(cur.u32())
    # a tensor's info takes at least a name length, n_dims, a type and an offset
    cur.room_for(n_tensors, "tensors", 8 + 4 + 4 + 8)
    tensors: list[TensorInfo] = []
    offsets: list[int] = []
    for i in range(n_tensors):
        if not i % _CLOCK_EVERY:
            cur.check_time()
        name = cur.string(GGML_MAX_NAME - 1, "tensor name")  # llama.cpp: "is too long"
        n_dims = cur.u32()
        if n_dims > MAX_DIMS:
            raise GgufError(
                f"tensor {name[:200]!r} has {n_dims} dimensions (GGUF allows {MAX_DIMS})"
            )
        shape = tuple(cur.u64() for _ in range(n_dims))
        ggml_type = cur.u32()
        if ggml_type not in _KNOWN_TYPES:  # llama.cpp: "tensor … has invalid ggml type"
            raise GgufError(f"tensor {name[:200]!r} has an unknown ggml type {ggml_type}")
        offsets.append(cur.u64())  # where its data lies (never read: only checked below)
        tensors.append(TensorInfo(name, shape, ggml_type))
    _check_data(tensors, offsets, metadata, cur.pos, len(cur.buf))
    return GgufHeader(version, metadata, tuple(tensors))


def _check_data(
    tensors: list[TensorInfo],
    offsets: list[int],
    metadata: Mapping[str, MetaValue],
    header_end: int,
    file_size: int,
) -> None:
    """Every tensor's data must lie inside the file (llama.cpp: "tensor data is not within the
    file bounds"): a header's dimensions are counts too, and a crafted one sized a model at
    exabytes, which made the ledger evict every idle model for it."""
    alignment = metadata.get("general.alignment", DEFAULT_ALIGNMENT)
    if not isinstance(alignment, int) or alignment <= 0 or alignment & (alignment - 1):
        raise GgufError(f"general.alignment {alignment!r} is not a power of two")
    room = file_size - -(-header_end // alignment) * alignment
    for tensor, offset in zip(tensors, offsets, strict=True):
        if offset + tensor.nbytes > room:
            raise GgufError(
                f"tensor {tensor.name[:200]!r}'s data is not within the file bounds: the file is "
                "corrupted or incomplete"
            )
