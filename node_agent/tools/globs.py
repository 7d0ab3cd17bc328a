"""llama.cpp's glob (``common.cpp: glob_match``) and how the tools apply it to a path.

``*`` and ``?`` stop at ``/``, ``**`` crosses it, ``[a-z]``/``[!x]`` are classes. A pattern with
no ``/`` matches the basename; one with ``/`` matches the whole relative path, anchored with
``**/`` unless it starts with ``**`` or ``/`` (``path_glob_match``).
"""

from __future__ import annotations

import functools


def glob_match(pattern: str, text: str) -> bool:
    """llama.cpp's recursive matcher, as a table over (pattern token, text position): the same
    answers without its exponential time or Python's recursion limit on a long path.

    A column of the table is an integer, bit ``j`` for text position ``j`` (``after``: the
    tokens from this one on match ``text[j:]``), so that one token costs a few integer
    operations, not a Python loop over the text (a 600-token glob over 1,400 paths took 4.7 s
    of a tool thread: issue 26, row 14)."""
    n = len(text)
    chars = _char_bits(text)
    slashes = chars.get("/", 0)
    # '*' stops at '/': the segments it spans, each (first position, last position) with the
    # last one a '/' or the end of the text.
    segments, first = [], 0
    for j, c in enumerate(text):
        if c == "/":
            segments.append((first, j))
            first = j + 1
    segments.append((first, n))
    after = 1 << n  # the empty rest of the pattern matches the empty rest of the text
    for kind, arg in reversed(_tokens(pattern)):
        if not after:
            return False
        if kind == "**":  # any k >= j
            after = (1 << after.bit_length()) - 1
        elif kind == "*":  # any k in j..(the first '/' or the end at or after j)
            spanned = 0
            for a, b in segments:
                inside = after & ((1 << (b + 1)) - (1 << a))
                if inside:
                    spanned |= (1 << inside.bit_length()) - (1 << a)
            after = spanned
        else:
            if kind == "?":
                ok = ((1 << n) - 1) & ~slashes
            elif kind == "[":
                ok = 0
                for c, bits in chars.items():
                    if _class_match(c, arg):
                        ok |= bits
            else:
                ok = chars.get(arg, 0)
            after = ok & (after >> 1)  # text[j] matches and the rest matches text[j + 1:]
    return bool(after & 1)


def _char_bits(text: str) -> dict[str, int]:
    """For each character of ``text``, the positions where it is, as bits."""
    bits: dict[str, int] = {}
    for j, c in enumerate(text):
        bits[c] = bits.get(c, 0) | (1 << j)
    return bits


@functools.lru_cache(maxsize=64)
def _tokens(pattern: str) -> tuple[tuple[str, str], ...]:
    tokens: list[tuple[str, str]] = []
    i = 0
    while i < len(pattern):
        c = pattern[i]
        if pattern.startswith("**", i):
            tokens.append(("**", ""))
            i += 2
            continue
        if c in "*?":
            tokens.append((c, ""))
        elif c == "[":
            end = i + 1
            if end < len(pattern) and pattern[end] in "]-":
                end += 1
            while end < len(pattern) and pattern[end] != "]":
                end += 1
            if end < len(pattern):
                tokens.append(("[", pattern[i + 1 : end]))
                i = end + 1
                continue
            tokens.append(("lit", "["))  # no closing ']': a literal '['
        else:
            tokens.append(("lit", c))
        i += 1
    return tuple(tokens)


def _class_match(c: str, body: str) -> bool:
    negated = body.startswith("!")
    if negated:
        body = body[1:]
    if body[:1] in ("]", "-"):
        if body[0] == c:
            return not negated
        body = body[1:]
    matched = False
    i = 0
    while i < len(body):
        if i + 2 < len(body) and body[i + 1] == "-" and body[i + 2] != "]":
            if body[i] <= c <= body[i + 2]:
                matched = True
                break
            i += 3
        else:
            if body[i] == c:
                matched = True
                break
            i += 1
    return matched != negated


def path_glob_match(pattern: str, rel_path: str) -> bool:
    if "/" not in pattern:
        return glob_match(pattern, rel_path.rsplit("/", 1)[-1])
    if pattern == "**" or pattern.startswith(("**/", "/")):
        return glob_match(pattern, rel_path)
    return glob_match("**/" + pattern, rel_path)
