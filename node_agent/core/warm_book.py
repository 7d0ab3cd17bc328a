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

Each file is also a **tenant**'s: the API key whose requests filled the child's caches (every
client is one tenant on an agent without keys). A child that served several keys' requests
is not saved, and a saved cache goes only into a child loaded for its own key's requests
alone: another key's exact guess of a prompt must not find it cached (issue 50, row 5). Its
name carries the checksum of what the child wrote; a file that differs from it (cut short,
bytes flipped) is never handed to a child, which would abort or answer from garbage (row 6).
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable, Sequence, Set
from dataclasses import dataclass
from typing import Final

KEY_CHARS: Final = 16  # hex digits of a model identity in a file's name
TENANT_CHARS: Final = 16  # hex digits of a tenant (a digest of its API key)
SUM_CHARS: Final = 32  # hex digits of a file's checksum (SHA-256, cut: corruption, not forgery)
_FILE = re.compile(
    rf"^(?P<key>[0-9a-f]{{{KEY_CHARS}}})-(?P<tenant>[0-9a-f]{{{TENANT_CHARS}}})"
    rf"-slot(?P<slot>\d{{1,4}})(?:-(?P<sum>[0-9a-f]{{{SUM_CHARS}}}))?\.bin$"
)
_TENANT = re.compile(rf"[0-9a-f]{{{TENANT_CHARS}}}")


def tenant_of(api_key: str) -> str:
    """The tenant of requests made with ``api_key`` ("": an agent without keys, whose
    clients are all one tenant). A digest: the key itself is never written to disk."""
    digest = hashlib.sha256(b"corral warm tenant\0" + api_key.encode()).hexdigest()
    return digest[:TENANT_CHARS]


OPEN: Final = tenant_of("")  # every client of an agent without API keys
NOBODY: Final = ""  # a lease no client is known for: its child's caches are never saved


@dataclass(frozen=True)
class SavedSlot:
    """One saved prompt cache: its file, whose it is, its size, when it was last used, and
    the checksum of what the child wrote (None: not sealed yet, never restored)."""

    name: str
    key: str
    tenant: str
    slot: int
    size: int
    used: float
    sum: str | None = None


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


def slot_file(key: str, tenant: str, slot: int) -> str:
    """The name the child is asked to write ``key``'s slot ``slot`` to, for ``tenant``."""
    return f"{key}-{tenant}-slot{slot}.bin"


def sealed_file(written: str, checksum: str) -> str:
    """The name a written slot file takes once its checksum is known."""
    return f"{written.removesuffix('.bin')}-{checksum[:SUM_CHARS]}.bin"


def checksum_matches(saved: SavedSlot, checksum: str) -> bool:
    """Whether a file's content is what was saved (its SHA-256 against its name's)."""
    return saved.sum is not None and checksum[:SUM_CHARS] == saved.sum


def parse_file(name: str, size: int, used: float) -> SavedSlot | None:
    """A file of the warm folder as a saved slot; None for a name that is not one."""
    match = _FILE.match(name)
    if match is None:
        return None
    slot = int(match["slot"])
    return SavedSlot(name, match["key"], match["tenant"], slot, size, used, match["sum"])


def save_tenant(served: Set[str]) -> str | None:
    """Whose a child's caches are, from the tenants of the requests it served: the one
    tenant; None (they are not saved) when it served several, or one that has no name."""
    if len(served) != 1:
        return None
    (tenant,) = served
    return tenant if _TENANT.fullmatch(tenant) else None


def restorable(saved: Iterable[SavedSlot], key: str, waiting: Set[str]) -> list[SavedSlot]:
    """``key``'s sealed caches that may go into its new child, one per slot (the newest):
    those of the one tenant whose requests the child is loaded for. None when several
    tenants wait (another's guess would find a restored cache) or none does."""
    tenant = save_tenant(waiting)
    newest: dict[int, SavedSlot] = {}
    for s in saved:
        if s.key != key or s.tenant != tenant or s.sum is None:
            continue
        if s.slot not in newest or s.used > newest[s.slot].used:
            newest[s.slot] = s
    return [newest[slot] for slot in sorted(newest)]


def superseded(saved: Iterable[SavedSlot], written: Iterable[SavedSlot]) -> list[str]:
    """The files a save made stale: every other file of the key and tenant it wrote for, of
    any slot (an older save, or the unsealed file it was written as).

    A save is restored whole or not at all: llama-server's slots share one KV pool (its
    default, four slots unified), so the slots of one save fit it together, while files of
    several saves may not, and the child refuses those that do not ("No available space in
    KV cache"). A save that wrote nothing (every slot empty) leaves the older one."""
    fresh = {w.name for w in written}
    owners = {(w.key, w.tenant) for w in written}
    return [s.name for s in saved if (s.key, s.tenant) in owners and s.name not in fresh]


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
