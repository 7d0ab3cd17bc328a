"""Tiny random GGUF models of the architectures people run, for checking the memory estimate.

The demo models (``node_agent.demo_models``) are all ``llama``; the estimator must also be right
on mixture-of-experts (qwen3moe, gpt-oss, glm4moe, deepseek2), sliding-window (gemma3, gpt-oss),
multi-head latent attention (deepseek2), fused projections (phi3) and recurrent or hybrid models
(mamba2, granitehybrid, qwen3next, lfm2). Each model here is what llama.cpp's loader expects for
its architecture (``src/models/<arch>.cpp``, ``load_arch_hparams`` and ``load_arch_tensors``):
only required tensors or optional ones both the pinned build and b11434 accept (the loader
rejects a file with a tensor it did not ask for), every tensor's kind checked against
``gguf.constants.MODEL_TENSORS``. Weights are random and seeded, so a configuration always
writes the same bytes; every model loads in well under a second.

The vocabulary is the demo models' pieces with only the ASCII byte tokens: whatever a random
head samples then decodes to valid UTF-8 (a lone byte >= 0x80 would make llama-server answer
500), and any ASCII prompt still tokenizes.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import gguf
import numpy as np
import numpy.typing as npt
from gguf.constants import MODEL_ARCH, MODEL_ARCH_NAMES, MODEL_TENSOR, MODEL_TENSORS, TENSOR_NAMES

from node_agent.demo_models import CHATML_TEMPLATE, CONTROL_TOKENS, PIECES

MetaValue = int | float | bool | tuple[int, ...]

# Tensors llama.cpp keeps in f32 (convolution and state-space parameters, routers, sinks):
# the CPU kernels of ssm_conv / ssm_scan take no f16 there.
_F32_SUFFIXES = (
    "ssm_conv1d",
    "ssm_a",
    "ssm_d",
    "ssm_dt",
    "ssm_norm",
    "shortconv.conv",
    "ffn_gate_inp",
    "ffn_gate_inp_shexp",
    "attn_sinks",
    "exp_probs_b",
    # MLA's per-head K and V projections: batched 3-D matmuls, which the CPU's AMX buffer
    # (where f16 weights go on CPUs that have AMX) cannot run: the scheduler aborts.
    "attn_k_b",
    "attn_v_b",
)


@dataclass(frozen=True)
class ArchModel:
    """One generated model: its architecture, sizes and the architecture's own keys."""

    name: str
    arch: str  # gguf's architecture name (general.architecture)
    n_layer: int = 4
    n_embd: int = 64
    # Heads of 32: a q8_0 KV cache needs head sizes that its 32-wide blocks divide.
    n_head: int = 2
    n_head_kv: int = 1
    n_ff: int = 128
    n_vocab: int = 1024
    n_ctx: int = 8192
    seed: int = 0
    # KV heads per layer where they differ (0 = a recurrent layer of a hybrid).
    layer_kv: tuple[int, ...] | None = None
    # Keys under "<arch>." beyond the common ones, e.g. ("expert_count", 8).
    keys: tuple[tuple[str, MetaValue], ...] = field(default_factory=tuple)

    @property
    def file_name(self) -> str:
        return f"{self.name}.gguf"

    @property
    def head_dim(self) -> int:
        return self.n_embd // self.n_head if self.n_head else 0

    def key(self, name: str, default: int = 0) -> int:
        for key, value in self.keys:
            if key == name and isinstance(value, int):
                return value
        return default

    def kv_heads(self, il: int) -> int:
        return self.layer_kv[il] if self.layer_kv is not None else self.n_head_kv


# A tensor as llama.cpp creates it: kind, layer (None outside blocks), suffix, ggml dims
# (ne0 first, the reverse of numpy's order).
Spec = tuple[MODEL_TENSOR, int | None, str | None, tuple[int, ...]]


def _w(kind: MODEL_TENSOR, il: int | None, *dims: int) -> Spec:
    return (kind, il, "weight", dims)


def _b(kind: MODEL_TENSOR, il: int | None, *dims: int) -> Spec:
    return (kind, il, "bias", dims)


T = MODEL_TENSOR

