"""Estimate what a llama-server child will allocate, from the GGUF header alone.

The four buffers llama-server logs at ``-lv 4`` (``model``, ``KV``, ``output``, ``compute``),
per device, for a preset's options. No measurement child: reading the header in-process takes
well under a millisecond, so admission can estimate before every load.

How each buffer is sized (checked against the pinned binary, see
``tests/integration/test_estimator_accuracy.py``):

* **Weights**: every tensor's bytes by its ggml type. Token embeddings stay on the host;
  with ``-ngl N`` the last N of the ``n_layer + 1`` "layers" (the output head counts as the
  last one) go to the GPUs, split by ``--tensor-split`` (equal shares when absent). On a
  CPU with AMX (and ``--repack`` on, the default), the host's matmul weights are copied
  into the AMX buffer besides the mapped file: they count twice (``AMX model buffer``),
  except the leading and trailing runs of such tensors, whose file range llama.cpp unmaps
  (``CPU_Mapped`` is the span of the tensors left mapped).
* **Recurrent state** (mamba2, the recurrent layers of hybrids): per layer and sequence a
  conv and an SSM state in f32, logged as ``RS``; counted with the KV cache.
* **KV cache**: cells x (K width x K type bytes + V width x V type bytes) per layer, widths =
  KV heads x head dim. Cells: ``-c`` (0 = trained context) padded to 256. With ``-np N`` and
  a non-unified cache each of the N streams gets ``ctx / N`` cells, padded to 256 again (so
  ``-c 512 -np 4`` really allocates 1024 cells). ``-np`` unset means 4 slots sharing one
  unified cache. Sliding-window layers keep only ``window x streams + ubatch`` cells, unless
  ``--swa-full``.
* **Output**: one row of logits (n_vocab floats) per sequence, on the host.
* **Compute**: the graph for one ubatch of T tokens. Measured on the CPU backend, it is the
  attention mask (T x KV cells per stream, f16 with flash attention) plus the live
  activations at the FFN peak, ``4 x T x (4 n_embd + 2 n_ff)`` bytes, plus one more
  ``n_ff`` row when ``n_ff > 2 n_embd`` (the allocator cannot fit it in freed embedding-sized
  holes any more), else one more ``n_embd`` row past two layers (fragmentation, measured);
  SSM layers add 1.25 input projections. Sliding-window models have a second mask for their
  window. Without flash attention the peak is the larger of that and the attention's: the
  KQ matrix (T x cells x heads, f32), the masks and six embedding rows. GPU
  backends build the same graph; where layers are offloaded the host keeps only the input
  rows (calibrated on CPU only: no GPU on our machines).
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

from node_agent.errors import ConfigError
from node_agent.memory.shape import ModelShape, VisionShape, read_shape, read_vision_shape

HOST = "host"
KV_PAD = 256  # llama.cpp pads the KV cache (and each stream of it) to 256 cells
DEFAULT_SLOTS = 4  # llama-server's "-np auto"
FIT_CTX = 4096  # llama-server's --fit-ctx default: the smallest context --fit may choose
# Host memory a loaded projector takes beside its buffers (clip context, its thread pool):
# measured as a child's private dirty pages with and without --mmproj, 3.6-3.8 MiB whatever
# the image size.
MMPROJ_HEAP = 15 << 18  # 3.75 MiB

# Short and alternative option names → the long names read here (llama-server --help).
_ALIASES = {
    "c": "ctx-size",
    "np": "parallel",
    "ctk": "cache-type-k",
    "ctv": "cache-type-v",
    "ngl": "n-gpu-layers",
    "gpu-layers": "n-gpu-layers",
    "ub": "ubatch-size",
    "b": "batch-size",
    "fa": "flash-attn",
    "kvu": "kv-unified",
    "no-kvu": "no-kv-unified",
    "nkvo": "no-kv-offload",
    "ts": "tensor-split",
    "sm": "split-mode",
    "mg": "main-gpu",
    "fitc": "fit-ctx",
    "embedding": "embeddings",
    "nr": "no-repack",
    "mm": "mmproj",
    "no-mmproj-offload": "no-mmproj-offload",
}


@dataclass(frozen=True)
class DeviceEstimate:
    """Bytes of each buffer on one device."""

    weights: int = 0
    kv: int = 0
    output: int = 0
    compute: int = 0
    mmproj: int = 0  # the vision projector's weights and graph (llama.cpp's router omits it)

    @property
    def total(self) -> int:
        return self.weights + self.kv + self.output + self.compute + self.mmproj


@dataclass(frozen=True)
class MemoryEstimate:
    """One configuration's buffers per device, at ``context`` KV cells in all."""

    context: int
    n_seq: int
    devices: Mapping[str, DeviceEstimate]
    # Bytes each further token of context costs per device (KV cache and attention mask):
    # how the ledger and GET /models explain the gap between min and max.
    kv_bytes_per_token: Mapping[str, int] = field(default_factory=dict)

    @property
    def total(self) -> int:
        return sum(d.total for d in self.devices.values())

    def per_device(self) -> dict[str, int]:
        return {name: d.total for name, d in self.devices.items() if d.total}


