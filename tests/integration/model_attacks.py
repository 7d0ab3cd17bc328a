"""Model files and hub listings an attacker crafts (issue 26, rows 6, 8 and 12).

Used by the unit and integration tests and by ``hack/attack-figures.py``. Written byte by byte
(no gguf-py): a writer library refuses most of what an attacker can put in a header.
"""

from __future__ import annotations

import struct
from pathlib import Path

_U32, _U64 = struct.Struct("<I"), struct.Struct("<Q")
U32_TYPE, F32_TYPE, STRING_TYPE, ARRAY_TYPE, F64_TYPE = 4, 6, 8, 9, 12
# The memory ledger on (it reads every model's header for GET /models), with a host budget.
LEDGER = ("--models-memory-margin", "0", "--memory-limit", "host=4GiB", "-c", "512")


def _string(text: str) -> bytes:
    data = text.encode()
    return _U64.pack(len(data)) + data


def _kv(key: str, vtype: int, value: bytes) -> bytes:
    return _string(key) + _U32.pack(vtype) + value


def crafted_gguf(
    path: Path,
    *,
    block_count: int | float = 2,
    size: int = 4096,
    extra: dict[str, int | float] | None = None,
    dims: tuple[int, int] = (64, 8),
    layer_tensors: int = 0,
    tokens: int = 0,
) -> Path:
    """A ``size``-byte llama GGUF whose header claims ``block_count`` layers (an int is written
    as u32, a float as f64); ``extra`` adds ``llama.<key>`` values the same way. One F32 tensor,
    ``token_embd.weight`` of ``dims`` (64 x 8), then ``layer_tensors`` layers of one F32 norm
    each (``blk.N.attn_norm.weight``, 64 wide), and zeros to ``size`` (at least what the
    tensors take). ``tokens``: a ``tokenizer.ggml.tokens`` array of that many strings (a
    header of megabytes, as a large vocabulary makes)."""
    values: dict[str, int | float] = {
        "block_count": block_count,
        "embedding_length": 64,
        "attention.head_count": 4,
        "context_length": 256,
        **(extra or {}),
    }
    kvs = [_kv("general.architecture", STRING_TYPE, _string("llama"))]
    for key, value in values.items():
        if isinstance(value, float):
            kvs.append(_kv(f"llama.{key}", F64_TYPE, struct.pack("<d", value)))
        else:
            kvs.append(_kv(f"llama.{key}", U32_TYPE, _U32.pack(value)))
    if tokens:
        words = b"".join(_string(f"token-{i:07d}") for i in range(tokens))
        array = _U32.pack(STRING_TYPE) + _U64.pack(tokens) + words
        kvs.append(_kv("tokenizer.ggml.tokens", ARRAY_TYPE, array))
    tensor = _string("token_embd.weight") + _U32.pack(2) + _U64.pack(dims[0]) + _U64.pack(dims[1])
    tensor += _U32.pack(0) + _U64.pack(0)  # F32, data at offset 0
    offset = -(-dims[0] * dims[1] * 4 // 32) * 32
    layers = []
    for il in range(layer_tensors):
        layers.append(_string(f"blk.{il}.attn_norm.weight") + _U32.pack(1) + _U64.pack(64))
        layers.append(_U32.pack(0) + _U64.pack(offset))
        offset += 256
    tensor += b"".join(layers)
    n_tensors = 1 + layer_tensors
    head = b"GGUF" + _U32.pack(3) + _U64.pack(n_tensors) + _U64.pack(len(kvs)) + b"".join(kvs)
    head += tensor
    data_start = -(-len(head) // 32) * 32
    layers_end = data_start - len(head) + offset if layer_tensors else 0
    path.write_bytes(head + bytes(max(0, size - len(head), layers_end)))
    return path