_EXPERT_KEYS: tuple[tuple[str, MetaValue], ...] = (
    ("expert_count", 8),
    ("expert_used_count", 2),
    ("expert_feed_forward_length", 32),
)
_SSM_KEYS: tuple[tuple[str, MetaValue], ...] = (
    ("ssm.conv_kernel", 4),
    ("ssm.inner_size", 128),
    ("ssm.state_size", 16),
    ("ssm.time_step_rank", 8),
    ("ssm.group_count", 1),
)


def _io(m: ArchModel, norm: MODEL_TENSOR = T.OUTPUT_NORM) -> Iterator[Spec]:
    yield _w(T.TOKEN_EMBD, None, m.n_embd, m.n_vocab)
    yield _w(norm, None, m.n_embd)
    yield _w(T.OUTPUT, None, m.n_embd, m.n_vocab)


def _qkvo(m: ArchModel, il: int, q_width: int | None = None) -> Iterator[Spec]:
    hd, kv = m.head_dim, m.kv_heads(il) * m.head_dim
    q = m.n_head * hd
    yield _w(T.ATTN_Q, il, m.n_embd, q if q_width is None else q_width)
    yield _w(T.ATTN_K, il, m.n_embd, kv)
    yield _w(T.ATTN_V, il, m.n_embd, kv)
    yield _w(T.ATTN_OUT, il, q, m.n_embd)


def _qk_norm(m: ArchModel, il: int) -> Iterator[Spec]:
    yield _w(T.ATTN_Q_NORM, il, m.head_dim)
    yield _w(T.ATTN_K_NORM, il, m.head_dim)


def _ffn(m: ArchModel, il: int) -> Iterator[Spec]:
    yield _w(T.FFN_NORM, il, m.n_embd)
    yield _w(T.FFN_GATE, il, m.n_embd, m.n_ff)
    yield _w(T.FFN_DOWN, il, m.n_ff, m.n_embd)
    yield _w(T.FFN_UP, il, m.n_embd, m.n_ff)


def _experts(m: ArchModel, il: int, shared: int = 0) -> Iterator[Spec]:
    n_exp, n_ff_exp = m.key("expert_count"), m.key("expert_feed_forward_length")
    yield _w(T.FFN_GATE_INP, il, m.n_embd, n_exp)
    yield _w(T.FFN_GATE_EXP, il, m.n_embd, n_ff_exp, n_exp)
    yield _w(T.FFN_DOWN_EXP, il, n_ff_exp, m.n_embd, n_exp)
    yield _w(T.FFN_UP_EXP, il, m.n_embd, n_ff_exp, n_exp)
    if shared:
        yield _w(T.FFN_GATE_SHEXP, il, m.n_embd, shared)
        yield _w(T.FFN_DOWN_SHEXP, il, shared, m.n_embd)
        yield _w(T.FFN_UP_SHEXP, il, m.n_embd, shared)


