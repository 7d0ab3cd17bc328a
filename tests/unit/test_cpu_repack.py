"""The AMX copies llama.cpp's CPU backend makes of a model's weights (memory/cpu_repack.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
from gguf.constants import GGMLQuantizationType as Q

from node_agent.memory.cpu_repack import NO_AMX, HostCpu, amx_copy_bytes, cpu_has_amx
from node_agent.memory.estimator import estimate_shape
from node_agent.memory.gguf_header import TensorInfo
from node_agent.memory.shape import ModelShape

AMX = HostCpu(amx=True)


def test_amx_is_read_from_the_cpu_flags(tmp_path: Path) -> None:
    with_amx = tmp_path / "amx"
    with_amx.write_text("processor\t: 0\nflags\t\t: fpu avx512f amx_bf16 amx_tile amx_int8\n")
    without = tmp_path / "epyc"
    without.write_text("processor\t: 0\nflags\t\t: fpu avx512f avx512_vnni\n")
    assert cpu_has_amx(with_amx)
    assert not cpu_has_amx(without)
    assert not cpu_has_amx(tmp_path / "missing")


@pytest.mark.parametrize(
    ("name", "shape", "kind", "expected"),
    [
        # Q8_0: 18 blocks of 34 bytes per row, plus an int32 compensation per block
        ("blk.0.attn_q.weight", (576, 576), Q.Q8_0, 576 * 18 * (34 + 4)),
        ("blk.0.ffn_up.weight", (576, 1536), Q.Q4_1, 1536 * 18 * 20),
        ("blk.0.ffn_down.weight", (1536, 576), Q.Q4_K, 576 * 6 * (144 + 4)),
        ("blk.0.attn_k.weight", (64, 64), Q.F16, 64 * 64 * 2),  # F16: copied as it is
        ("output.weight", (64, 2048), Q.F16, 64 * 2048 * 2),
        ("blk.0.attn_k.weight", (64, 48), Q.F16, 0),  # 48 output rows: not a multiple of 32
        ("blk.0.ffn_down.weight", (1000, 576), Q.Q4_K, 0),  # ne0 not a multiple of 256
        ("blk.0.attn_q.weight", (64, 64), Q.F32, 0),  # no AMX kernel for F32
        ("blk.0.attn_norm.weight", (64,), Q.F32, 0),
        ("token_embd.weight", (576, 49152), Q.Q8_0, 0),  # looked up by row, not multiplied
        ("blk.0.ffn_up_exps.weight", (64, 128, 8), Q.F16, 0),  # experts: MUL_MAT_ID
        ("blk.0.ssm_conv1d.weight", (4, 64), Q.F16, 0),
    ],
)
def test_which_weights_get_a_copy_and_its_size(
    name: str, shape: tuple[int, ...], kind: Q, expected: int
) -> None:
    assert amx_copy_bytes(TensorInfo(name, shape, kind.value)) == expected


def test_a_tied_head_copies_the_token_embeddings() -> None:
    embd = TensorInfo("token_embd.weight", (576, 49152), Q.Q8_0.value)
    assert amx_copy_bytes(embd, as_output_head=True) == 49152 * 18 * 38


def _shape(**kw: object) -> ModelShape:
    base: dict[str, object] = dict(
        arch="llama",
        n_layer=2,
        n_embd=64,
        n_ff=128,
        n_head=4,
        n_vocab=2048,
        n_ctx_train=4096,
        kv_heads=(4, 4),
        head_dim_k=16,
        head_dim_v=16,
        n_swa=0,
        swa_layers=(False, False),
        input_bytes=1000,
        output_bytes=2000,
        layer_bytes=(3000, 3000),
        layer_amx=(700, 700),
        output_amx=500,
        amx_unmapped=400,
    )
    return ModelShape(**{**base, **kw})  # type: ignore[arg-type]


def test_the_host_holds_the_copies_less_what_leaves_the_mapping() -> None:
    shape = _shape()
    plain = estimate_shape(shape, {"c": "512"}, ["host"], cpu=NO_AMX).devices["host"].weights
    amx = estimate_shape(shape, {"c": "512"}, ["host"], cpu=AMX).devices["host"].weights
    assert plain == 1000 + 2000 + 6000
    assert amx == plain + 700 + 700 + 500 - 400


@pytest.mark.parametrize("off", [{"no-repack": None}, {"nr": None}, {"repack": "false"}])
def test_no_repack_turns_the_copies_off(off: dict[str, str | None]) -> None:
    shape = _shape()
    options = {"c": "512", **off}
    plain = estimate_shape(shape, options, ["host"], cpu=NO_AMX).devices["host"].weights
    assert estimate_shape(shape, options, ["host"], cpu=AMX).devices["host"].weights == plain


def test_offloaded_layers_have_no_host_copy() -> None:
    shape = _shape()
    # -ngl 2 of 3 "layers": layer 0 stays on the host, layer 1 and the head go to the GPU
    options = {"c": "512", "ngl": "2"}
    plain = estimate_shape(shape, options, ["host", "CUDA0"], cpu=NO_AMX)
    amx = estimate_shape(shape, options, ["host", "CUDA0"], cpu=AMX)
    assert amx.devices["host"].weights == plain.devices["host"].weights + 700
    assert amx.devices["CUDA0"].weights == plain.devices["CUDA0"].weights
