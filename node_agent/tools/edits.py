"""``edit_file``'s text replacement (llama.cpp's ``server_tool_edit_file``), pure.

Every ``old_text`` is looked for in the original content (not after the earlier edits), must
occur once and must not overlap another edit. When one is not found exactly, the file and the
texts are compared "fuzzily" (trailing blanks dropped, typographic quotes, dashes and spaces
read as ASCII), and the lines no edit touches keep their original bytes.
"""

from __future__ import annotations

import itertools
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
    and order kept)."""
    return "\n".join(line.rstrip(" \t\r").translate(_FUZZY) for line in content.split("\n"))


def _count(content: str, needle: str) -> int:
    return content.count(needle) if needle else 0  # non-overlapping, as llama.cpp counts


def apply_edits(original: str, edits: list[tuple[str, str]], path: str) -> str:
    """The new content; ``edits`` are (old_text, new_text) pairs, old_text non-empty."""
    any_fuzzy = False
    for i, (old, _) in enumerate(edits):
        if old in original:
            continue
        if fuzzy(old) not in fuzzy(original):
            raise EditError(
                f"could not find edits[{i}].old_text in {path}, it must match the file's "
                "current content exactly"
            )
        any_fuzzy = True
    base = fuzzy(original) if any_fuzzy else original
    matches: list[_Match] = []
    for i, (old, new) in enumerate(edits):
        needle = fuzzy(old) if any_fuzzy else old
        # Uniqueness is always judged fuzzily: a duplicate that differs in blanks counts.
        occurrences = _count(fuzzy(original), fuzzy(old))
        if occurrences > 1:
            raise EditError(
                f"found {occurrences} occurrences of edits[{i}].old_text in {path}, it must be "
                "unique"
            )
        matches.append(_Match(i, base.find(needle), len(needle), new))
    matches.sort(key=lambda m: m.start)
    for a, b in itertools.pairwise(matches):
        if a.start + a.length > b.start:
            raise EditError(
                f"edits[{a.edit}] and edits[{b.edit}] overlap in {path}; merge them into one "
                "edit or target disjoint regions"
            )
    if any_fuzzy:
        result = _replace_keeping_lines(original, base, matches)
    else:
        result = _replace(base, matches, 0)
    if result == original:
        raise EditError("no changes made: the replacement(s) produced identical content")
    return result


def _replace(content: str, matches: list[_Match], offset: int) -> str:
    for m in reversed(matches):
        at = m.start - offset
        content = content[:at] + m.new_text + content[at + m.length :]
    return content


def _split_nl(content: str) -> list[str]:
    parts = content.split("\n")
    lines = [p + "\n" for p in parts[:-1]]
    return [*lines, parts[-1]] if parts[-1] else lines


def _spans(content: str) -> list[tuple[int, int]]:
    spans, offset = [], 0
    for line in _split_nl(content):
        spans.append((offset, offset + len(line)))
        offset += len(line)
    return spans


def _line_range(spans: list[tuple[int, int]], start: int, length: int) -> tuple[int, int]:
    """The lines (first, end exclusive) that a replacement touches (it lies inside the
    content: a match of a non-empty text)."""
    end = start + length
    first = next(i for i, (a, b) in enumerate(spans) if a <= start < b)
    last = first
    while spans[last][1] < end:
        last += 1
    return first, last + 1


def _replace_keeping_lines(original: str, base: str, matches: list[_Match]) -> str:
    original_lines = _split_nl(original)
    spans = _spans(base)
    groups: list[tuple[int, int, list[_Match]]] = []
    for m in matches:
        first, end = _line_range(spans, m.start, m.length)
        if groups and first < groups[-1][1]:
            start, last_end, reps = groups[-1]
            groups[-1] = (start, max(last_end, end), [*reps, m])
        else:
            groups.append((first, end, [m]))
    out: list[str] = []
    line = 0
    for first, end, reps in groups:
        out.extend(original_lines[line:first])
        lo, hi = spans[first][0], spans[end - 1][1]
        out.append(_replace(base[lo:hi], reps, lo))
        line = end
    out.extend(original_lines[line:])
    return "".join(out)