def _mamba2_mixer(m: ArchModel, il: int) -> Iterator[Spec]:
    d_conv, d_inner = m.key("ssm.conv_kernel"), m.key("ssm.inner_size")
    d_state, n_group, heads = (
        m.key("ssm.state_size"),
        m.key("ssm.group_count"),
        m.key("ssm.time_step_rank"),
    )
    conv_dim = d_inner + 2 * n_group * d_state
    yield _w(T.SSM_IN, il, m.n_embd, d_inner + conv_dim + heads)
    yield _w(T.SSM_CONV1D, il, d_conv, conv_dim)
    yield _b(T.SSM_CONV1D, il, conv_dim)
    yield _b(T.SSM_DT, il, heads)
    yield (T.SSM_A, il, None, (1, heads))
    yield (T.SSM_D, il, None, (1, heads))
    yield _w(T.SSM_NORM, il, d_inner // n_group, n_group)
    yield _w(T.SSM_OUT, il, d_inner, m.n_embd)


def _qwen3(m: ArchModel) -> Iterator[Spec]:
    yield from _io(m)
    for il in range(m.n_layer):
        yield _w(T.ATTN_NORM, il, m.n_embd)
        yield from _qkvo(m, il)
        yield from _qk_norm(m, il)
        yield from _ffn(m, il)


def _qwen3moe(m: ArchModel) -> Iterator[Spec]:
    yield from _io(m)
    for il in range(m.n_layer):
        yield _w(T.ATTN_NORM, il, m.n_embd)
        yield from _qkvo(m, il)
        yield from _qk_norm(m, il)
        yield _w(T.FFN_NORM, il, m.n_embd)
        yield from _experts(m, il)


def _gemma3(m: ArchModel) -> Iterator[Spec]:
    yield from _io(m)
    for il in range(m.n_layer):
        yield _w(T.ATTN_NORM, il, m.n_embd)
        yield from _qkvo(m, il)
        yield _w(T.ATTN_POST_NORM, il, m.n_embd)
        yield from _qk_norm(m, il)
        yield from _ffn(m, il)
        yield _w(T.FFN_POST_NORM, il, m.n_embd)


def _gpt_oss(m: ArchModel) -> Iterator[Spec]:
    yield from _io(m)
    n_exp, n_ff_exp = m.key("expert_count"), m.key("expert_feed_forward_length")
    for il in range(m.n_layer):
        kv = m.kv_heads(il) * m.head_dim
        yield _w(T.ATTN_NORM, il, m.n_embd)
        yield _w(T.ATTN_POST_NORM, il, m.n_embd)
        yield from _qkvo(m, il)
        yield _b(T.ATTN_Q, il, m.n_head * m.head_dim)
        yield _b(T.ATTN_K, il, kv)
        yield _b(T.ATTN_V, il, kv)
        yield _b(T.ATTN_OUT, il, m.n_embd)
        yield _w(T.ATTN_SINKS, il, m.n_head)
        yield from _experts(m, il)
        yield _b(T.FFN_GATE_INP, il, n_exp)
        yield _b(T.FFN_GATE_EXP, il, n_ff_exp, n_exp)
        yield _b(T.FFN_DOWN_EXP, il, m.n_embd, n_exp)
        yield _b(T.FFN_UP_EXP, il, n_ff_exp, n_exp)


def _phi3(m: ArchModel) -> Iterator[Spec]:
    yield from _io(m)
    kv = m.n_head_kv * m.head_dim
    for il in range(m.n_layer):
        yield _w(T.ATTN_NORM, il, m.n_embd)
        yield _w(T.ATTN_QKV, il, m.n_embd, m.n_embd + 2 * kv)  # phi3 ships fused QKV
        yield _w(T.ATTN_OUT, il, m.n_embd, m.n_embd)
        yield _w(T.FFN_NORM, il, m.n_embd)
        yield _w(T.FFN_DOWN, il, m.n_ff, m.n_embd)
        yield _w(T.FFN_UP, il, m.n_embd, 2 * m.n_ff)  # gate and up, fused


def _mistral3(m: ArchModel) -> Iterator[Spec]:
    yield from _io(m)
    for il in range(m.n_layer):
        yield _w(T.ATTN_NORM, il, m.n_embd)
        yield from _qkvo(m, il)
        yield from _ffn(m, il)


def _glm4moe(m: ArchModel) -> Iterator[Spec]:
    yield from _io(m)
    dense = m.key("leading_dense_block_count")
    for il in range(m.n_layer):
        yield _w(T.ATTN_NORM, il, m.n_embd)
        yield from _qkvo(m, il)
        yield from _qk_norm(m, il)
        yield _w(T.ATTN_POST_NORM, il, m.n_embd)
        if il < dense:
            yield _w(T.FFN_GATE, il, m.n_embd, m.n_ff)
            yield _w(T.FFN_DOWN, il, m.n_ff, m.n_embd)
            yield _w(T.FFN_UP, il, m.n_embd, m.n_ff)
        else:
            n_ff_exp = m.key("expert_feed_forward_length")
            yield _b(T.FFN_EXP_PROBS_B, il, m.key("expert_count"))
            yield from _experts(m, il, shared=n_ff_exp * m.key("expert_shared_count"))


def _deepseek2(m: ArchModel) -> Iterator[Spec]:
    yield from _io(m)
    q_rank, kv_rank = m.key("attention.q_lora_rank"), m.key("attention.kv_lora_rank")
    k_mla, v_mla = m.key("attention.key_length_mla"), m.key("attention.value_length_mla")
    rope = m.key("rope.dimension_count")
    dense, n_ff_exp = m.key("leading_dense_block_count"), m.key("expert_feed_forward_length")
    for il in range(m.n_layer):
        yield _w(T.ATTN_NORM, il, m.n_embd)
        yield _w(T.ATTN_Q_A_NORM, il, q_rank)
        yield _w(T.ATTN_KV_A_NORM, il, kv_rank)
        yield _w(T.ATTN_Q_A, il, m.n_embd, q_rank)
        yield _w(T.ATTN_Q_B, il, q_rank, m.n_head * k_mla)
        yield _w(T.ATTN_KV_A_MQA, il, m.n_embd, kv_rank + rope)
        yield _w(T.ATTN_K_B, il, k_mla - rope, kv_rank, m.n_head)
        yield _w(T.ATTN_V_B, il, kv_rank, v_mla, m.n_head)
        yield _w(T.ATTN_OUT, il, m.n_head * v_mla, m.n_embd)
        if il < dense:
            yield from _ffn(m, il)
        else:
            yield _w(T.FFN_NORM, il, m.n_embd)
            yield from _experts(m, il, shared=n_ff_exp * m.key("expert_shared_count"))


def _mamba2(m: ArchModel) -> Iterator[Spec]:
    yield from _io(m)
    for il in range(m.n_layer):
        yield _w(T.ATTN_NORM, il, m.n_embd)
        yield from _mamba2_mixer(m, il)


def _granitehybrid(m: ArchModel) -> Iterator[Spec]:
    yield from _io(m)
    for il in range(m.n_layer):
        yield _w(T.ATTN_NORM, il, m.n_embd)
        if m.kv_heads(il) == 0:
            d_conv, d_inner = m.key("ssm.conv_kernel"), m.key("ssm.inner_size")
            d_state, n_group = m.key("ssm.state_size"), m.key("ssm.group_count")
            heads = m.key("ssm.time_step_rank")
            conv_dim = d_inner + 2 * n_group * d_state
            yield _w(T.SSM_IN, il, m.n_embd, 2 * d_inner + 2 * n_group * d_state + heads)
            yield _w(T.SSM_CONV1D, il, d_conv, conv_dim)
            yield _b(T.SSM_CONV1D, il, conv_dim)
            yield _b(T.SSM_DT, il, heads)
            yield (T.SSM_A, il, None, (1, heads))
            yield (T.SSM_D, il, None, (1, heads))
            yield _w(T.SSM_NORM, il, d_inner // n_group, n_group)
            yield _w(T.SSM_OUT, il, d_inner, m.n_embd)
        else:
            yield from _qkvo(m, il)
        yield from _ffn(m, il)


def _qwen3next(m: ArchModel) -> Iterator[Spec]:
    yield from _io(m)
    head_dim, n_k, n_v = (
        m.key("ssm.state_size"),
        m.key("ssm.group_count"),
        m.key("ssm.time_step_rank"),
    )
    key_dim, value_dim = head_dim * n_k, head_dim * n_v
    interval = m.key("full_attention_interval")
    for il in range(m.n_layer):
        yield _w(T.ATTN_NORM, il, m.n_embd)
        yield _w(T.ATTN_POST_NORM, il, m.n_embd)
        if (il + 1) % interval == 0:  # full attention; its Q carries a gate as wide again
            yield from _qkvo(m, il, q_width=2 * m.n_head * m.head_dim)
            yield from _qk_norm(m, il)
        else:  # gated delta net
            yield _w(T.SSM_IN, il, m.n_embd, 2 * key_dim + 2 * value_dim)
            yield _w(T.SSM_CONV1D, il, m.key("ssm.conv_kernel"), 2 * key_dim + value_dim)
            yield _b(T.SSM_DT, il, n_v)
            yield (T.SSM_A, il, None, (n_v,))
            yield _w(T.SSM_BETA_ALPHA, il, m.n_embd, 2 * n_v)
            yield _w(T.SSM_NORM, il, head_dim)
            yield _w(T.SSM_OUT, il, value_dim, m.n_embd)
        yield from _experts(m, il, shared=m.key("expert_shared_feed_forward_length"))
        yield _w(T.FFN_GATE_INP_SHEXP, il, m.n_embd)


def _lfm2(m: ArchModel) -> Iterator[Spec]:
    # LFM2 names its final norm token_embd_norm (llama-arch.cpp: "fix for wrong tensor name").
    yield from _io(m, norm=T.TOKEN_EMBD_NORM)
    for il in range(m.n_layer):
        yield from _ffn(m, il)
        yield _w(T.ATTN_NORM, il, m.n_embd)
        if m.kv_heads(il) == 0:
            yield _w(T.SHORTCONV_CONV, il, m.key("shortconv.l_cache"), m.n_embd)
            yield _w(T.SHORTCONV_INPROJ, il, m.n_embd, 3 * m.n_embd)
            yield _w(T.SHORTCONV_OUTPROJ, il, m.n_embd, m.n_embd)
        else:
            yield from _qk_norm(m, il)
            yield from _qkvo(m, il)


_TENSORS: Mapping[str, Callable[[ArchModel], Iterator[Spec]]] = {
    "qwen3": _qwen3,
    "qwen3moe": _qwen3moe,
    "gemma3": _gemma3,
    "gpt-oss": _gpt_oss,
    "phi3": _phi3,
    "mistral3": _mistral3,
    "glm4moe": _glm4moe,
    "deepseek2": _deepseek2,
    "mamba2": _mamba2,
    "granitehybrid": _granitehybrid,
    "qwen3next": _qwen3next,
    "lfm2": _lfm2,
}

# fmt: off
ARCH_MODELS: tuple[ArchModel, ...] = (
    ArchModel("arch-qwen3", "qwen3", seed=11),
    ArchModel("arch-qwen3moe", "qwen3moe", seed=12, keys=_EXPERT_KEYS),
    # Six layers: gemma3's hard-coded pattern makes every sixth layer full attention.
    ArchModel("arch-gemma3", "gemma3", n_layer=6, seed=13,
              keys=(("attention.sliding_window", 128),)),
    ArchModel("arch-gpt-oss", "gpt-oss", seed=14,
              keys=(*_EXPERT_KEYS, ("attention.sliding_window", 128))),
    ArchModel("arch-phi3", "phi3", seed=15),
    ArchModel("arch-mistral3", "mistral3", seed=16),
    ArchModel("arch-glm4moe", "glm4moe", seed=17,
              keys=(*_EXPERT_KEYS, ("expert_shared_count", 1), ("leading_dense_block_count", 1),
                    ("nextn_predict_layers", 0))),
    # MLA as DeepSeek-V3 ships it: one latent KV head of kv_lora_rank + rope wide.
    ArchModel("arch-deepseek2", "deepseek2", n_head_kv=1, seed=18,
              keys=(*_EXPERT_KEYS, ("expert_shared_count", 1), ("leading_dense_block_count", 1),
                    ("attention.q_lora_rank", 32), ("attention.kv_lora_rank", 64),
                    ("attention.key_length", 96), ("attention.value_length", 64),
                    ("attention.key_length_mla", 64), ("attention.value_length_mla", 32),
                    ("rope.dimension_count", 32))),
    ArchModel("arch-mamba2", "mamba2", n_head=0, n_head_kv=0, seed=19, keys=_SSM_KEYS),
    ArchModel("arch-granitehybrid", "granitehybrid", seed=20, layer_kv=(0, 0, 0, 1),
              keys=_SSM_KEYS),
    ArchModel("arch-qwen3next", "qwen3next", seed=21,
              keys=(*_EXPERT_KEYS, ("expert_shared_feed_forward_length", 32),
                    ("full_attention_interval", 4), ("ssm.conv_kernel", 4),
                    ("ssm.inner_size", 64), ("ssm.state_size", 16), ("ssm.group_count", 2),
                    ("ssm.time_step_rank", 4))),
    ArchModel("arch-lfm2", "lfm2", seed=22, layer_kv=(0, 0, 1, 0),
              keys=(("shortconv.l_cache", 3),)),
)
# fmt: on


def vocabulary(n_vocab: int) -> tuple[list[str], list[int]]:
    """Tokens and token types: control tokens, the 128 ASCII bytes, then plain pieces."""
    # <|endoftext|>: llama.cpp's vocabulary loader looks it up for models named phi3.
    tokens = ["<unk>", "<s>", "</s>", *CONTROL_TOKENS, "<|endoftext|>"]
    types = [gguf.TokenType.UNKNOWN] + [gguf.TokenType.CONTROL] * (3 + len(CONTROL_TOKENS))
    tokens += [f"<0x{b:02X}>" for b in range(128)]
    types += [gguf.TokenType.BYTE] * 128
    pieces = PIECES[: n_vocab - len(tokens)]
    tokens += pieces
    types += [gguf.TokenType.NORMAL] * len(pieces)
    return tokens, [int(t) for t in types]


def tensor_specs(model: ArchModel) -> list[tuple[str, tuple[int, ...]]]:
    """(GGUF name, ggml dims) of every tensor, each kind checked against gguf's list."""
    return _named(_TENSORS[model.arch](model), _arch(model.arch), model.name)


def _named(specs: Iterable[Spec], arch: MODEL_ARCH, what: str) -> list[tuple[str, tuple[int, ...]]]:
    # By name: gguf and llama.cpp sometimes give one name two kinds (ffn_norm is gemma's
    # FFN_PRE_NORM).
    allowed = {TENSOR_NAMES[kind] for kind in MODEL_TENSORS[arch]}
    out = []
    for kind, layer, suffix, dims in specs:
        if TENSOR_NAMES[kind] not in allowed:
            raise ValueError(f"{what}: {kind.name} is not a {arch.name.lower()} tensor in gguf")
        base = TENSOR_NAMES[kind].format(bid=layer)
        out.append((f"{base}.{suffix}" if suffix else base, dims))
    return out


def write_arch_model(path: Path, model: ArchModel) -> Path:
    """Write ``model`` to ``path`` (overwriting): deterministic bytes for a configuration."""
    rng = np.random.default_rng(model.seed)
    tokens, types = vocabulary(model.n_vocab)
    path.parent.mkdir(parents=True, exist_ok=True)
    writer = gguf.GGUFWriter(path, model.arch)
    writer.add_name(model.name)
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    for key, value in _metadata(model).items():
        _put(writer, f"{model.arch}.{key}", value)
    writer.add_tokenizer_model("llama")
    writer.add_token_list(tokens)
    writer.add_token_scores([0.0] * len(tokens))
    writer.add_token_types(types)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_unk_token_id(0)
    writer.add_add_bos_token(False)
    writer.add_chat_template(CHATML_TEMPLATE)
    for name, dims in tensor_specs(model):
        writer.add_tensor(name, _values(name, dims, rng))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def write_arch_models(dest: Path, models: Sequence[ArchModel] = ARCH_MODELS) -> list[Path]:
    return [write_arch_model(dest / m.file_name, m) for m in models]


def _metadata(m: ArchModel) -> dict[str, MetaValue]:
    # Hybrids mark their recurrent layers with zero KV heads (granitehybrid, lfm2), the head
    # count stays one number: llama.cpp takes the head size from layer 0's.
    kv: MetaValue = m.n_head_kv if m.layer_kv is None else m.layer_kv
    meta: dict[str, MetaValue] = {
        "context_length": m.n_ctx,
        "embedding_length": m.n_embd,
        "block_count": m.n_layer,
        "feed_forward_length": m.n_ff,
        "attention.head_count": m.n_head,
        "attention.head_count_kv": kv,
        "attention.layer_norm_rms_epsilon": 1e-5,
        "rope.freq_base": 10000.0,
        "vocab_size": m.n_vocab,
    }
    if m.head_dim:
        meta |= {
            "attention.key_length": m.head_dim,
            "attention.value_length": m.head_dim,
            "rope.dimension_count": m.head_dim,
        }
    meta.update(m.keys)
    return meta


def _put(writer: gguf.GGUFWriter, key: str, value: MetaValue) -> None:
    if isinstance(value, bool):
        writer.add_bool(key, value)
    elif isinstance(value, int):
        writer.add_uint32(key, value)
    elif isinstance(value, float):
        writer.add_float32(key, value)
    else:
        writer.add_array(key, list(value))


def _values(
    name: str, dims: tuple[int, ...], rng: np.random.Generator
) -> npt.NDArray[np.float32] | npt.NDArray[np.float16]:
    shape = tuple(reversed(dims))
    stem = name.rsplit(".", 1)[0] if name.endswith((".weight", ".bias")) else name
    if "norm" in stem.rsplit(".", 1)[-1] or stem.endswith("ssm_d"):
        return np.ones(shape, dtype=np.float32)
    values = rng.standard_normal(shape, dtype=np.float32) * np.float32(0.5 / np.sqrt(dims[0]))
    if stem.endswith("ssm_a"):
        decay: npt.NDArray[np.float32] = -np.abs(values) - np.float32(0.5)  # must be negative
        return decay
    if len(dims) == 1 or name.endswith(".bias") or stem.endswith(_F32_SUFFIXES):
        return values
    return values.astype(np.float16)


def _arch(name: str) -> MODEL_ARCH:
    for arch, arch_name in MODEL_ARCH_NAMES.items():
        if arch_name == name:
            return arch
    raise ValueError(f"gguf knows no architecture {name!r}")


@dataclass(frozen=True)
class VisionProjector:
    """A LLaVA-style vision projector (``mmproj``, projector type ``mlp``) for a text model.

    llama.cpp's ``tools/mtmd/clip.cpp`` loads it: a ViT of ``n_layer`` blocks over
    ``(image_size / patch_size)^2`` patches, then two dense layers into the text model's
    embedding width.
    """

    name: str
    text_embd: int  # the text model's n_embd: the projector's output width
    image_size: int = 224
    patch_size: int = 14
    n_embd: int = 64
    n_head: int = 2
    n_ff: int = 128
    n_layer: int = 2
    seed: int = 0

    @property
    def file_name(self) -> str:
        return f"{self.name}.gguf"

    @property
    def n_patches(self) -> int:
        return (self.image_size // self.patch_size) ** 2


def vision_specs(p: VisionProjector) -> list[tuple[str, tuple[int, ...]]]:
    """(GGUF name, ggml dims) of the projector's tensors, checked against gguf's MMPROJ list."""
    specs: list[Spec] = [
        _w(T.V_ENC_EMBD_PATCH, None, p.patch_size, p.patch_size, 3, p.n_embd),
        _b(T.V_ENC_EMBD_PATCH, None, p.n_embd),
        _w(T.V_ENC_EMBD_POS, None, p.n_embd, p.n_patches),
        _w(T.V_PRE_NORM, None, p.n_embd),
        _b(T.V_PRE_NORM, None, p.n_embd),
    ]
    for il in range(p.n_layer):
        for kind in (T.V_ENC_ATTN_Q, T.V_ENC_ATTN_K, T.V_ENC_ATTN_V, T.V_ENC_ATTN_O):
            specs += [_w(kind, il, p.n_embd, p.n_embd), _b(kind, il, p.n_embd)]
        for kind in (T.V_ENC_INPUT_NORM, T.V_ENC_POST_ATTN_NORM):
            specs += [_w(kind, il, p.n_embd), _b(kind, il, p.n_embd)]
        specs += [_w(T.V_ENC_FFN_UP, il, p.n_embd, p.n_ff), _b(T.V_ENC_FFN_UP, il, p.n_ff)]
        specs += [_w(T.V_ENC_FFN_DOWN, il, p.n_ff, p.n_embd), _b(T.V_ENC_FFN_DOWN, il, p.n_embd)]
    specs += [_w(T.V_MMPROJ, 0, p.n_embd, p.text_embd), _b(T.V_MMPROJ, 0, p.text_embd)]
    specs += [_w(T.V_MMPROJ, 2, p.text_embd, p.text_embd), _b(T.V_MMPROJ, 2, p.text_embd)]
    return _named(specs, MODEL_ARCH.MMPROJ, p.name)


def write_vision_projector(path: Path, p: VisionProjector) -> Path:
    """Write the projector to ``path`` (overwriting): deterministic bytes for a configuration."""
    rng = np.random.default_rng(p.seed)
    path.parent.mkdir(parents=True, exist_ok=True)
    writer = gguf.GGUFWriter(path, "clip")
    writer.add_name(p.name)
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    writer.add_bool("clip.has_vision_encoder", True)
    writer.add_string("clip.projector_type", "mlp")
    writer.add_bool("clip.use_gelu", True)
    for key, value in {
        "embedding_length": p.n_embd,
        "feed_forward_length": p.n_ff,
        "block_count": p.n_layer,
        "projection_dim": p.text_embd,
        "attention.head_count": p.n_head,
        "image_size": p.image_size,
        "patch_size": p.patch_size,
    }.items():
        writer.add_uint32(f"clip.vision.{key}", value)
    writer.add_float32("clip.vision.attention.layer_norm_epsilon", 1e-6)
    writer.add_array("clip.vision.image_mean", [0.5, 0.5, 0.5])
    writer.add_array("clip.vision.image_std", [0.5, 0.5, 0.5])
    for name, dims in vision_specs(p):
        writer.add_tensor(name, _values(name, dims, rng))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
