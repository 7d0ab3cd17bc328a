"""Ollama's per-request ``keep_alive``: how long a model stays loaded once it is idle."""

from __future__ import annotations

import math
import re

from node_agent.errors import ApiError

_DURATION = re.compile(r"^\s*(-)?(\d+(?:\.\d+)?)\s*(ms|s|m|h)?\s*$")
_UNIT_SECONDS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, None: 1.0}


def parse_keep_alive(value: object) -> float | None:
    """Ollama's ``keep_alive``: seconds idle before unload, or None for "keep forever".

    Strict: Python's JSON reader takes ``NaN``, ``Infinity`` and ``1e400`` (infinite) as
    numbers, and a bare ``-`` prefix is not a duration: each is a 400, never a TTL.
    """
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise ApiError(
            400, f"keep_alive must be a number of seconds or a duration like '5m', got {value!r}"
        )
    if isinstance(value, str):
        match = _DURATION.match(value)
        if match is None:
            raise ApiError(
                400,
                f"keep_alive {value!r} is not a duration (examples: 0, 30, '30s', '5m', '1h', -1)",
            )
        if match.group(1):  # negative: keep forever
            return None
        seconds = float(match.group(2)) * _UNIT_SECONDS[match.group(3)]
    else:
        seconds = float(value)
    if not math.isfinite(seconds):
        raise ApiError(400, f"keep_alive must be a finite number of seconds, got {value!r}")
    return None if seconds < 0 else seconds
