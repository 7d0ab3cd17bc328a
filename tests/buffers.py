"""The buffer sizes a llama-server child logs at ``-lv 4``, read from its stderr lines.

Lines look like ``load_tensors:   CPU_Mapped model buffer size =     5.74 MiB`` or
``llama_kv_cache:      CUDA0 KV buffer size =   448.00 MiB``. They cross-check the host's
``smaps_rollup`` reading (which also counts the binary and its libraries) and are the
reference the estimator's accuracy test compares against.

The sizes are printed in MiB with two decimals, so each is exact to ±5 KiB.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

MIB = 1 << 20
KINDS = ("model", "KV", "RS", "output", "compute", "mmproj")

_LINE = re.compile(
    rb"\s(?P<buffer>[A-Za-z][\w-]*)\s+(?P<kind>model|KV|RS|output|compute) buffer size\s*=\s*"
    rb"(?P<mib>\d+(?:\.\d+)?) MiB"
)


@dataclass(frozen=True)
class BufferLine:
    buffer: str  # ggml's buffer type name: CPU, CPU_Mapped, CUDA0, CUDA_Host, Vulkan0…
    kind: str  # one of KINDS
    size: int  # bytes

    @property
    def device(self) -> str:
        return buffer_device(self.buffer)


# ggml-cpu's extra buffer types: weights repacked for the CPU's matrix units, in host memory.
_HOST_EXTRA = ("AMX", "KLEIDIAI", "SPACEMIT")


def buffer_device(buffer: str) -> str:
    """The ledger's device for a ggml buffer type: host memory for CPU and pinned buffers."""
    if (
        buffer.startswith(("CPU", *_HOST_EXTRA))
        or buffer.endswith("_Host")
        or buffer == "Metal_Mapped"
    ):
        return "host"
    return buffer.removesuffix("_Mapped").removesuffix("_Split")


# The vision projector (tools/mtmd/clip.cpp) logs its weights as ``load_hparams: model size:``
# and, in newer builds, its graph as ``reserve_compute_meta: CPU compute buffer size``: both
# are the projector's (kind ``mmproj``), on the backend its ``CLIP using X backend`` names.
_CLIP_WEIGHTS = re.compile(rb"load_hparams: model size:\s*(?P<mib>\d+(?:\.\d+)?) MiB")
_CLIP_COMPUTE = (b"reserve_compute_meta:", b"alloc_compute_meta:")
_CLIP_BACKEND = re.compile(rb"CLIP using (?P<buffer>[A-Za-z][\w-]*) backend")


def parse_buffer_line(line: str | bytes, clip_buffer: str = "CPU") -> BufferLine | None:
    """The buffer a log line reports, or None; stderr may hold bytes that are not UTF-8.

    ``clip_buffer``: the projector's backend, for its weights line (which names none).
    """
    raw = line.encode("utf-8", "replace") if isinstance(line, str) else line
    clip = _CLIP_WEIGHTS.search(raw)
    if clip is not None:
        return BufferLine(clip_buffer, "mmproj", round(float(clip["mib"]) * MIB))
    match = _LINE.search(raw)
    if match is None:
        return None
    size = round(float(match["mib"]) * MIB)
    kind = "mmproj" if any(f in raw for f in _CLIP_COMPUTE) else match["kind"].decode()
    return BufferLine(match["buffer"].decode(), kind, size)


@dataclass
class LoggedBuffers:
    """Buffers seen in a child's log so far, by (buffer type, kind).

    Model buffers add up (one per buffer type: mapped file and repacked weights are two), and
    so do the vision projector's weights and graph (``mmproj``).
    So do the KV and RS lines of one context: a sliding-window model logs one KV buffer for
    its full layers and one for its sliding ones, a hybrid one KV and one RS. A context logs
    its output buffer first, so an output line starts a new context's figures. Compute
    buffers are replaced when logged again: a context that reserves its graph twice (a retry
    with a smaller ubatch) holds only the last one.
    """

    sizes: dict[tuple[str, str], int] = field(default_factory=dict)
    clip_buffer: str = "CPU"

    def feed(self, line: str | bytes) -> BufferLine | None:
        raw = line.encode("utf-8", "replace") if isinstance(line, str) else line
        backend = _CLIP_BACKEND.search(raw)
        if backend is not None:
            self.clip_buffer = backend["buffer"].decode()
        found = parse_buffer_line(raw, self.clip_buffer)
        if found is not None:
            key = (found.buffer, found.kind)
            if found.kind == "output":
                self.sizes = {k: v for k, v in self.sizes.items() if k[1] == "model"}
            if found.kind in ("model", "KV", "RS", "mmproj"):
                self.sizes[key] = self.sizes.get(key, 0) + found.size
            else:
                self.sizes[key] = found.size
        return found

    def feed_all(self, lines: Iterable[str | bytes]) -> LoggedBuffers:
        for line in lines:
            self.feed(line)
        return self

    def by_kind(self, device: str | None = None) -> dict[str, int]:
        """Bytes per kind (``RS`` folded into ``KV``), on one device or all."""
        out = dict.fromkeys(("model", "KV", "output", "compute", "mmproj"), 0)
        for (buffer, kind), size in self.sizes.items():
            if device is None or buffer_device(buffer) == device:
                out["KV" if kind == "RS" else kind] += size
        return out

    def per_device(self) -> Mapping[str, int]:
        out: dict[str, int] = {}
        for (buffer, _kind), size in self.sizes.items():
            dev = buffer_device(buffer)
            out[dev] = out.get(dev, 0) + size
        return out

    @property
    def total(self) -> int:
        return sum(self.sizes.values())
