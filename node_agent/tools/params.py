"""A tool call's arguments, read as llama.cpp reads them (nlohmann's JSON).

A required argument that is missing or of the wrong type is a 400 with nlohmann's own words
(``key 'path' not found``, ``type must be string, but is number``); an optional one of the wrong
type is its default (``json_value``). The messages are llama.cpp's so that a client sees the
same answer from either router.
"""

from __future__ import annotations

from typing import Any


class ParamError(ValueError):
    """A request that cannot be read (llama.cpp: a JSON exception, answered 400)."""


def type_name(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int | float):
        return "number"
    if isinstance(value, str):
        return "string"
    return "array" if isinstance(value, list) else "object"


def at(obj: Any, key: str) -> Any:
    if not isinstance(obj, dict):
        raise ParamError(f"[json.exception.type_error.304] cannot use at() with {type_name(obj)}")
    if key not in obj:
        raise ParamError(f"[json.exception.out_of_range.403] key '{key}' not found")
    return obj[key]


def _wrong(want: str, value: Any) -> ParamError:
    return ParamError(
        f"[json.exception.type_error.302] type must be {want}, but is {type_name(value)}"
    )


def as_str(value: Any) -> str:
    if not isinstance(value, str):
        raise _wrong("string", value)
    return value


INT_MIN, INT_MAX = -(2**31), 2**31 - 1


def as_int(value: Any) -> int:
    """nlohmann's ``get<int>``: a C cast of the number it parsed. An integer beyond 64 bits is
    a double there; a double outside ``int`` is x86's ``cvttsd2si`` answer, INT_MIN."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise _wrong("number", value)
    if isinstance(value, int) and -(2**63) <= value < 2**64:
        return (value - INT_MIN) % 2**32 + INT_MIN  # an int64/uint64 cast to int: wraps
    if isinstance(value, int) or not INT_MIN <= value < INT_MAX + 1:  # also inf and NaN
        return INT_MIN
    return int(value)  # truncated toward zero


def as_bool(value: Any) -> bool:
    if not isinstance(value, bool):
        raise _wrong("boolean", value)
    return value


def required_str(obj: Any, key: str) -> str:
    return as_str(at(obj, key))


def _optional(obj: Any, key: str) -> Any:
    return obj.get(key) if isinstance(obj, dict) else None


def opt_str(obj: Any, key: str, default: str) -> str:
    value = _optional(obj, key)
    return value if isinstance(value, str) else default


def opt_int(obj: Any, key: str, default: int) -> int:
    value = _optional(obj, key)
    try:
        return as_int(value)
    except ParamError:
        return default


def opt_bool(obj: Any, key: str, default: bool) -> bool:
    value = _optional(obj, key)
    return value if isinstance(value, bool) else default
