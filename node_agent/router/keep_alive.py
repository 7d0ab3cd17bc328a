"""Ollama's per-request ``keep_alive``: how long a model stays loaded once it is idle."""

from __future__ import annotations

import re

from node_agent.errors import ApiError

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h)?\s*$")
_UNIT_SECONDS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, None: 1.0}


def parse_keep_alive(value: object) -> float | None:
    """Ollama's ``keep_alive``: seconds idle before unload, or None for "keep forever"."""
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise ApiError(
            400, f"keep_alive must be a number of seconds or a duration like '5m', got {value!r}"
        )
    if isinstance(value, str):
        text = value.strip()
        if text.startswith("-"):
            return None
        match = _DURATION.match(text)
        if match is None:
            raise ApiError(
                400,
                f"keep_alive {value!r} is not a duration (examples: 0, 30, '30s', '5m', '1h', -1)",
            )
        return float(match.group(1)) * _UNIT_SECONDS[match.group(2)]
    if value < 0:
        return None
    return float(value)