@dataclass(frozen=True)
class MemoryRange:
    """``min``: at the smallest context the model may run with; ``max``: the largest that fits."""

    min: MemoryEstimate
    max: MemoryEstimate


@dataclass(frozen=True)
class _Config:
    ctx: int  # requested context, 0 = trained
    n_seq: int
    unified: bool
    type_k: int
    type_v: int
    ubatch: int
    flash_attn: bool
    swa_full: bool
    kv_offload: bool
    embeddings: bool
    repack: bool
    mmproj_offload: bool
    ngl: int | None  # None = all layers
    split: tuple[float, ...] | None
    split_none: bool
    main_gpu: int


def estimate(
    path: Path,
    options: Mapping[str, str | None],
    devices: Sequence[str],
    *,
    context: int | None = None,
) -> MemoryEstimate:
    """Estimate the buffers of ``path`` under llama-server ``options`` on ``devices``.

    ``options`` are llama-server options by name without dashes (long or short; ``None`` for
    a flag); ``devices`` the ledger's device names (``host``, ``CUDA0``…). ``context``
    overrides ``-c``.
    """
    vision = _vision(options)
    return estimate_shape(read_shape(path), options, devices, context=context, vision=vision)


def estimate_range(
    path: Path,
    options: Mapping[str, str | None],
    devices: Sequence[str],
    budget: Mapping[str, int] | None = None,
) -> MemoryRange:
    """``min`` and ``max`` as the spec defines them; ``budget``: bytes available per device now."""
    return range_for_shape(read_shape(path), options, devices, budget, vision=_vision(options))


def range_for_shape(
    shape: ModelShape,
    options: Mapping[str, str | None],
    devices: Sequence[str],
    budget: Mapping[str, int] | None = None,
    *,
    vision: VisionShape | None = None,
) -> MemoryRange:
    cfg = _config(options)
    low = min_context(shape, options)
    smallest = estimate_shape(shape, options, devices, context=low, vision=vision)
    if cfg.ctx > 0 or budget is None:
        # A pinned -c leaves --fit nothing to choose: max is min. Without a budget the best
        # we can say is the trained context.
        top = (
            smallest
            if cfg.ctx > 0
            else estimate_shape(shape, options, devices, context=0, vision=vision)
        )
        return MemoryRange(smallest, top)

    def fits(ctx: int) -> bool:
        est = estimate_shape(shape, options, devices, context=ctx, vision=vision)
        return all(d.total <= budget.get(name, d.total) for name, d in est.devices.items())

    best, lo, hi = low, low // KV_PAD, max(low, shape.n_ctx_train) // KV_PAD
    while lo <= hi:  # the largest multiple of 256 cells that fits (all buffers grow with ctx)
        mid = (lo + hi) // 2
        if mid * KV_PAD >= low and fits(mid * KV_PAD):
            best, lo = mid * KV_PAD, mid + 1
        else:
            hi = mid - 1
    return MemoryRange(
        smallest, estimate_shape(shape, options, devices, context=best, vision=vision)
    )


def min_context(shape: ModelShape, options: Mapping[str, str | None]) -> int:
    """The preset's ``-c``; else --fit's floor (4096 per parallel sequence), at most trained."""
    cfg = _config(options)
    if cfg.ctx > 0:
        return cfg.ctx
    opts = _normalise(options)
    if (opts.get("fit") or "on").lower() == "off":
        return shape.n_ctx_train
    explicit = _int_opt(opts, "parallel", -1)
    floor = _int_opt(opts, "fit-ctx", FIT_CTX) * (explicit if explicit > 0 else 1)
    return min(floor, shape.n_ctx_train) if shape.n_ctx_train else floor


