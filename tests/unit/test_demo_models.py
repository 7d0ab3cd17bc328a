"""The demo model generator: vocabulary, determinism, skip logic and the output-head guard."""

from __future__ import annotations

import dataclasses
import hashlib
from pathlib import Path
from typing import Any

import gguf
import numpy as np
import numpy.typing as npt
import pytest

from node_agent import demo_models as dm

# Smaller than demo-tiny so that writing it many times stays in the milliseconds.
MICRO = dm.DemoModel(
    "micro", 0.4, n_layer=2, n_embd=32, n_head=2, n_head_kv=1, n_ff=64, n_vocab=1024, seed=7
)


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def field(reader: gguf.GGUFReader, key: str) -> Any:
    return reader.fields[key].contents()


def test_vocab_layout() -> None:
    tokens, scores, types = dm.build_vocab(1024)
    assert len(tokens) == len(scores) == len(types) == 1024
    assert len(set(tokens)) == 1024
    assert tokens[: dm.FIRST_BYTE_ID] == ["<unk>", "<s>", "</s>", "<|im_start|>", "<|im_end|>"]
    assert types[: dm.FIRST_BYTE_ID] == [gguf.TokenType.UNKNOWN] + [gguf.TokenType.CONTROL] * 4
    byte_tokens = tokens[dm.FIRST_BYTE_ID : dm.FIRST_PIECE_ID]
    assert byte_tokens == [f"<0x{b:02X}>" for b in range(256)]
    assert set(types[dm.FIRST_BYTE_ID : dm.FIRST_PIECE_ID]) == {gguf.TokenType.BYTE}
    pieces = tokens[dm.FIRST_PIECE_ID :]
    assert set(types[dm.FIRST_PIECE_ID :]) == {gguf.TokenType.NORMAL}
    assert "\u2581the" in pieces
    # Every plain piece decodes to printable ASCII: the model can only ever emit valid UTF-8.
    assert all(p.replace("\u2581", " ").isascii() and p.isprintable() for p in pieces)
    # SentencePiece prefers higher scores: pieces are ranked, specials carry 0.
    assert scores[dm.FIRST_PIECE_ID :] == sorted(scores[dm.FIRST_PIECE_ID :], reverse=True)


def test_same_arguments_give_byte_identical_files(tmp_path: Path) -> None:
    a = dm.write_model(tmp_path / "a" / "m.gguf", MICRO)
    b = dm.write_model(tmp_path / "b" / "m.gguf", MICRO)
    c = dm.write_model(tmp_path / "c" / "m.gguf", dataclasses.replace(MICRO, seed=8))
    assert sha256(a) == sha256(b)
    assert sha256(a) != sha256(c)


def test_existing_identical_file_is_not_rewritten(tmp_path: Path) -> None:
    path = dm.write_model(tmp_path / "m.gguf", MICRO)
    before = path.stat()
    dm.write_model(path, MICRO)
    after = path.stat()
    assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)


def test_stale_or_damaged_file_is_rewritten(tmp_path: Path) -> None:
    path = dm.write_model(tmp_path / "m.gguf", MICRO)
    good = sha256(path)
    other = dataclasses.replace(MICRO, seed=99)
    dm.write_model(path, other)
    assert dm.is_current(path, other) and not dm.is_current(path, MICRO)

    dm.write_model(path, MICRO)
    path.write_bytes(path.read_bytes()[:-4096])  # truncated, e.g. by a full disk
    assert not dm.is_current(path, MICRO)
    dm.write_model(path, MICRO)
    assert sha256(path) == good
    assert list(tmp_path.iterdir()) == [path]  # no temporary file left behind


