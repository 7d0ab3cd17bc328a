"""The top-level fields of a large JSON body, parsed in a worker process (``bodies``).

A leaf with nothing but ``json``: the worker imports only this. ``json.loads`` holds the GIL
for the whole parse, so a thread would not free the event loop; and the 20 million objects of
a 60 MB body of ``{}`` items take over a gigabyte that a short-lived worker gives back whole.
The agent needs only the top-level scalars (``model``, ``stream``, ``keep_alive``…): nested
values stay in the raw body, which is what goes to the child.
"""

from __future__ import annotations

import json
from typing import Any


def loads(body: bytes) -> tuple[str | None, Any]:
    """(error, document): the client's mistake in words when the body is not JSON (the
    messages every route answers with, ``bodies.parse_json_body``)."""
    if not body.strip():
        return "the request body is not valid JSON: it is empty", None
    try:
        return None, json.loads(body)
    except (ValueError, UnicodeDecodeError) as exc:
        return f"the request body is not valid JSON: {exc}", None
    except RecursionError:
        # json's C parser recurses per nesting level: ``[[[[…`` a few thousand deep would
        # otherwise surface as a 500.
        return "the request body is not valid JSON: it nests too deeply", None


def top_level_fields(body: bytes) -> tuple[str | None, Any]:
    """(error, fields): the error message when the body is not JSON, else its value with any
    nested object or array left out (the value itself when it is not an object)."""
    error, data = loads(body)
    if error is not None:
        return error, None
    if isinstance(data, dict):
        return None, {k: v for k, v in data.items() if not isinstance(v, (dict, list))}
    return None, data if not isinstance(data, list) else []
