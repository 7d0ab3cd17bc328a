"""Weights the CPU backend copies a second time: llama.cpp's AMX buffer.

On a CPU with Intel AMX (Sapphire Rapids and later), llama.cpp's CPU backend keeps, next to the
memory-mapped file, a repacked copy of every weight it multiplies with AMX kernels: it logs
``AMX model buffer size`` at ``-lv 4``, and that copy is private memory of the child. For the
real SmolLM2-135M (Q4_1) it is 95 MiB on top of the 92 MiB file: an estimate from the file alone
is half the truth there. ``--no-repack`` turns it off.

Which weights (``ggml-cpu/amx/amx.cpp``, ``supports_op`` and ``get_alloc_size``): the ``src0`` of
a ``MUL_MAT`` (2-D weights; not embeddings looked up by row, not 3-D expert stacks), of a type
with AMX kernels or F16, with ``ne1`` (output rows) a multiple of 32 and ``ne0`` a multiple of
the type's alignment. A tied output head (no ``output.weight``) multiplies ``token_embd`` too.
Repacked types take ``ne1`` rows of ``ne0 / block`` blocks, plus per-block extras (an ``int32``
compensation for Q8_0, scales for Q4_K/Q5_K/IQ4_XS); F16 is copied as it is.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

from node_agent.memory.gguf_header import TensorInfo

Q = GGMLQuantizationType
# Type -> (alignment of ne0, extra bytes per block in the repacked layout); F16 is not repacked.
_AMX_TYPES: Final = {
    Q.Q4_0: (32, 0),
    Q.Q4_1: (32, 0),
    Q.Q8_0: (32, 4),
    Q.Q4_K: (256, 4),
    Q.Q5_K: (256, 4),
    Q.Q6_K: (256, 0),
    Q.IQ4_XS: (256, 2),
    Q.F16: (16, 0),
}
_ROWS_MULTIPLE: Final = 32  # 2 x TILE_N
# Weights read by row (GET_ROWS), never multiplied: not candidates (a tied head is handled apart).
_LOOKED_UP: Final = ("token_embd.", "position_embd.", "token_types.")
# 2-D weights of other operations (convolutions, norms of 2-D shape in some architectures).
_NOT_MATMUL: Final = ("conv", "norm")


@dataclass(frozen=True)
class HostCpu:
    """What the estimator needs to know of this machine's CPUs."""

    amx: bool


NO_AMX: Final = HostCpu(amx=False)


def this_cpu() -> HostCpu:
    return HostCpu(amx=cpu_has_amx())


@functools.cache
def cpu_has_amx(cpuinfo: Path = Path("/proc/cpuinfo")) -> bool:
    """Whether this machine's CPUs have AMX tiles with int8 (the kernels llama.cpp uses)."""
    try:
        text = cpuinfo.read_text(errors="replace")
    except OSError:
        return False
    for line in text.splitlines():
        if line.startswith("flags"):
            flags = set(line.partition(":")[2].split())
            return {"amx_tile", "amx_int8"} <= flags
    return False


def amx_copy_bytes(tensor: TensorInfo, *, as_output_head: bool = False) -> int:
    """Bytes of ``tensor``'s AMX copy; 0 when the CPU backend would not make one.

    ``as_output_head``: ``token_embd`` standing in for a missing ``output.weight``.
    """
    if len(tensor.shape) != 2:
        return 0
    if not as_output_head and (
        tensor.name.startswith(_LOOKED_UP) or any(part in tensor.name for part in _NOT_MATMUL)
    ):
        return 0
    try:
        kind = Q(tensor.ggml_type)
    except ValueError:
        return 0
    if kind not in _AMX_TYPES:
        return 0
    alignment, extra = _AMX_TYPES[kind]
    k, n = tensor.shape
    if n % _ROWS_MULTIPLE or k % alignment:
        return 0
    if kind == Q.F16:
        return tensor.nbytes
    block_elements, block_bytes = GGML_QUANT_SIZES[kind]
    blocks = k // block_elements
    return n * blocks * (block_bytes + extra)
