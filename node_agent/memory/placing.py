"""The estimator's side of automatic GPU placement: what a model needs where, and how a child
is told where to run.

``core.placement`` decides from figures; this module makes them (one GGUF header read per
model, then only arithmetic) and turns a decision into the child's environment.

**How a child is placed: ``CUDA_VISIBLE_DEVICES``** (and ``GGML_VK_VISIBLE_DEVICES`` with
the same indices, for a Vulkan build), not llama-server's ``--device``. Why:

* a CUDA process creates a context (hundreds of MiB) on every GPU it can see, and
  llama-server's ``--fit`` and device listing query every GPU: only hiding the others keeps a
  child off the GPUs the ledger did not give it;
* it works the same with every llama-server build and option set (``--device`` names differ
  between builds: ``CUDA1``, ``Vulkan1``), and llama-swap's users already pin models this way;
* the indices are NVML's, which is PCI bus order; every child runs with
  ``CUDA_DEVICE_ORDER=PCI_BUS_ID`` (``child.spawn``), so CUDA numbers the GPUs the same way.
  Vulkan enumerates in its own order, usually the same on a machine with one GPU vendor:
  ``hack/gpu-check.sh`` checks it on a real machine.

A split adds ``--tensor-split`` with the fractions, in the order of the visible GPUs.

**The context is pinned** (``-c``) at the context ``min`` was estimated at, unless the
preset sets ``-c`` itself. Left to ``--fit`` (on by default), a child sizes its context to
the memory free on its GPUs when it starts: the first model on a GPU would take all of it and
every later one would need an eviction, which defeats placing several models on one GPU.
With ``-c`` set, ``--fit`` has no context to choose and only moves layers if the estimate was
wrong. Presets that pin their devices themselves (``device``, ``main-gpu``, ``tensor-split``,
``split-mode``, a device variable in ``env.``) are not placed, and keep ``--fit`` as they ask
(the ledger then holds what ``--fit`` takes: ``runtime.memory_watch``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from node_agent.core.placement import Placement, SplitNeed
from node_agent.memory.devices import HOST

if TYPE_CHECKING:  # the estimator imports gguf, hence numpy: lazily, below (start-up time)
    from node_agent.memory.shape import ModelShape, VisionShape

# A preset that sets one of these has chosen its devices: the ledger does not place it.
PINNING_OPTIONS = frozenset({"device", "main-gpu", "tensor-split", "split-mode"})
GPU_PREFIX = "CUDA"  # NVML's GPUs, as devices.NvmlProbe names them


@dataclass(frozen=True)
class PlacementInput:
    """One model's figures for placement: its need on each GPU alone, at ``context``."""

    shape: ModelShape
    options: Mapping[str, str | None]
    vision: VisionShape | None
    context: int
    single: Mapping[str, Mapping[str, int]]

    def split_need(self) -> SplitNeed:
        from node_agent.memory.estimator import estimate_shape

        def need(names: tuple[str, ...], fractions: tuple[float, ...]) -> Mapping[str, int]:
            options = {**self.options, "tensor-split": _fractions(fractions)}
            return estimate_shape(
                self.shape, options, [HOST, *names], context=self.context, vision=self.vision
            ).per_device()

        return need


def placeable(options: Iterable[str], gpus: Sequence[str], ngl: str | None) -> bool:
    """Whether the ledger may place a model: it has GPUs, the model pins none, and it runs
    layers on a GPU at all (``-ngl 0`` keeps it on the CPU)."""
    if not gpus or (ngl is not None and ngl.strip() == "0"):
        return False
    return not PINNING_OPTIONS.intersection(options)


def placement_input(
    path: Path, options: Mapping[str, str | None], gpus: Sequence[str]
) -> PlacementInput:
    """Read the header once and estimate the model on each GPU alone (raises what the
    estimator raises: ConfigError, OSError, ValueError)."""
    from node_agent.memory.shape import read_shape, read_vision_shape

    mmproj = options.get("mmproj")
    vision = read_vision_shape(Path(mmproj)) if mmproj else None
    return placement_for_shape(read_shape(path), vision, options, gpus)


def placement_for_shape(
    shape: ModelShape,
    vision: VisionShape | None,
    options: Mapping[str, str | None],
    gpus: Sequence[str],
) -> PlacementInput:
    """:func:`placement_input` from shapes already read (the agent reads headers off its
    loop, once per file version: ``memory.shape_cache``)."""
    from node_agent.memory.estimator import estimate_shape, min_context

    context = min_context(shape, options)
    single = {
        gpu: estimate_shape(
            shape, options, [HOST, gpu], context=context, vision=vision
        ).per_device()
        for gpu in gpus
    }
    return PlacementInput(shape, dict(options), vision, context, single)


def child_environment(plan: Placement) -> dict[str, str]:
    """The variables that start a child on exactly ``plan``'s GPUs (module docstring)."""
    indices = ",".join(name.removeprefix(GPU_PREFIX) for name in plan.gpus)
    return {"CUDA_VISIBLE_DEVICES": indices, "GGML_VK_VISIBLE_DEVICES": indices}


def tensor_split(plan: Placement) -> str | None:
    """``--tensor-split`` for a split over several GPUs; None for one GPU."""
    return _fractions(plan.split) if len(plan.gpus) > 1 else None


def _fractions(fractions: Sequence[float]) -> str:
    return ",".join(f"{f:.4f}" for f in fractions)
