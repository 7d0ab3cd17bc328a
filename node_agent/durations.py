"""Idle times as people write them: ``600``, ``90s``, ``10m``, ``1h``, and ``-1`` for never.

Requests already say ``keep_alive: "5m"`` (Ollama's form); a preset's ``ttl`` and the agent's
``--models-ttl`` took only seconds, so ``ttl = 10m`` was refused (issue 29). A leaf: the
preset reader and the command line both use it.
"""

from __future__ import annotations

import math
from typing import Final

# Longest accepted text: a duration is a few characters; nothing longer is even looked at.
LONGEST: Final = 32
_UNITS: Final = (("ms", 0.001), ("s", 1.0), ("m", 60.0), ("h", 3600.0))
EXAMPLES: Final = "seconds or a duration such as 90s, 10m, 1h; -1 for never"


def idle_seconds(text: str) -> float | None:
    """Seconds from ``text``; None for a negative value (never). ValueError when it is not a
    duration."""
    raw = text.strip().lower()
    if not raw or len(raw) > LONGEST:
        raise ValueError(f"expects {EXAMPLES}")
    factor, number = 1.0, raw
    for unit, seconds in _UNITS:  # "ms" before "s": the longer suffix first
        if raw.endswith(unit):
            factor, number = seconds, raw[: -len(unit)].rstrip()
            break
    try:
        value = float(number)
    except ValueError:
        raise ValueError(f"expects {EXAMPLES}") from None
    if not math.isfinite(value):
        raise ValueError(f"expects {EXAMPLES}")
    if value < 0:
        return None
    return value * factor
