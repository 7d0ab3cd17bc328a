"""A model's shape as the estimator needs it, taken from its GGUF header.

Only the numbers that size llama.cpp's buffers: layers, widths, KV heads per layer, the
sliding-window layers, vocabulary, trained context and each tensor's bytes and layer.

Every count is checked before anything is sized by it, as llama.cpp's loader checks them: a
whole number (a float, even ``inf``, is "the wrong type"), within what llama.cpp reads it as
(``uint32``), and at most ``LLAMA_MAX_LAYERS`` layers, each with a tensor in the file. A 4 KB
file claiming 20 million layers once had the agent build lists of 20 million items and loop
over them for minutes (issue 26, row 6); an ``inf`` raised OverflowError (row 8).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

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
# llama.cpp's LLAMA_MAX_LAYERS (src/llama-hparams.h): its loader asserts n_layer <= 512.
MAX_LAYERS = 512
# The widths and counts llama.cpp reads as uint32.
MAX_COUNT = 0xFFFFFFFF
_LAYER = re.compile(r"^blk\.(\d+)\.")

# Recurrent state (llama-memory-recurrent.cpp): every layer of these, none of plain models.
_RECURRENT = frozenset({"mamba", "mamba2"})
# Hybrids that interleave: every ``full_attention_interval``-th layer attends, the others
# are gated delta nets (llama.cpp's default interval: 4).
_INTERVAL_HYBRIDS = frozenset({"qwen3next", "qwen35", "qwen35moe"})

# ggml-cpu's AMX buffer (amx/amx.cpp ``supports_op``, amx/mmq.cpp ``get_row_size``): on CPUs
# with AMX, llama.cpp copies each 2-D matmul weight of these types into it, the mapped file
# staying as it is. Per type: the alignment its input width needs and the bytes each of its
# blocks grows by (Q8_0 carries an int32 compensation, K-quants and IQ4_XS unpacked scales).
_AMX_TYPES = {
    GGMLQuantizationType.F16: (16, 0),
    GGMLQuantizationType.Q4_0: (32, 0),
    GGMLQuantizationType.Q4_1: (32, 0),
    GGMLQuantizationType.Q8_0: (32, 4),
    GGMLQuantizationType.Q4_K: (256, 4),
    GGMLQuantizationType.Q5_K: (256, 4),
    GGMLQuantizationType.Q6_K: (256, 0),
    GGMLQuantizationType.IQ4_XS: (256, 2),
}
# 2-D weights that feed no matmul: row lookups and convolutions.
_NOT_MATMUL_NAME = re.compile(
    r"^(token_embd|token_types|position_embd)\.|ssm_conv1d|shortconv\.conv"
)


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
    # Recurrent state bytes per sequence and layer (f32 conv + SSM state; 0: attention).
    recurrent_bytes: tuple[int, ...] = ()
    # The copies llama.cpp makes in the CPU's AMX buffer, per layer and of the output head.
    amx_layer_bytes: tuple[int, ...] = ()
    amx_output_bytes: int = 0
    # File bytes llama.cpp unmaps when AMX holds them: the leading and trailing runs of
    # tensors that live only in the AMX buffer (it unmaps the file outside the mapped span).
    amx_unmapped_bytes: int = 0
    # Multi-head latent attention: the cache holds the latent only, V is a view of K.
    mla: bool = False
    # Width of the widest SSM input projection (0 without SSM layers): the scan's live rows.
    ssm_in_width: int = 0

    @property
    def weight_bytes(self) -> int:
        return self.input_bytes + self.output_bytes + sum(self.layer_bytes)


@dataclass(frozen=True)
class VisionShape:
    """A vision projector (``--mmproj``) as the estimator needs it."""

    weight_bytes: int
    n_patches: int  # of the largest image: (image_size / patch_size)^2
    patch_size: int
    n_embd: int
    n_ff: int


def read_vision_shape(path: Path) -> VisionShape:
    """Read a projector's header (``general.architecture`` clip); raises :class:`GgufError`."""
    return vision_from_header(read_header(path), str(path))


