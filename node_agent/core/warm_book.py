"""Warm swaps' bookkeeping (issue 28): which saved prompt caches belong to which model, and
which go when the folder is over its budget. Pure: no files, no clock (times are arguments).

Before a model is unloaded (by choice: never after a crash, a wedge or with requests cut),
each of its child's slots that holds a prompt cache is saved to a file of the agent's warm
folder; when the model loads again, the files are restored into the same slots before the
first request, so a conversation's next turn re-processes only what is new. A file is named
for the model's **identity**: its GGUF (path, size, modification time), the binary, and every
option of the child (a cache saved under other options — context, KV types, rope, LoRA,
flash attention — must never be restored: it would be garbage or refused). Any change of
those is another identity, whose files are simply never asked for again and age out.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Final

KEY_CHARS: Final = 16  # hex digits of a model identity in a file's name
_FILE = re.compile(rf"^(?P<key>[0-9a-f]{{{KEY_CHARS}}})-slot(?P<slot>\d{{1,4}})\.bin$")


@dataclass(frozen=True)
class SavedSlot:
    """One saved prompt cache: its file, whose it is, its size, when it was last used."""

    name: str
    key: str
    slot: int
    size: int
    used: float


def identity(
    model: tuple[str, int, int], binary: tuple[str, int, int], options: Iterable[tuple[str, object]]
) -> str:
    """A model's identity for its saved caches: (path, size, mtime_ns) of its GGUF and of the
    binary, and its options in a stable order."""
    text = json.dumps(
        {"model": model, "binary": binary, "options": sorted((k, repr(v)) for k, v in options)},
        sort_keys=True,
    )
    return hashlib.sha256(text.encode()).hexdigest()[:KEY_CHARS]


def slot_file(key: str, slot: int) -> str:
    """The file name of ``key``'s saved slot ``slot`` (what the child is asked to write)."""
    return f"{key}-slot{slot}.bin"


def parse_file(name: str, size: int, used: float) -> SavedSlot | None:
    """A file of the warm folder as a saved slot; None for a name that is not one."""
    match = _FILE.match(name)
    if match is None:
        return None
    return SavedSlot(name, match["key"], int(match["slot"]), size, used)


def over_budget(saved: Sequence[SavedSlot], budget: int, keep: Iterable[str] = ()) -> list[str]:
    """The files to delete so that the folder holds at most ``budget`` bytes: the least
    recently used first, and those of ``keep`` (just written) only when the others are not
    enough: the bound always holds."""
    kept = frozenset(keep)
    total = sum(s.size for s in saved)
    order = sorted(saved, key=lambda s: (s.name in kept, s.used, s.name))
    doomed: list[str] = []
    for victim in order:
        if total <= budget:
            break
        doomed.append(victim.name)
        total -= victim.size
    return doomed
