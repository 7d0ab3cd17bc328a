"""llama.cpp's glob (``common.cpp: glob_match``) and how the tools apply it to a path.

``*`` and ``?`` stop at ``/``, ``**`` crosses it, ``[a-z]``/``[!x]`` are classes. A pattern with
no ``/`` matches the basename; one with ``/`` matches the whole relative path, anchored with
``**/`` unless it starts with ``**`` or ``/`` (``path_glob_match``).
"""

from __future__ import annotations


def glob_match(pattern: str, text: str) -> bool:
    """llama.cpp's recursive matcher, as a table over (pattern token, text position): the same
    answers without its exponential time or Python's recursion limit on a long path."""
    tokens = _tokens(pattern)
    n = len(text)
    # after[j]: the tokens from i on match text[j:]; filled from the last token back.
    after = [j == n for j in range(n + 1)]
    for kind, arg in reversed(tokens):
        now = [False] * (n + 1)
        if kind == "**":
            seen = False
            for j in range(n, -1, -1):
                seen = seen or after[j]
                now[j] = seen
        elif kind == "*":
            seen = False
            for j in range(n, -1, -1):
                # k runs from j up to the first '/' at or after j (a '/' itself ends the run)
                seen = after[j] if j == n or text[j] == "/" else seen or after[j]
                now[j] = seen
        else:
            for j in range(n):
                c = text[j]
                ok = c != "/" if kind == "?" else _class_match(c, arg) if kind == "[" else c == arg
                now[j] = ok and after[j + 1]
        after = now
    return after[0]


def _tokens(pattern: str) -> list[tuple[str, str]]:
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
    return tokens


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
