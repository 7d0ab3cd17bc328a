"""One redaction function for every place a secret could show (issue 16, row 10).

``GET /models`` (a child's arguments, its preset text), error bodies, the agent's log lines,
metrics labels and the operator's ``lastError`` all pass text through :func:`redact` before it
leaves the process. What it hides:

* the value after a secret option, on a command line or in an INI line (``--hf-token X``,
  ``hf-token = X``, ``--api-key=X``, ``LLAMA_API_KEY=X``);
* ``Authorization: Bearer X`` and bare Hugging Face tokens (``hf_…``);
* the user-info of a URL (``http://user:pass@host`` -> ``http://***@host``);
* the values of signed or keyed query parameters (``X-Amz-Signature``, ``sig``, ``token``…);
* every literal the agent was told is secret (its API keys, the HF token): :func:`add_secret`.

Its input may be a client's (a Host header, a model name) or a child's (a stderr line): every
pattern runs in time linear in the text (issue 26), and :func:`redact_clipped` bounds the work
by the length kept.

A leaf module: the errors, the logs and the HTTP layer all import it.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable, Sequence
from typing import Final

from node_agent.clip import clip

MASK = "***"
# What redact_clipped reads past its cut (longer than any secret): a secret that the first cut
# splits, and so is not recognised, lies wholly past the second.
_CLIP_MARGIN: Final = 1024
# Options (long names, without dashes) whose value is a secret.
SECRET_OPTIONS = ("hf-token", "api-key", "hft")
SECRET_ENV = ("HF_TOKEN", "LLAMA_API_KEY", "LLAMA_ARG_HF_TOKEN", "HUGGING_FACE_HUB_TOKEN")
# Query parameters that sign or authorise a URL (S3, GCS, Azure SAS, CloudFront, generic).
_QUERY_KEYS = (
    r"x-amz-[a-z-]*(?:signature|credential|security-token)|x-goog-[a-z-]*(?:signature|credential)"
    r"|signature|sig|se|sp|skoid|sktid|token|access_token|auth|api_key|apikey|key|policy"
    r"|key-pair-id|password|secret|client_secret"
)
_OPTION = re.compile(
    r"(?P<lead>(?:^|(?<=[\s\"'\[,]))(?:--?(?:"
    + "|".join(SECRET_OPTIONS)
    + r")|"
    + "|".join(SECRET_ENV)
    + r")(?:\s*=\s*|\s+|\"?,\s*\"))(?P<value>[^\s\"',\]]+)",
    re.IGNORECASE,
)
# Blanks within the line only: a `\s*` after `^` spans newlines, so every line start of a run
# of blank lines scanned the rest of the run (quadratic: 17 s for 16 KB, issue 26).
_INI = re.compile(
    r"(?P<lead>^[ \t]*(?:" + "|".join(SECRET_OPTIONS) + r")[ \t]*=[ \t]*)(?P<value>.+)$",
    re.IGNORECASE | re.MULTILINE,
)
_BEARER = re.compile(r"(?P<lead>\bBearer\s+)(?P<value>[^\s\"',]+)", re.IGNORECASE)
_HF_TOKEN = re.compile(r"\bhf_[A-Za-z0-9]{8,}")
# A URL's user info is found from its "://" (see _hide_user_info), never by a pattern that
# starts at every letter: `\b[a-z][a-z0-9+.-]*://` scans the rest of `a.a.a…` from each `a`
# (quadratic: a 32 KB Host header held the loop 34 s, issue 26 row 2).
_SCHEME_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789+.-")
_USER_INFO_END = re.compile(r"[/\s@\"']")
_QUERY = re.compile(
    r"(?P<lead>[?&;](?:" + _QUERY_KEYS + r")=)(?P<value>[^&#\s\"']*)", re.IGNORECASE
)

_secrets: set[str] = set()


def add_secret(value: str | None) -> None:
    """Hide ``value`` wherever it appears from now on (the agent's keys, the HF token)."""
    if value and len(value.strip()) >= 4:  # a one-letter "secret" would mask half the text
        _secrets.add(value.strip())


def add_secrets(values: Iterable[str | None]) -> None:
    for value in values:
        add_secret(value)


# What each pattern below needs in a text to match (ASCII, lower case; "hf_" as written).
_NAMES: Final = tuple(name.lower() for name in (*SECRET_OPTIONS, *SECRET_ENV))


def _may_show_secrets(text: str) -> bool:
    """Whether the patterns of :func:`redact` could match an ASCII ``text``; False lets a log
    line without any of their words (one per request: issue 30) skip six searches. ASCII
    only: a case-insensitive pattern also matches some other letters (the Kelvin sign)."""
    low = text.lower()
    return (
        any(name in low for name in _NAMES)
        or "bearer" in low
        or "://" in text
        or "hf_" in text
        or ("=" in text and ("?" in text or "&" in text or ";" in text))
    )


def redact(text: str) -> str:
    """``text`` with every secret it shows replaced by ``***``."""
    for secret in sorted(_secrets, key=len, reverse=True):
        if secret in text:
            text = text.replace(secret, MASK)
    if text.isascii() and not _may_show_secrets(text):
        return text
    return _redact_patterns(text)


def _redact_patterns(text: str) -> str:
    text = _INI.sub(lambda m: m["lead"] + MASK, text)
    text = _OPTION.sub(lambda m: m["lead"] + MASK, text)
    text = _BEARER.sub(lambda m: m["lead"] + MASK, text)
    text = _hide_user_info(text)
    text = _QUERY.sub(lambda m: m["lead"] + MASK, text)
    return _HF_TOKEN.sub("hf_" + MASK, text)


def redact_clipped(text: str, limit: int, *, length: int | None = None) -> str:
    """``redact(text)`` cut to about ``limit`` characters, with work bounded by ``limit``
    rather than by ``text`` (a line a child or a client wrote may be megabytes). ``length``:
    the whole text's, when ``text`` is already a :func:`kept_for_redaction` cut of it."""
    length = len(text) if length is None else length
    if length <= limit:
        return redact(text)
    return clip(redact(text[: limit + _CLIP_MARGIN]), limit, length=length)


def kept_for_redaction(text: str, limit: int) -> str:
    """As much of ``text`` as :func:`redact_clipped` reads for ``limit``: what to keep of a
    line that is redacted later, when someone reads it."""
    return text[: limit + _CLIP_MARGIN]


def _hide_user_info(text: str) -> str:
    """``scheme://user:pass@host`` -> ``scheme://***@host``, in time linear in ``text``.

    The scheme is read backwards from each ``://`` and the user info forwards from it: each
    scan stops at the next ``:`` or ``/``, so no character is looked at more than twice."""
    out: list[str] = []
    done = 0  # text[:done] is in out
    at = text.find("://")
    while at >= 0:
        start = at + 3
        end = _USER_INFO_END.search(text, start)
        at_sign = end.start() if end is not None and end.group() == "@" else start
        if at_sign > start and _scheme_before(text, at, done):
            out += (text[done:start], MASK)
            done = at_sign
        at = text.find("://", start)
    return "".join(out) + text[done:] if out else text


def _scheme_before(text: str, at: int, floor: int) -> bool:
    """Whether ``text[:at]`` ends in a URL scheme that starts after ``floor``: a letter at a
    word boundary, then letters, digits, ``+``, ``.`` or ``-``."""
    found = False
    p = at
    while p > floor and text[p - 1] in _SCHEME_CHARS:
        p -= 1
        before = text[p - 1] if p > 0 else " "
        if text[p].isascii() and text[p].isalpha() and not (before.isalnum() or before == "_"):
            found = True
    return found


def redact_args(args: Sequence[str]) -> list[str]:
    """A command line with secrets hidden: the word after a secret option, and each word."""
    out: list[str] = []
    hide_next = False
    for word in args:
        if hide_next:
            out.append(MASK)
            hide_next = False
            continue
        if word.lstrip("-").lower() in SECRET_OPTIONS and word.startswith("-"):
            hide_next = True
        out.append(redact(word))
    return out


# The most of one log message written: client text in it is clipped where it is put in
# (node_agent.clip); this bounds what was not (issue 26).
LOG_MESSAGE_CHARS: Final = 8000


class RedactingFilter(logging.Filter):
    """A log filter that redacts each record's final message (installed on the handlers)."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        clean = redact_clipped(message, LOG_MESSAGE_CHARS)
        if clean != message:
            record.msg, record.args = clean, None
        if record.exc_info and record.exc_text is None and record.exc_info[1] is not None:
            record.exc_text = redact(logging.Formatter().formatException(record.exc_info))
        return True
