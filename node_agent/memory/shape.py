"""A model's shape as the estimator needs it, taken from its GGUF header.

Only the numbers that size llama.cpp's buffers: layers, widths, KV heads per layer, the
sliding-window layers, vocabulary, trained context, each tensor's bytes and layer, and the
copies an AMX CPU would make of them (``cpu_repack.py``).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from node_agent.memory.cpu_repack import amx_copy_bytes
from node_agent.memory.gguf_header import (
    GgufError,
    GgufHeader,
    MetaValue,
    SkippedArray,
    TensorInfo,
    read_header,
)

# Where an architecture interleaves sliding-window and full layers without saying so in the
# header, llama.cpp hard-codes the period (llama-model.cpp, ``set_swa_pattern``): in every
# period the last layer is full attention, the others slide.
_SWA_PERIOD = {"gemma2": 2, "gemma3": 6, "cohere2": 4, "gpt-oss": 2, "exaone4": 4}

# Tensors of no layer that llama.cpp keeps with the input (host), not with the output layer.
_INPUT_TENSORS = ("token_embd.", "token_types.", "position_embd.")
_LAYER = re.compile(r"^blk\.(\d+)\.")


@dataclass(frozen=True)
class ModelShape:
    arch: str
    n_layer: int
    n_embd: int
    n_ff: int
    n_head: int
    n_vocab: int
    n_ctx_train: int
    kv_heads: tuple[int, ...]  # per layer: 0 for a layer without attention (recurrent)
    head_dim_k: int
    head_dim_v: int
    n_swa: int  # sliding window in tokens, 0 when the model has none
    swa_layers: tuple[bool, ...]
    input_bytes: int  # token embeddings: always on the host
    output_bytes: int  # output norm and head: the "output layer"
    layer_bytes: tuple[int, ...]
    # The CPU backend's AMX copies (cpu_repack.py), where the weights stay on a host with AMX:
    layer_amx: tuple[int, ...] = ()
    output_amx: int = 0  # the head's copy (token_embd's, for a tied head)
    # File bytes at the ends of the mapped range that only hold copied weights: the mapping
    # (``CPU_Mapped``) is the span from the first to the last tensor still read from it.
    amx_unmapped: int = 0

    @property
    def weight_bytes(self) -> int:
        return self.input_bytes + self.output_bytes + sum(self.layer_bytes)


def read_shape(path: Path) -> ModelShape:
    """Read ``path``'s header into a :class:`ModelShape`; raises :class:`GgufError`."""
    return shape_from_header(read_header(path), str(path))


def shape_from_header(header: GgufHeader, where: str = "model") -> ModelShape:
    meta = header.metadata
    arch = _text(meta, "general.architecture", where)

    def key(name: str) -> MetaValue | None:
        return meta.get(f"{arch}.{name}")

    n_layer = _int(key("block_count"), "block_count", where)
    n_embd = _int(key("embedding_length"), "embedding_length", where)
    n_head = max(_per_layer(key("attention.head_count"), n_layer, 1))
    kv_raw = key("attention.head_count_kv")
    kv_heads = _per_layer(kv_raw if kv_raw is not None else n_head, n_layer, n_head)
    head_dim = n_embd // n_head if n_head else 0
    n_swa = _int(key("attention.sliding_window"), "sliding_window", where, default=0)

    input_bytes = output_bytes = 0
    layer_bytes = [0] * n_layer
    n_vocab = 0
    layer_amx = [0] * n_layer
    output_amx = 0
    copied: list[int] = []  # per tensor in file order: its AMX copy's bytes
    for tensor in header.tensors:
        amx = amx_copy_bytes(tensor)
        copied.append(amx)
        match = _LAYER.match(tensor.name)
        if match and int(match.group(1)) < n_layer:
            layer_bytes[int(match.group(1))] += tensor.nbytes
            layer_amx[int(match.group(1))] += amx
        elif tensor.name.startswith(_INPUT_TENSORS):
            input_bytes += tensor.nbytes
            if tensor.name == "token_embd.weight" and len(tensor.shape) == 2:
                n_vocab = tensor.shape[1]
        else:
            output_bytes += tensor.nbytes
            output_amx += amx
    names = {t.name for t in header.tensors}
    if "output.weight" not in names:  # a tied head multiplies by the token embeddings
        embd = next((t for t in header.tensors if t.name == "token_embd.weight"), None)
        output_amx += amx_copy_bytes(embd, as_output_head=True) if embd else 0
    tokens = meta.get("tokenizer.ggml.tokens")
    if isinstance(tokens, SkippedArray):
        n_vocab = tokens.length
    return ModelShape(
        arch=arch,
        n_layer=n_layer,
        n_embd=n_embd,
        n_ff=max(_per_layer(key("feed_forward_length"), n_layer, 4 * n_embd)),
        n_head=n_head,
        n_vocab=n_vocab,
        n_ctx_train=_int(key("context_length"), "context_length", where, default=4096),
        kv_heads=tuple(kv_heads),
        head_dim_k=_int(key("attention.key_length"), "key_length", where, default=head_dim),
        head_dim_v=_int(key("attention.value_length"), "value_length", where, default=head_dim),
        n_swa=n_swa,
        swa_layers=_swa_layers(arch, key("attention.sliding_window_pattern"), n_layer, n_swa),
        input_bytes=input_bytes,
        output_bytes=output_bytes,
        layer_bytes=tuple(layer_bytes),
        layer_amx=tuple(layer_amx),
        output_amx=output_amx,
        amx_unmapped=_unmapped_ends(header.tensors, copied),
    )


def _unmapped_ends(tensors: Sequence[TensorInfo], copied: Sequence[int]) -> int:
    """Bytes of the leading and trailing runs of tensors that are all copied (see above)."""
    kept = [i for i, amx in enumerate(copied) if not amx]
    if not kept:
        return sum(t.nbytes for t in tensors)
    return sum(t.nbytes for t in tensors[: kept[0]]) + sum(
        t.nbytes for t in tensors[kept[-1] + 1 :]
    )


def _swa_layers(arch: str, pattern: MetaValue | None, n_layer: int, n_swa: int) -> tuple[bool, ...]:
    if n_swa <= 0:
        return (False,) * n_layer
    if isinstance(pattern, tuple) and len(pattern) == n_layer:  # one flag per layer
        return tuple(bool(flag) for flag in pattern)
    period = pattern if isinstance(pattern, int) and not isinstance(pattern, bool) else None
    period = period or _SWA_PERIOD.get(arch)
    if not period:
        # Unknown layout: count every layer as full attention. That overestimates the KV
        # cache, which only makes the ledger evict a little early, never OOM.
        return (False,) * n_layer
    return tuple(il % period < period - 1 for il in range(n_layer))


def _per_layer(value: MetaValue | None, n_layer: int, default: int) -> list[int]:
    if isinstance(value, tuple) and len(value) == n_layer:
        return [int(v) for v in value]
    if isinstance(value, int | float) and not isinstance(value, bool):
        return [int(value)] * n_layer
    return [default] * n_layer


def _int(value: MetaValue | None, name: str, where: str, default: int | None = None) -> int:
    if isinstance(value, int | float) and not isinstance(value, bool):
        return int(value)
    if isinstance(value, tuple) and value and all(isinstance(v, int | float) for v in value):
        return int(max(value))
    if default is None:
        raise GgufError(f"{where}: header lacks {name}")
    return default


def _text(meta: Mapping[str, MetaValue], name: str, where: str) -> str:
    value = meta.get(name)
    if not isinstance(value, str):
        raise GgufError(f"{where}: header lacks {name}")
    return value