def vision_from_header(header: GgufHeader, where: str = "projector") -> VisionShape:
    meta = header.metadata
    if meta.get("general.architecture") != "clip":
        raise GgufError(f"{where}: not a vision projector (general.architecture is not clip)")

    def key(name: str) -> int:
        return _count(meta.get(f"clip.vision.{name}"), f"clip.vision.{name}", where)

    patch = key("patch_size")
    return VisionShape(
        weight_bytes=sum(t.nbytes for t in header.tensors),
        n_patches=(key("image_size") // patch) ** 2 if patch else 0,
        patch_size=patch,
        n_embd=key("embedding_length"),
        n_ff=key("feed_forward_length"),
    )


def read_shape(path: Path) -> ModelShape:
    """Read ``path``'s header into a :class:`ModelShape`; raises :class:`GgufError`."""
    return shape_from_header(read_header(path), str(path))


def shape_from_header(header: GgufHeader, where: str = "model") -> ModelShape:
    meta = header.metadata
    arch = _text(meta, "general.architecture", where)

    def key(name: str) -> MetaValue | None:
        return meta.get(f"{arch}.{name}")

    def count(name: str, default: int | None = None) -> int:
        return _count(key(name), name, where, default)

    def per_layer(name: str, default: int) -> list[int]:
        return _per_layer(key(name), n_layer, default, name, where)

    n_layer = _count(key("block_count"), "block_count", where, low=1, high=MAX_LAYERS)
    if n_layer > len(header.tensors):  # every layer of every architecture has weights
        raise GgufError(
            f"{where}: the header claims {n_layer} layers but holds {len(header.tensors)} tensor(s)"
        )
    n_embd = count("embedding_length")
    n_head = max(per_layer("attention.head_count", 1))
    kv_heads = per_layer("attention.head_count_kv", n_head)
    head_dim = n_embd // n_head if n_head else 0
    n_swa = count("attention.sliding_window", 0)

    input_bytes = output_bytes = amx_output = 0
    layer_bytes = [0] * n_layer
    amx_layer = [0] * n_layer
    n_vocab = ssm_in_width = 0
    tied = not any(t.name == "output.weight" for t in header.tensors)
    for tensor in header.tensors:
        match = _LAYER.match(tensor.name)
        if match and int(match.group(1)) < n_layer:
            layer_bytes[int(match.group(1))] += tensor.nbytes
            amx_layer[int(match.group(1))] += _amx_bytes(tensor)
            if tensor.name.endswith(".ssm_in.weight") and len(tensor.shape) == 2:
                ssm_in_width = max(ssm_in_width, tensor.shape[1])
        elif tensor.name.startswith(_INPUT_TENSORS):
            input_bytes += tensor.nbytes
            if tensor.name == "token_embd.weight" and len(tensor.shape) == 2:
                n_vocab = tensor.shape[1]
                if tied:  # the output head multiplies by the embeddings: a copy for it
                    amx_output += _amx_bytes(tensor, matmul=True)
        else:
            output_bytes += tensor.nbytes
            amx_output += _amx_bytes(tensor)
    tokens = meta.get("tokenizer.ggml.tokens")
    if isinstance(tokens, SkippedArray):
        n_vocab = tokens.length
    kv_heads, recurrent = _recurrent_layers(arch, meta, kv_heads, n_embd, where)
    return ModelShape(
        arch=arch,
        n_layer=n_layer,
        n_embd=n_embd,
        n_ff=_peak_ff(count, max(per_layer("feed_forward_length", 4 * n_embd))),
        n_head=n_head,
        n_vocab=n_vocab,
        n_ctx_train=count("context_length", 4096),
        kv_heads=tuple(kv_heads),
        head_dim_k=count("attention.key_length", head_dim),
        head_dim_v=count("attention.value_length", head_dim),
        n_swa=n_swa,
        swa_layers=_swa_layers(arch, key("attention.sliding_window_pattern"), n_layer, n_swa),
        input_bytes=input_bytes,
        output_bytes=output_bytes,
        layer_bytes=tuple(layer_bytes),
        recurrent_bytes=recurrent,
        amx_layer_bytes=tuple(amx_layer),
        amx_output_bytes=amx_output,
        amx_unmapped_bytes=_amx_unmapped(header.tensors),
        mla=bool(key("attention.key_length_mla")) and bool(key("attention.value_length_mla")),
        ssm_in_width=ssm_in_width,
    )


def _peak_ff(count: Callable[[str, int], int], dense: int) -> int:
    """The widest FFN a token passes: dense layers' ``n_ff`` or the experts it is routed to.

    A mixture-of-experts token goes through ``expert_used_count`` experts of
    ``expert_feed_forward_length`` (and the shared ones); the header's ``feed_forward_length``
    is then only the leading dense blocks' width, or unused.
    """
    used, width = count("expert_used_count", 0), count("expert_feed_forward_length", 0)
    if not used or not width:
        return dense
    shared = count("expert_shared_feed_forward_length", -1)
    if shared < 0:  # absent: the shared experts' count times the experts' width
        shared = width * count("expert_shared_count", 0)
    routed = used * width + shared
    return max(dense, routed) if count("leading_dense_block_count", 0) > 0 else routed


def _recurrent_layers(
    arch: str, meta: Mapping[str, MetaValue], kv_heads: list[int], n_embd: int, where: str
) -> tuple[list[int], tuple[int, ...]]:
    """KV heads per layer (0 where a layer is recurrent) and each layer's state per sequence.

    The state's sizes are llama-hparams.cpp's ``n_embd_r`` (the convolution's last
    ``d_conv - 1`` inputs, or LFM2's short convolution's) and ``n_embd_s`` (the SSM state),
    f32 each.
    """
    n_layer = len(kv_heads)

    def key(name: str) -> int:
        return _count(meta.get(f"{arch}.{name}"), name, where, 0)

    if arch in _RECURRENT:
        layers = [True] * n_layer
    elif arch in _INTERVAL_HYBRIDS:
        interval = key("full_attention_interval") or 4
        layers = [(il + 1) % interval != 0 for il in range(n_layer)]
    elif key("ssm.conv_kernel") or key("shortconv.l_cache"):
        layers = [heads == 0 for heads in kv_heads]  # granitehybrid, lfm2, nemotron_h…
    else:
        return kv_heads, (0,) * n_layer
    l_cache = key("shortconv.l_cache")
    if l_cache:
        conv = n_embd * (l_cache - 1)
    else:
        d_conv, inner = key("ssm.conv_kernel"), key("ssm.inner_size")
        conv = max(d_conv - 1, 0) * (inner + 2 * key("ssm.group_count") * key("ssm.state_size"))
    state = key("ssm.state_size") * key("ssm.inner_size")
    per_seq = 4 * (conv + state)
    heads = [0 if recr else kv for recr, kv in zip(layers, kv_heads, strict=True)]
    return heads, tuple(per_seq if recr else 0 for recr in layers)


def _amx_unmapped(tensors: Sequence[TensorInfo]) -> int:
    """Bytes of the leading and trailing tensors (data in table order) only AMX keeps."""
    only_amx = [not t.name.startswith(_INPUT_TENSORS) and _amx_bytes(t) > 0 for t in tensors]
    lead = next((i for i, amx in enumerate(only_amx) if not amx), len(tensors))
    tail = next((i for i, amx in enumerate(reversed(only_amx)) if not amx), 0)
    if lead == len(tensors):
        return sum(t.nbytes for t in tensors)
    return sum(t.nbytes for t in tensors[:lead]) + sum(
        t.nbytes for t in tensors[len(tensors) - tail :]
    )


def _amx_bytes(tensor: TensorInfo, *, matmul: bool = False) -> int:
    """Bytes of ``tensor``'s copy in the AMX buffer; 0 where AMX does not take it.

    ``matmul``: the tensor feeds a matmul whatever its name (tied embeddings as the head).
    """
    if len(tensor.shape) != 2 or (not matmul and _NOT_MATMUL_NAME.search(tensor.name)):
        return 0
    qtype = GGMLQuantizationType(tensor.ggml_type)
    rule = _AMX_TYPES.get(qtype)
    if rule is None:
        return 0
    align, grow = rule
    width, rows = tensor.shape
    if rows % 32 or width % align:  # the output width must fill two 16-row tiles
        return 0
    block = GGML_QUANT_SIZES[qtype][0]
    return tensor.nbytes + rows * (width // block) * grow


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


def _per_layer(
    value: MetaValue | None, n_layer: int, default: int, name: str, where: str
) -> list[int]:
    """One value per layer: an array of ``n_layer`` items or one value for all (an array of
    another length, as before, stands for the default)."""
    if isinstance(value, tuple):
        if len(value) != n_layer:
            return [default] * n_layer
        return [_count(v, name, where) for v in value]
    return [_count(value, name, where, default)] * n_layer


def _count(
    value: MetaValue | None,
    name: str,
    where: str,
    default: int | None = None,
    *,
    low: int = 0,
    high: int = MAX_COUNT,
) -> int:
    """A count from the header (an array: its largest item): a whole number from ``low`` to
    ``high``, else :class:`GgufError` (llama.cpp: "key … has wrong type", or its limits)."""
    if value is None or isinstance(value, SkippedArray):
        if default is None:
            raise GgufError(f"{where}: header lacks {name}")
        return default
    if isinstance(value, tuple):
        if not value:
            raise GgufError(f"{where}: {name} is an empty array")
        return max(_count(v, name, where, low=low, high=high) for v in value)
    if not isinstance(value, int) or isinstance(value, bool):
        shown = repr(value)[:40]
        raise GgufError(f"{where}: {name} must be a whole number, not {shown}")
    if not low <= value <= high:
        raise GgufError(f"{where}: {name} {value} is out of range (at least {low}, at most {high})")
    return value


def _text(meta: Mapping[str, MetaValue], name: str, where: str) -> str:
    value = meta.get(name)
    if not isinstance(value, str):
        raise GgufError(f"{where}: header lacks {name}")
    return value