def test_metadata_is_what_llama_cpp_reads(tmp_path: Path) -> None:
    reader = gguf.GGUFReader(dm.write_model(tmp_path / "m.gguf", MICRO))
    assert field(reader, "general.architecture") == "llama"
    assert field(reader, "general.name") == "micro"
    assert field(reader, "llama.context_length") == 4096
    assert field(reader, "llama.block_count") == 2
    assert field(reader, "llama.attention.head_count_kv") == 1
    assert field(reader, "llama.rope.dimension_count") == 16
    assert field(reader, "tokenizer.ggml.model") == "llama"
    assert field(reader, "tokenizer.ggml.bos_token_id") == dm.BOS_ID
    assert field(reader, "tokenizer.ggml.eos_token_id") == dm.EOS_ID
    assert field(reader, "tokenizer.ggml.unknown_token_id") == dm.UNK_ID
    assert "<|im_start|>" in field(reader, "tokenizer.chat_template")
    assert field(reader, "tokenizer.ggml.tokens")[dm.FIRST_BYTE_ID] == "<0x00>"
    names = {t.name for t in reader.tensors}
    assert {"token_embd.weight", "output.weight", "blk.1.ffn_down.weight"} <= names


def single_token_logits(path: Path, config: dm.DemoModel) -> npt.NDArray[np.float64]:
    """Logits after each token alone, by a numpy forward pass over the weights in the file.

    With one token, attention attends only to itself, so each block is just W_o·W_v·x plus the
    SwiGLU MLP: enough to check the output head without a server.
    """
    reader = gguf.GGUFReader(path)
    w = {t.name: np.asarray(t.data, dtype=np.float64) for t in reader.tensors}

    def norm(x: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
        mean_square: npt.NDArray[np.float64] = np.mean(x * x, axis=-1, keepdims=True)
        return x / np.sqrt(mean_square + config.rms_eps)

    h = w["token_embd.weight"]  # every token of the vocabulary at once
    group = config.n_head // config.n_head_kv
    for i in range(config.n_layer):
        p = f"blk.{i}."
        v = (norm(h) * w[p + "attn_norm.weight"]) @ w[p + "attn_v.weight"].T
        heads = v.reshape(len(h), config.n_head_kv, config.head_dim).repeat(group, axis=1)
        h = h + heads.reshape(len(h), -1) @ w[p + "attn_output.weight"].T
        x = norm(h) * w[p + "ffn_norm.weight"]
        gate, up = x @ w[p + "ffn_gate.weight"].T, x @ w[p + "ffn_up.weight"].T
        h = h + (gate / (1 + np.exp(-gate)) * up) @ w[p + "ffn_down.weight"].T
    return (norm(h) * w["output_norm.weight"]) @ w["output.weight"].T


@pytest.mark.parametrize("config", [MICRO, dm.DEMO_MODELS[0]], ids=lambda c: c.name)
def test_byte_and_control_tokens_can_never_be_sampled(tmp_path: Path, config: Any) -> None:
    logits = single_token_logits(dm.write_model(tmp_path / "m.gguf", config), config)
    _, _, types = dm.build_vocab(config.n_vocab)
    banned = np.array([t != gguf.TokenType.NORMAL for t in types])
    banned[dm.EOS_ID] = False  # </s> stays possible, rarely, so some answers stop early
    gap = logits[:, ~banned].max(axis=1) - logits[:, banned].max(axis=1)
    # exp(-100 / 1.5) ≈ 1e-29: never sampled, even at temperature 1.5 with no top-k.
    assert gap.min() > 100
    # …while allowed tokens keep a spread-out distribution, so output varies.
    assert 1 < logits[:, ~banned].std() < 10


@pytest.mark.parametrize("config", dm.DEMO_MODELS, ids=lambda c: c.name)
def test_declared_sizes_match_shapes(config: dm.DemoModel) -> None:
    assert config.n_params * 2 / 1e6 == pytest.approx(config.approx_mb, rel=0.25)


def test_tiny_file_size_matches(tmp_path: Path) -> None:
    tiny = dm.DEMO_MODELS[0]
    size = dm.write_model(tmp_path / tiny.file_name, tiny).stat().st_size
    assert size / 1e6 == pytest.approx(tiny.approx_mb, rel=0.25)


def test_invalid_shapes_are_refused() -> None:
    with pytest.raises(ValueError, match="divide"):
        dataclasses.replace(MICRO, n_head=3)
    with pytest.raises(ValueError, match="n_vocab"):
        dataclasses.replace(MICRO, n_vocab=300)
    with pytest.raises(ValueError, match="n_vocab"):
        dataclasses.replace(MICRO, n_vocab=10**6)
