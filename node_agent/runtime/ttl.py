"""Ollama's per-request ``keep_alive``: how long a model stays loaded once it is idle."""

from __future__ import annotations

import math
import re

from node_agent.clip import clip
from node_agent.errors import ApiError

# Matched on the stripped text, at most _LONGEST characters of it: blanks on both sides of an
# optional unit (`\s*(ms|…)?\s*$`) made the old pattern quadratic on a client's 20 KB of spaces
# (3.7 s on the loop; issue 26).
_DURATION = re.compile(r"(-)?(\d+(?:\.\d+)?)[ \t]*(ms|s|m|h)?")
_LONGEST = 32
_UNIT_SECONDS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, None: 1.0}


def parse_keep_alive(value: object) -> float | None:
    """Ollama's ``keep_alive``: seconds idle before unload, or None for "keep forever".

    Strict: Python's JSON reader takes ``NaN``, ``Infinity`` and ``1e400`` (infinite) as
    numbers, and a bare ``-`` prefix is not a duration: each is a 400, never a TTL.
    """
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        # An array or object is named, not shown: it may be megabytes (true, null: shown).
        shown = type(value).__name__ if isinstance(value, (list, dict)) else repr(value)
        raise ApiError(
            400, f"keep_alive must be a number of seconds or a duration like '5m', got {shown}"
        )
    if isinstance(value, str):
        text = value.strip()
        match = _DURATION.fullmatch(text) if len(text) <= _LONGEST else None
        if match is None:
            raise ApiError(
                400,
                f"keep_alive {clip(value)!r} is not a duration (examples: 0, 30, '30s', '5m', "
                "'1h', -1)",
            )
        if match.group(1):  # negative: keep forever
            return None
        seconds = float(match.group(2)) * _UNIT_SECONDS[match.group(3)]
    else:
        try:
            seconds = float(value)
        except OverflowError:  # an integer of hundreds of digits
            seconds = math.inf
    if not math.isfinite(seconds):
        raise ApiError(
            400, f"keep_alive must be a finite number of seconds, got {clip(repr(value))}"
        )
    return None if seconds < 0 else seconds
