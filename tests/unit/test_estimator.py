"""The GGUF header reader, the estimator's formulas and the buffer-log parser."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import gguf
import numpy as np
import pytest

from node_agent.errors import ConfigError
from node_agent.memory.estimator import estimate, estimate_shape, min_context, range_for_shape
from node_agent.memory.gguf_header import GgufError, SkippedArray, read_header
from node_agent.memory.shape import ModelShape, read_shape
from tests.buffers import LoggedBuffers, buffer_device, parse_buffer_line

MIB = 1 << 20


def write_gguf(path: Path, *, n_layer: int = 2, n_embd: int = 64, n_head: int = 4) -> Path:
    """A tiny llama-shaped GGUF; only its header matters here."""
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_context_length(2048)
    writer.add_embedding_length(n_embd)
    writer.add_block_count(n_layer)
    writer.add_feed_forward_length(2 * n_embd)
    writer.add_head_count(n_head)
    writer.add_head_count_kv(n_head // 2)
    writer.add_token_list([f"t{i}" for i in range(300)])
    writer.add_token_scores([i / 8 - 10 for i in range(300)])
    writer.add_token_types([i % 6 for i in range(300)])
    writer.add_tensor("token_embd.weight", np.zeros((300, n_embd), np.float16))
    writer.add_tensor("output_norm.weight", np.zeros(n_embd, np.float32))
    writer.add_tensor("output.weight", np.zeros((300, n_embd), np.float16))
    for il in range(n_layer):
        writer.add_tensor(f"blk.{il}.attn_q.weight", np.zeros((n_embd, n_embd), np.float16))
        writer.add_tensor(f"blk.{il}.ffn_up.weight", np.zeros((2 * n_embd, n_embd), np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def shape(**changes: object) -> ModelShape:
    base = ModelShape(
        arch="llama",
        n_layer=4,
        n_embd=256,
        n_ff=512,
        n_head=8,
        n_vocab=1000,
        n_ctx_train=8192,
        kv_heads=(4, 4, 4, 4),
        head_dim_k=32,
        head_dim_v=32,
        n_swa=0,
        swa_layers=(False,) * 4,
        input_bytes=1000,
        output_bytes=2000,
        layer_bytes=(100, 100, 100, 100),
    )
    return replace(base, **changes)  # type: ignore[arg-type]


def test_header_reader_matches_gguf_py(tmp_path: Path) -> None:
    path = write_gguf(tmp_path / "m.gguf")
    header = read_header(path)
    assert header.metadata["llama.block_count"] == 2
    assert header.metadata["tokenizer.ggml.tokens"] == SkippedArray(300)
    reference = gguf.GGUFReader(str(path))
    for kept in ("tokenizer.ggml.scores", "tokenizer.ggml.token_type"):  # numeric arrays
        assert header.metadata[kept] == tuple(reference.fields[kept].contents())
    ours = {t.name: (t.shape, t.nbytes) for t in header.tensors}
    theirs = {t.name: (tuple(int(d) for d in t.shape), int(t.n_bytes)) for t in reference.tensors}
    assert ours == theirs


def test_read_shape(tmp_path: Path) -> None:
    got = read_shape(write_gguf(tmp_path / "m.gguf", n_layer=3))
    assert (got.arch, got.n_layer, got.n_embd, got.n_ff, got.n_head) == ("llama", 3, 64, 128, 4)
    assert got.kv_heads == (2, 2, 2)
    assert got.head_dim_k == got.head_dim_v == 16
    assert got.n_vocab == 300
    assert got.input_bytes == 300 * 64 * 2
    assert got.output_bytes == 300 * 64 * 2 + 64 * 4
    assert got.layer_bytes == (64 * 64 * 2 + 128 * 64 * 4,) * 3


def test_bad_files(tmp_path: Path) -> None:
    (tmp_path / "empty.gguf").write_bytes(b"")
    (tmp_path / "text.gguf").write_bytes(b"hello world, not a model")
    good = write_gguf(tmp_path / "m.gguf").read_bytes()
    (tmp_path / "cut.gguf").write_bytes(good[:200])
    for name in ("empty.gguf", "text.gguf", "cut.gguf", "missing.gguf"):
        with pytest.raises(GgufError):
            read_header(tmp_path / name)


def test_kv_cache_formula_and_cache_types() -> None:
    s = shape()
    f16 = estimate_shape(s, {"c": "4096", "np": "1"}, ["host"]).devices["host"]
    # 4 layers x 4096 cells x (128 K + 128 V) x 2 bytes
    assert f16.kv == 4 * 4096 * 256 * 2
    q8 = estimate_shape(s, {"c": "4096", "np": "1", "ctk": "q8_0", "ctv": "q8_0"}, ["host"])
    assert q8.devices["host"].kv == 4 * 4096 * 2 * (128 // 32 * 34)
    q4k = estimate_shape(s, {"ctx-size": "4096", "cache-type-k": "q4_0"}, ["host"])
    assert q4k.devices["host"].kv == 4 * 4096 * (128 // 32 * 18 + 128 * 2)
    assert f16.weights == 1000 + 2000 + 400


def test_kv_cells_padding_and_parallel_streams() -> None:
    s = shape()
    assert estimate_shape(s, {"c": "1000"}, ["host"]).context == 1024
    # -np 4 explicit: four streams of 512/4 cells, each padded to 256.
    assert estimate_shape(s, {"c": "512", "np": "4"}, ["host"]).context == 1024
    assert estimate_shape(s, {"c": "512", "np": "4", "kvu": None}, ["host"]).context == 512
    assert estimate_shape(s, {"c": "1000", "np": "3"}, ["host"]).context == 1536
    assert estimate_shape(s, {}, ["host"]).context == 8192  # -c unset: trained context


def test_sliding_window_layers_keep_only_the_window() -> None:
    s = shape(n_swa=512, swa_layers=(True, True, True, False))
    est = estimate_shape(s, {"c": "8192", "np": "1"}, ["host"])
    per_cell = 256 * 2
    window = 512 + 512  # n_swa x 1 stream + ubatch
    assert est.devices["host"].kv == 3 * window * per_cell + 8192 * per_cell
    assert est.kv_bytes_per_token["host"] == per_cell + 512 * 2  # full layer + mask row
    full = estimate_shape(s, {"c": "8192", "np": "1", "swa-full": None}, ["host"])
    assert full.devices["host"].kv == 4 * 8192 * per_cell


def test_output_and_compute() -> None:
    est = estimate_shape(shape(), {"c": "4096"}, ["host"]).devices["host"]
    assert est.output == 4 * 1000 * 4  # four slots x n_vocab floats
    # mask 512 x 4096 x f16 + 4 x 512 x (4 e + 2 f + e)
    assert est.compute == 512 * 4096 * 2 + 4 * 512 * (5 * 256 + 2 * 512)
    no_fa = estimate_shape(shape(), {"c": "4096", "fa": "off"}, ["host"]).devices["host"]
    assert no_fa.compute > est.compute + 512 * 4096 * 8 * 4


def test_gpu_placement_by_n_gpu_layers() -> None:
    s = shape()
    everything = estimate_shape(s, {"c": "4096"}, ["host", "CUDA0"])
    assert everything.devices["host"].weights == 1000  # token embeddings stay on the host
    assert everything.devices["CUDA0"].weights == 400 + 2000
    assert everything.devices["host"].kv == 0
    two = estimate_shape(s, {"c": "4096", "ngl": "2"}, ["host", "CUDA0"])
    # the last two of five "layers": layer 3 and the output head
    assert two.devices["CUDA0"].weights == 100 + 2000
    assert two.devices["host"].weights == 1000 + 300
    split = estimate_shape(s, {"c": "4096", "ts": "1,1"}, ["host", "CUDA0", "CUDA1"])
    assert split.devices["CUDA0"].weights == 300
    assert split.devices["CUDA1"].weights == 100 + 2000
    nkvo = estimate_shape(s, {"c": "4096", "nkvo": None}, ["host", "CUDA0"])
    assert nkvo.devices["CUDA0"].kv == 0
    assert nkvo.devices["host"].kv == everything.devices["CUDA0"].kv


def test_min_and_max() -> None:
    s = shape()
    assert min_context(s, {"c": "2048"}) == 2048
    assert min_context(s, {}) == 4096
    assert min_context(s, {"np": "2"}) == 8192
    assert min_context(shape(n_ctx_train=2048), {}) == 2048
    assert min_context(s, {"fit": "off"}) == 8192
    pinned = range_for_shape(s, {"c": "2048"}, ["host"], {"host": 1 << 40})
    assert pinned.min == pinned.max
    low = estimate_shape(s, {}, ["host"], context=4096).devices["host"].total
    budget = low + 2048 * estimate_shape(s, {}, ["host"]).kv_bytes_per_token["host"]
    ranged = range_for_shape(s, {}, ["host"], {"host": budget})
    assert ranged.min.context == 4096
    assert ranged.max.context == 6144
    assert ranged.max.devices["host"].total <= budget
    roomy = range_for_shape(s, {}, ["host"], {"host": 1 << 40})
    assert roomy.max.context == 8192  # capped by the trained context


def test_options_errors() -> None:
    with pytest.raises(ConfigError):
        estimate_shape(shape(), {"c": "lots"}, ["host"])
    with pytest.raises(ConfigError):
        estimate_shape(shape(), {"ctk": "q3_x"}, ["host"])


def test_estimate_from_file(tmp_path: Path) -> None:
    est = estimate(write_gguf(tmp_path / "m.gguf"), {"c": "512"}, ["host"])
    assert est.total == est.devices["host"].total > 0
    assert est.per_device() == {"host": est.total}


def test_parse_buffer_lines() -> None:
    lines: list[str | bytes] = [
        "0.00.011.952 I load_tensors:   CPU_Mapped model buffer size =     5.74 MiB",
        "load_tensors:        CUDA0 model buffer size =   448.00 MiB",
        "llama_context:        CPU  output buffer size =     0.02 MiB",
        b"llama_kv_cache:      CUDA0 KV buffer size =    64.00 MiB \xff\xfe",
        "sched_reserve:      CUDA0 compute buffer size =    10.00 MiB",
        "sched_reserve:      CUDA0 compute buffer size =    12.00 MiB",  # reserved again
        "sched_reserve:  CUDA_Host compute buffer size =     1.00 MiB",
        "print_info: n_ctx_train = 2048",
    ]
    logged = LoggedBuffers().feed_all(lines)
    assert logged.by_kind("CUDA0") == {
        "model": 448 * MIB,
        "KV": 64 * MIB,
        "output": 0,
        "compute": 12 * MIB,
        "mmproj": 0,
    }
    assert logged.by_kind("host")["compute"] == MIB
    assert logged.per_device()["host"] == round(5.74 * MIB) + round(0.02 * MIB) + MIB
    assert parse_buffer_line("no buffer here") is None
    assert buffer_device("Vulkan0") == "Vulkan0"
    assert buffer_device("CPU_REPACK") == "host"
    assert buffer_device("AMX") == "host"


def test_logged_kv_buffers_of_one_context_add_up() -> None:
    # gemma3 (iSWA) logs its full and its sliding layers' caches apart; a second context
    # (its output line first) replaces the first one's figures, the weights stay.
    lines = [
        "load_tensors:          AMX model buffer size =     0.41 MiB",
        "load_tensors:   CPU_Mapped model buffer size =     0.49 MiB",
        "llama_context:        CPU  output buffer size =     0.02 MiB",
        "llama_kv_cache:        CPU KV buffer size =     0.06 MiB",
        "llama_kv_cache:        CPU KV buffer size =     0.31 MiB",
        "llama_memory_recurrent:        CPU RS buffer size =     0.12 MiB",
        "sched_reserve:        CPU compute buffer size =     2.14 MiB",
    ]
    logged = LoggedBuffers().feed_all(lines)
    assert logged.by_kind("host") == {
        "model": round(0.41 * MIB) + round(0.49 * MIB),
        "KV": round(0.06 * MIB) + round(0.31 * MIB) + round(0.12 * MIB),
        "output": round(0.02 * MIB),
        "compute": round(2.14 * MIB),
        "mmproj": 0,
    }
    logged.feed_all(lines[2:4])
    assert logged.by_kind("host")["KV"] == round(0.06 * MIB)
    assert logged.by_kind("host")["model"] == round(0.90 * MIB)


def test_amx_copies_count_unless_repacking_is_off(tmp_path: Path) -> None:
    # llama.cpp copies f16 matmul weights into the AMX buffer on CPUs that have it; the
    # mapped file stays. --no-repack turns the copies off.
    from tests.arch_models import ARCH_MODELS, write_arch_model

    model = next(m for m in ARCH_MODELS if m.arch == "qwen3")
    shape = read_shape(write_arch_model(tmp_path / model.file_name, model))
    plain = estimate_shape(shape, {"c": "512"}, ["host"], amx=False).devices["host"].weights
    amx = estimate_shape(shape, {"c": "512"}, ["host"], amx=True).devices["host"].weights
    off = estimate_shape(shape, {"c": "512", "nr": None}, ["host"], amx=True)
    copies = sum(shape.amx_layer_bytes) + shape.amx_output_bytes
    assert plain == shape.weight_bytes
    assert amx == plain + copies - shape.amx_unmapped_bytes
    assert off.devices["host"].weights == plain


def test_recurrent_state_and_mla_cache(tmp_path: Path) -> None:
    from tests.arch_models import ARCH_MODELS, write_arch_model

    by_arch = {m.arch: m for m in ARCH_MODELS}
    mamba = read_shape(write_arch_model(tmp_path / "m.gguf", by_arch["mamba2"]))
    # (d_conv - 1) x (d_inner + 2 groups x d_state) + d_state x d_inner floats per sequence
    assert mamba.recurrent_bytes == (4 * (3 * (128 + 2 * 16) + 16 * 128),) * 4
    est = estimate_shape(mamba, {"c": "4096", "np": "2"}, ["host"], amx=False)
    assert est.devices["host"].kv == 2 * sum(mamba.recurrent_bytes)  # no KV cells at all
    mla = read_shape(write_arch_model(tmp_path / "d.gguf", by_arch["deepseek2"]))
    est = estimate_shape(mla, {"c": "512", "np": "1"}, ["host"], amx=False)
    assert est.devices["host"].kv == 4 * 512 * 96 * 2  # K rows of the latent only, f16


def test_logged_vision_projector_is_its_own_kind() -> None:
    # clip.cpp's graph line looks like the text model's: it must not replace that one.
    lines = [
        "sched_reserve:        CPU compute buffer size =     1.64 MiB",
        "clip_ctx: CLIP using CPU backend",
        "load_hparams: model size:         0.34 MiB",
        "reserve_compute_meta:        CPU compute buffer size =     4.50 MiB",
    ]
    host = LoggedBuffers().feed_all(lines).by_kind("host")
    assert host["compute"] == round(1.64 * MIB)
    assert host["mmproj"] == round(0.34 * MIB) + round(4.5 * MIB)
