"""llama.cpp's glob (``common.cpp: glob_match``) and how the tools apply it to a path.

``*`` and ``?`` stop at ``/``, ``**`` crosses it, ``[a-z]``/``[!x]`` are classes. A pattern with
no ``/`` matches the basename; one with ``/`` matches the whole relative path, anchored with
``**/`` unless it starts with ``**`` or ``/`` (``path_glob_match``).
"""

from __future__ import annotations

from functools import lru_cache


def glob_match(pattern: str, text: str) -> bool:
    return _match(pattern, text)


@lru_cache(maxsize=4096)
def _match(p: str, s: str) -> bool:
    if not p:
        return not s
    if p.startswith("**"):
        rest = p[2:]
        return any(_match(rest, s[i:]) for i in range(len(s) + 1))
    if p[0] == "*":
        rest = p[1:]
        i = 0
        while i < len(s) and s[i] != "/":
            if _match(rest, s[i:]):
                return True
            i += 1
        return _match(rest, s[i:])
    if p[0] == "?" and s and s[0] != "/":
        return _match(p[1:], s[1:])
    if p[0] == "[":
        end = 1
        if end < len(p) and p[end] in "]-":
            end += 1
        while end < len(p) and p[end] != "]":
            end += 1
        if end < len(p):
            return bool(s) and _class_match(s[0], p[1:end]) and _match(p[end + 1 :], s[1:])
        return s.startswith("[") and _match(p[1:], s[1:])
    return bool(s) and p[0] == s[0] and _match(p[1:], s[1:])


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
