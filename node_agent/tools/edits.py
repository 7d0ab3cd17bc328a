"""``edit_file``'s text replacement (llama.cpp's ``server_tool_edit_file``), pure.

Every ``old_text`` is looked for in the original content (not after the earlier edits), must
occur once and must not overlap another edit. When one is not found exactly, the file and the
texts are compared "fuzzily" (trailing blanks dropped, typographic quotes, dashes and spaces
read as ASCII), and the lines no edit touches keep their original bytes.
"""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass

_FUZZY = str.maketrans(
    {
        **{c: "'" for c in "\u2018\u2019\u201a\u201b"},
        **{c: '"' for c in "\u201c\u201d\u201e\u201f"},
        **{chr(c): "-" for c in range(0x2010, 0x2016)},
        "\u2212": "-",
        "\u00a0": " ",
        **{chr(c): " " for c in range(0x2002, 0x200B)},
        "\u202f": " ",
        "\u205f": " ",
        "\u3000": " ",
    }
)


_FUZZY_PIECE = 1024 * 1024  # characters of text normalised at a time


class EditError(ValueError):
    """An edit that cannot be applied; the message is llama.cpp's."""


@dataclass(frozen=True, slots=True)
class _Match:
    edit: int  # index in the request's edits
    start: int  # offset in the content the edits were matched against
    length: int
    new_text: str


def fuzzy(content: str) -> str:
    """Each line without trailing blanks, its typographic characters as ASCII (line count
    and order kept). A long text goes in pieces cut at line ends: the same result, without a
    list of all its lines at once (a file of short lines made one of millions)."""
    if len(content) <= _FUZZY_PIECE:
        return _fuzzy_lines(content)
    pieces, start = [], 0
    while (cut := content.find("\n", start + _FUZZY_PIECE)) >= 0:
        pieces.append(_fuzzy_lines(content[start:cut]))
        start = cut + 1
    pieces.append(_fuzzy_lines(content[start:]))
    return "\n".join(pieces)


def _fuzzy_lines(content: str) -> str:
    return "\n".join(line.rstrip(" \t\r").translate(_FUZZY) for line in content.split("\n"))


def _count(content: str, needle: str) -> int:
    return content.count(needle) if needle else 0  # non-overlapping, as llama.cpp counts


class _Clock:
    """The time bound of one call's edits (None: none), checked between steps that are each
    bounded by the file's size (one scan of it)."""

    def __init__(self, timeout: float | None) -> None:
        self.timeout = timeout
        self.deadline = None if timeout is None else time.monotonic() + timeout

    def check(self, path: str) -> None:
        if self.deadline is not None and time.monotonic() >= self.deadline:
            raise EditError(
                f"edit_file timed out after {self.timeout:g} s on {path}: use fewer edits or "
                "write_file"
            )


def apply_edits(
    original: str, edits: list[tuple[str, str]], path: str, timeout: float | None = None
) -> str:
    """The new content; ``edits`` are (old_text, new_text) pairs, old_text non-empty. Each
    step is a scan of the content: the work is (edits x size), within ``timeout`` seconds."""
    clock = _Clock(timeout)
    clock.check(path)
    fuzzy_original = fuzzy(original)  # once: it was once per edit (issue 26, row 14)
    exact: list[int] = []  # where each old_text is, exactly (-1: not there)
    for i, (old, _) in enumerate(edits):
        clock.check(path)
        exact.append(original.find(old))
        if exact[i] < 0 and fuzzy(old) not in fuzzy_original:
            raise EditError(
                f"could not find edits[{i}].old_text in {path}, it must match the file's "
                "current content exactly"
            )
    any_fuzzy = min(exact) < 0
    matches: list[_Match] = []
    for i, (old, new) in enumerate(edits):
        clock.check(path)
        fuzzy_old = fuzzy(old)
        # Uniqueness is always judged fuzzily: a duplicate that differs in blanks counts.
        at = fuzzy_original.find(fuzzy_old)
        if fuzzy_old and fuzzy_original.find(fuzzy_old, at + len(fuzzy_old)) >= 0:
            raise EditError(
                f"found {_count(fuzzy_original, fuzzy_old)} occurrences of edits[{i}].old_text "
                f"in {path}, it must be unique"
            )
        if any_fuzzy:
            matches.append(_Match(i, at, len(fuzzy_old), new))
        else:
            matches.append(_Match(i, exact[i], len(old), new))
    matches.sort(key=lambda m: m.start)
    for a, b in itertools.pairwise(matches):
        if a.start + a.length > b.start:
            raise EditError(
                f"edits[{a.edit}] and edits[{b.edit}] overlap in {path}; merge them into one "
                "edit or target disjoint regions"
            )
    clock.check(path)
    if any_fuzzy:
        result = _replace_keeping_lines(original, fuzzy_original, matches)
    else:
        result = _replace(original, matches, 0, len(original))
    if result == original:
        raise EditError("no changes made: the replacement(s) produced identical content")
    return result


def _replace(content: str, matches: list[_Match], lo: int, hi: int) -> str:
    """``content[lo:hi]`` with the matches (ascending, disjoint, inside it) replaced; one
    copy of the text, not one per edit."""
    pieces, at = [], lo
    for m in matches:
        pieces += [content[at : m.start], m.new_text]
        at = m.start + m.length
    pieces.append(content[at:hi])
    return "".join(pieces)


def _replace_keeping_lines(original: str, base: str, matches: list[_Match]) -> str:
    """The lines that replacements touch are rebuilt from ``base`` (the fuzzy text); the
    others keep their original bytes. Both texts have the same lines (``fuzzy`` keeps them):
    line k of one is line k of the other. Offsets, not lists of lines."""
    # (first line, end line exclusive, base offsets lo-hi of those lines, the matches in them)
    groups: list[tuple[int, int, int, int, list[_Match]]] = []
    for m in matches:  # ascending
        first = base.count("\n", 0, m.start)
        lo = base.rfind("\n", 0, m.start) + 1
        last_char = m.start + max(m.length, 1) - 1  # blanks only: fuzzily an empty match
        end = first + base.count("\n", m.start, last_char) + 1
        newline = base.find("\n", last_char)
        hi = len(base) if newline < 0 else newline + 1
        if groups and first < groups[-1][1]:
            g_first, _, g_lo, _, reps = groups[-1]
            groups[-1] = (g_first, max(groups[-1][1], end), g_lo, max(groups[-1][3], hi), reps)
            reps.append(m)
        else:
            groups.append((first, end, lo, hi, [m]))
    out: list[str] = []
    line = at = 0  # the original's line ``line`` starts at offset ``at``
    for first, end, lo, hi, reps in groups:
        start = _skip_lines(original, at, first - line)
        out.append(original[at:start])
        out.append(_replace(base, reps, lo, hi))
        at, line = _skip_lines(original, start, end - first), end
    out.append(original[at:])
    return "".join(out)


def _skip_lines(text: str, at: int, count: int) -> int:
    """The offset ``count`` lines after offset ``at`` (the end of the text at most)."""
    for _ in range(count):
        newline = text.find("\n", at)
        if newline < 0:
            return len(text)
        at = newline + 1
    return at
