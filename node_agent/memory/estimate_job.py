"""One model's estimate as a job: its inputs snapshotted where the ledger lives (the agent's
event loop), the arithmetic run anywhere (a worker thread), the result applied back.

The arithmetic is bounded (at most 512 layers: ``memory.shape``) but not small: a crafted
header at llama.cpp's limits (512 layers, a trained context of 2^32) costs ~90 ms per range on
a busy core, two ranges per model, and ten such files froze ``/health`` for a second on the
first ``GET /models`` (issue 26, row 6). So the agent runs it off its loop.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # gguf, hence numpy: imported by run_estimate (start-up time)
    from node_agent.memory.estimator import MemoryRange
    from node_agent.memory.placing import PlacementInput
    from node_agent.memory.shape import ModelShape, VisionShape


@dataclass(frozen=True)
class EstimateJob:
    """What one estimate needs, as of when it was asked for."""

    model: str
    key: tuple[object, ...]
    """The file version and options it is for (``MemoryWatch`` estimates once per key)."""
    shape: ModelShape
    vision: VisionShape | None
    options: Mapping[str, str | None]
    devices: tuple[str, ...]
    budget: Mapping[str, int]
    """Bytes available per device (the ledger's): the largest context that fits, ``max``."""
    seen: Mapping[str, int]
    """What the child's own ``--fit`` sees per device (all the host's RAM, each GPU's free)."""
    gpus: tuple[str, ...] | None
    """The GPUs to place it across; None when the ledger does not place it."""


@dataclass(frozen=True)
class EstimateResult:
    figures: MemoryRange | None = None
    fit: MemoryRange | None = None
    placement: PlacementInput | None = None
    placement_error: str | None = None
    error: str | None = None
    """Why there is no estimate (its options, or arithmetic on a header's values)."""


def run_estimate(job: EstimateJob) -> EstimateResult:
    """The job's figures (pure arithmetic on the shapes; never raises for a bad model)."""
    from node_agent.errors import CorralError
    from node_agent.memory.estimator import range_for_shape
    from node_agent.memory.placing import placement_for_shape

    shape, vision, options = job.shape, job.vision, job.options
    try:
        figures = range_for_shape(shape, options, job.devices, job.budget, vision=vision)
    except (CorralError, OSError, ValueError, ArithmeticError) as exc:
        return EstimateResult(error=str(exc))
    placement_error = None
    if job.gpus is not None:
        try:
            placement = placement_for_shape(shape, vision, options, job.gpus)
        except (CorralError, OSError, ValueError, ArithmeticError) as exc:
            placement_error = str(exc)  # not placed: the ledger counts it as unplaced
        else:
            return EstimateResult(figures=figures, placement=placement)
    try:
        fit = range_for_shape(shape, options, job.devices, job.seen, vision=vision)
    except (CorralError, OSError, ValueError, ArithmeticError):
        fit = figures
    return EstimateResult(figures=figures, fit=fit, placement_error=placement_error)
