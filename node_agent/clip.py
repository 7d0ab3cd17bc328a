"""Text cut short before it is echoed or logged (issue 26, "a huge model name").

Whatever a client sends may be megabytes: a model name, a Host or Origin header, a conversation
id. Echoed whole in an error body or a log line, every character of it is matched by redaction,
formatted, written and sent back, on the event loop every client shares. A few hundred
characters say which it was; :func:`clip` keeps those and the length.

A leaf module: the errors, the redaction, the logs and the HTTP layer all use it.
"""

from __future__ import annotations

from typing import Final

SHOWN: Final = 200  # characters of a client's text that an error or a log line echoes


def clip(text: str, limit: int = SHOWN, *, length: int | None = None) -> str:
    """``text`` when it has at most ``limit`` characters, else its first ``limit`` and how
    long it was (``length``: of the whole, when ``text`` is already a piece of it)."""
    length = len(text) if length is None else length
    if length <= limit and len(text) <= limit:
        return text
    return f"{text[:limit]}…({length} characters)"