def estimate_shape(
    shape: ModelShape,
    options: Mapping[str, str | None],
    devices: Sequence[str],
    *,
    context: int | None = None,
    amx: bool | None = None,
    vision: VisionShape | None = None,
) -> MemoryEstimate:
    """``amx``: whether the host CPU has AMX (None: read it from /proc/cpuinfo); ``vision``:
    the ``--mmproj`` projector's shape."""
    cfg = _config(options)
    gpus = [d for d in devices if d != HOST]
    place = _placement(shape, cfg, gpus)
    ctx = cfg.ctx if context is None else context
    ctx = ctx if ctx > 0 else shape.n_ctx_train

    # Cells: per stream, then times the streams (see module docstring).
    streams = 1 if cfg.unified else cfg.n_seq
    cells_stream = _pad(_pad(ctx) // streams) if streams > 1 else _pad(ctx)
    swa_window = shape.n_swa * (cfg.n_seq if cfg.unified else 1) + cfg.ubatch
    swa_stream = cells_stream if cfg.swa_full else min(cells_stream, _pad(swa_window))

    weights: dict[str, int] = {HOST: shape.input_bytes}
    kv: dict[str, int] = {}
    slope: dict[str, int] = {}
    row_k = [_row_bytes(cfg.type_k, heads * shape.head_dim_k) for heads in shape.kv_heads]
    # MLA caches one latent row per cell: its V is a view of K (llama-kv-cache.cpp).
    v_dim = 0 if shape.mla else shape.head_dim_v
    row_v = [_row_bytes(cfg.type_v, heads * v_dim) for heads in shape.kv_heads]
    amx = cfg.repack and (host_has_amx() if amx is None else amx)
    for il in range(shape.n_layer):
        dev = place[il]
        weights[dev] = weights.get(dev, 0) + shape.layer_bytes[il]
        if amx and dev == HOST and shape.amx_layer_bytes:
            weights[HOST] += shape.amx_layer_bytes[il]
        kv_dev = dev if cfg.kv_offload else HOST
        if shape.recurrent_bytes:  # one state per sequence, whatever the context
            kv[kv_dev] = kv.get(kv_dev, 0) + shape.recurrent_bytes[il] * max(1, cfg.n_seq)
        per_cell = row_k[il] + row_v[il]
        swa = shape.swa_layers[il] and not cfg.swa_full
        kv[kv_dev] = kv.get(kv_dev, 0) + per_cell * (swa_stream if swa else cells_stream) * streams
        if not swa:
            slope[kv_dev] = slope.get(kv_dev, 0) + per_cell
    out_dev = place[shape.n_layer]
    weights[out_dev] = weights.get(out_dev, 0) + shape.output_bytes
    if amx and out_dev == HOST:
        weights[HOST] += shape.amx_output_bytes
    if amx and set(place) == {HOST}:
        weights[HOST] -= shape.amx_unmapped_bytes

    compute = _compute(shape, cfg, place, cells_stream, swa_stream, min(cfg.ubatch, _pad(ctx)))
    output = cfg.n_seq * 4 * (shape.n_vocab + (shape.n_embd if cfg.embeddings else 0))
    names = dict.fromkeys([HOST, *gpus])
    # The projector runs on the main GPU unless --no-mmproj-offload (clip.cpp's backend).
    mm_dev = gpus[min(cfg.main_gpu, len(gpus) - 1)] if gpus and cfg.mmproj_offload else HOST
    result = {
        name: DeviceEstimate(
            weights=weights.get(name, 0),
            kv=kv.get(name, 0),
            output=output if name == HOST else 0,
            compute=compute.get(name, 0),
            mmproj=_vision_bytes(vision) if vision is not None and name == mm_dev else 0,
        )
        for name in names
    }
    attends = any(shape.kv_heads)
    mask_per_token = cfg.ubatch * (2 if cfg.flash_attn else 4 + 4 * shape.n_head) * attends
    for dev in compute:
        if dev in slope or dev == out_dev:
            slope[dev] = slope.get(dev, 0) + mask_per_token
    return MemoryEstimate(cells_stream * streams, cfg.n_seq, result, slope)


def _compute(
    shape: ModelShape,
    cfg: _Config,
    place: Sequence[str],
    cells: int,
    swa_cells: int,
    tokens: int,
) -> dict[str, int]:
    """Compute buffers per device (the formula in the module docstring)."""
    ffn = 4 * (4 * shape.n_embd + 2 * shape.n_ff)
    if shape.n_ff > 2 * shape.n_embd:
        ffn += 4 * shape.n_ff
    elif shape.n_layer > 2:
        # Measured: past two layers the allocator's holes cost one more embedding row.
        ffn += 4 * shape.n_embd
    # Measured on mamba2, granitehybrid and qwen3next: the scan keeps about 1.25 input
    # projections per token alive besides the FFN's rows.
    ffn += 5 * shape.ssm_in_width
    recurrent = 0
    if any(shape.recurrent_bytes):
        # The state's rows per token: b11434 keeps two more embedding rows than the pinned
        # build (measured on mamba2, granitehybrid and lfm2): one row splits the difference.
        recurrent = 4 * shape.n_embd
    ffn += recurrent
    mask = 2 if cfg.flash_attn else 4  # f16 with flash attention, else f32
    masks = mask * cells if any(shape.kv_heads) else 0
    if any(shape.swa_layers):
        # The sliding layers have a cache and a mask of their own, --swa-full or not (the
        # cache is still split, only sized in full).
        masks += mask * swa_cells
    per_token = ffn + masks  # the masks are graph inputs: alive from start to end
    if any(shape.kv_heads):
        # The attention's peak: Q, K, V and the residual rows (six embedding rows, measured),
        # with flash attention off one layer's KQ matrix (f32, per head) too. The FFN's rows
        # come later and reuse that space, so the peak is the larger of the two.
        rows = 6 * shape.n_embd
        if shape.mla:  # absorbed MLA: Q and the output per head in the latent's width
            rows += shape.n_head * (shape.head_dim_k + shape.head_dim_v)
        kq = 0 if cfg.flash_attn else 4 * shape.n_head * cells
        per_token = max(per_token, 4 * rows + kq + masks + recurrent)
    full = tokens * per_token
    devices = set(place)
    if devices == {HOST}:
        return {HOST: full}
    # Offloaded: each GPU holding layers runs its part of the graph; the host keeps the
    # input embeddings (and a full graph of its own if some layers stayed there).
    result = {dev: full for dev in devices}
    result.setdefault(HOST, 2 * 4 * tokens * shape.n_embd)
    return result


def _placement(shape: ModelShape, cfg: _Config, gpus: Sequence[str]) -> list[str]:
    """Device of each layer, index ``n_layer`` being the output head (llama.cpp's rule)."""
    n = shape.n_layer + 1
    if not gpus:
        return [HOST] * n
    ngl = n if cfg.ngl is None else max(0, min(cfg.ngl, n))
    first = n - ngl
    if cfg.split_none:
        main = gpus[min(cfg.main_gpu, len(gpus) - 1)]
        return [HOST if il < first else main for il in range(n)]
    weights = cfg.split if cfg.split and len(cfg.split) == len(gpus) else (1.0,) * len(gpus)
    total = sum(weights) or 1.0
    bounds, acc = [], 0.0
    for w in weights:
        acc += w / total
        bounds.append(acc)
    place = []
    for il in range(n):
        if il < first:
            place.append(HOST)
            continue
        frac = (il - first) / ngl
        idx = next((i for i, b in enumerate(bounds) if frac < b), len(gpus) - 1)
        place.append(gpus[idx])
    return place


def _config(options: Mapping[str, str | None]) -> _Config:
    opts = _normalise(options)
    explicit = _int_opt(opts, "parallel", -1)
    n_seq = explicit if explicit > 0 else DEFAULT_SLOTS
    # llama-server unifies the cache when the slot count is automatic (its --help says so).
    unified = explicit <= 0
    if "kv-unified" in opts:
        unified = _flag(opts["kv-unified"])
    if "no-kv-unified" in opts:
        unified = not _flag(opts["no-kv-unified"])
    ngl_raw = (opts.get("n-gpu-layers") or "auto").strip().lower()
    ngl = None if ngl_raw in ("auto", "all", "-1") else _parse_int("n-gpu-layers", ngl_raw)
    split_raw = opts.get("tensor-split")
    split = tuple(float(x) for x in split_raw.replace("/", ",").split(",")) if split_raw else None
    batch = _int_opt(opts, "batch-size", 2048)
    fa = (opts.get("flash-attn") or "auto").strip().lower()
    return _Config(
        ctx=_int_opt(opts, "ctx-size", 0),
        n_seq=n_seq,
        unified=unified,
        type_k=_cache_type(opts.get("cache-type-k")),
        type_v=_cache_type(opts.get("cache-type-v")),
        ubatch=min(_int_opt(opts, "ubatch-size", 512), batch),
        # "auto" turns flash attention on wherever the backend supports it (CPU, CUDA, Metal).
        flash_attn=fa not in ("off", "0", "false", "disabled"),
        swa_full="swa-full" in opts and _flag(opts["swa-full"]),
        kv_offload=not ("no-kv-offload" in opts and _flag(opts["no-kv-offload"])),
        embeddings="embeddings" in opts and _flag(opts["embeddings"]),
        repack=("repack" not in opts or _flag(opts["repack"]))
        and not ("no-repack" in opts and _flag(opts["no-repack"])),
        mmproj_offload=not ("no-mmproj-offload" in opts and _flag(opts["no-mmproj-offload"])),
        ngl=ngl,
        split=split,
        split_none=(opts.get("split-mode") or "").lower() == "none",
        main_gpu=_int_opt(opts, "main-gpu", 0),
    )


def _vision(options: Mapping[str, str | None]) -> VisionShape | None:
    path = _normalise(options).get("mmproj")
    return read_vision_shape(Path(path)) if path else None


def _vision_bytes(vision: VisionShape) -> int:
    """The projector's weights (loaded, not mapped) and its graph for the largest image.

    The graph (clip.cpp reserves it with a worst-case image at load) holds the image as f32
    RGB (patch^2 x 3 floats per patch) and the ViT block's live rows, about 5 embedding and 2
    FFN rows per patch (measured: 4.6 KB per patch on a 64-wide projector, linear from 256 to
    4096 patches: the CPU graph runs flash attention, no patch x patch matrix).
    """
    per_patch = 12 * vision.patch_size**2 + 4 * (5 * vision.n_embd + 2 * vision.n_ff)
    return vision.weight_bytes + vision.n_patches * per_patch + MMPROJ_HEAP


@functools.cache
def host_has_amx() -> bool:
    """Whether this host's CPU has AMX, where llama.cpp copies the weights it can repack.

    ggml-cpu registers its AMX buffer where the kernel reports ``amx_int8`` (and lets the
    process use the tiles); Linux lists the flag in /proc/cpuinfo.
    """
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as info:
            return any(line.startswith("flags") and " amx_int8" in line for line in info)
    except OSError:
        return False


def _normalise(options: Mapping[str, str | None]) -> dict[str, str | None]:
    out: dict[str, str | None] = {}
    for key, value in options.items():
        name = key.lstrip("-")
        out[_ALIASES.get(name, name)] = value
    return out


def _flag(value: str | None) -> bool:
    return value is None or value.strip().lower() not in ("false", "0", "off", "no")


def _int_opt(opts: Mapping[str, str | None], name: str, default: int) -> int:
    value = opts.get(name)
    return default if value is None or value.strip() == "" else _parse_int(name, value)


def _parse_int(name: str, value: str) -> int:
    try:
        return int(value.strip())
    except ValueError as exc:
        raise ConfigError(f"option {name}: expected an integer, got {value!r}") from exc


def _cache_type(value: str | None) -> int:
    name = (value or "f16").strip().upper()
    try:
        qtype = GGMLQuantizationType[name]
    except KeyError as exc:
        raise ConfigError(f"unknown KV cache type {value!r}") from exc
    return int(qtype)


def _row_bytes(qtype: int, width: int) -> int:
    block, size = GGML_QUANT_SIZES[GGMLQuantizationType(qtype)]
    return -(-width // block) * size


def _pad(cells: int) -> int:
    return -(-cells // KV_PAD) * KV_PAD
