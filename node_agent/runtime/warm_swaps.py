"""Warm swaps (issue 28): a model's prompt caches survive its unload.

Every child that warm swaps apply to is started with ``--slot-save-path`` set to the agent's
warm folder (0700, never a client's choice). Before the owner stops a child by choice, this
asks it to save each slot's prompt cache there (llama-server's ``POST /slots/N?action=save``);
after a child of the same model identity is ready, and before its first request, it asks
the new child to restore them (``action=restore``). Names and budget: ``core.warm_book``.
A file that fails to restore is deleted with a log line; the folder never holds more than its
budget (least recently used files go first).

Whose caches go where (``core.warm_book``): this counts the tenants each model's child served;
it saves the caches of a child that served one, under that tenant, seals each file with its
checksum, and restores only the files of the one tenant a new child is loaded for, each
checked against its checksum first.

Clients cannot reach these files: the agent answers their own ``/slots`` save, restore and
erase actions as a child without ``--slot-save-path`` does (a preset that sets its own
``slot-save-path`` turns warm swaps off for that model and gets llama.cpp's behaviour).
"""

from __future__ import annotations

import asyncio
import dataclasses
import enum
import hashlib
import logging
import os
from pathlib import Path
from typing import Any

import aiohttp

from node_agent.child.keys import child_key
from node_agent.child.ports import CHILD_HOST
from node_agent.core.warm_book import (
    NOBODY,
    OPEN,
    SavedSlot,
    checksum_matches,
    identity,
    over_budget,
    parse_file,
    restorable,
    save_tenant,
    sealed_file,
    slot_file,
    superseded,
)
from node_agent.sources.spec import ModelSpec, merge_options
from node_agent.state_home import private_folder

log = logging.getLogger("corral.warm")


class Unreached(enum.Enum):
    """No answer from the child (gone, or too slow), as opposed to its refusal."""

    UNREACHED = enum.auto()


UNREACHED = Unreached.UNREACHED

SLOT_SECONDS = 30.0  # one save or restore (a 2,000-token cache of a small model: ~50 MB)
OPTION = "slot-save-path"


@dataclasses.dataclass
class WarmStatistics:
    saved: int = 0  # slots saved
    restored: int = 0  # slots restored (hits)
    missed: int = 0  # loads of a model with warm swaps and no saved cache
    dropped: int = 0  # files that failed to restore, deleted


def _stat_id(path: str | Path) -> tuple[str, int, int]:
    stat = os.stat(path)
    return (str(path), stat.st_size, stat.st_mtime_ns)


class WarmSwaps:
    """The agent's warm folder and the requests that fill and read it."""

    def __init__(self, folder: Path, budget: int, binary: Path, *, keyed: bool) -> None:
        self.folder = private_folder(folder)  # the caches hold what users said: theirs alone
        self.budget = budget
        self._binary = _stat_id(binary)
        self.statistics = WarmStatistics()
        # The agent's own loads (load-on-startup) bring every client's caches back on an
        # agent without keys; with keys, nobody's: no request says whose they would be.
        self.own_tenant = NOBODY if keyed else OPEN
        self._served: dict[str, set[str]] = {}  # model -> the tenants its child served

    def served(self, model: str, tenant: str) -> None:
        """``model``'s child took a request of ``tenant``'s: its caches hold its prompts."""
        self._served.setdefault(model, set()).add(tenant)

    def applies(self, spec: ModelSpec) -> bool:
        """A model whose preset sets its own slot-save-path keeps llama.cpp's behaviour."""
        return spec.get(OPTION) is None and spec.model_path is not None

    def key(self, spec: ModelSpec) -> str | None:
        """``spec``'s identity, as its child will start (None: warm swaps do not apply)."""
        if not self.applies(spec):
            return None
        assert spec.model_path is not None
        try:
            model = _stat_id(spec.model_path)
        except OSError:
            return None
        return identity(model, self._binary, spec.options)

    def child_spec(self, spec: ModelSpec) -> ModelSpec:
        """``spec`` with the warm folder as its slot-save-path."""
        if not self.applies(spec):
            return spec
        return dataclasses.replace(
            spec, options=merge_options(spec.options, [(OPTION, str(self.folder))])
        )

    # -- the child's side ----------------------------------------------------------------

    async def save(self, model: str, port: int, key: str, slots: int) -> int:
        """Save each of ``model``'s child's slots that holds a prompt cache, for the one
        tenant it served; bytes written."""
        served = self._served.pop(model, set())
        tenant = save_tenant(served)
        if tenant is None:
            if served:
                log.info(
                    "warm swaps: model=%s served more than one key's requests (or one of no"
                    " key): its prompt caches are not saved",
                    model,
                )
            return 0
        written: list[SavedSlot] = []
        total = 0
        async with self._session() as session:
            for slot in range(slots):
                name = slot_file(key, tenant, slot)
                answer = await self._action(session, port, slot, "save", name)
                if answer is UNREACHED:
                    break
                if answer is None:
                    continue
                if not answer.get("n_saved"):  # an empty slot: nothing worth keeping
                    await asyncio.to_thread(self._delete, name)
                    continue
                sealed = await asyncio.to_thread(self._seal, name)
                if sealed is None:
                    continue
                written.append(sealed)
                total += int(answer.get("n_written") or 0)
                self.statistics.saved += 1
        await asyncio.to_thread(self._tidy, written)
        return total

    async def restore(
        self, model: str, port: int, key: str, slots: int, waiting: frozenset[str]
    ) -> int:
        """Restore into ``model``'s new child the saved caches of ``key`` that belong to the
        tenant of the requests it was loaded for (``waiting``); how many were restored."""
        self._served.pop(model, None)  # a new child: it has served nobody yet
        found = restorable(await asyncio.to_thread(self.saved, key), key, waiting)
        found = [file for file in found if file.slot < slots]
        if not found:
            self.statistics.missed += 1
            return 0
        restored = 0
        async with self._session() as session:
            for file in found:
                if not await asyncio.to_thread(self._intact, file):
                    log.warning(
                        "warm swaps: %s is not what was saved (its checksum differs); deleted",
                        file.name,
                    )
                    await asyncio.to_thread(self._delete, file.name)
                    self.statistics.dropped += 1
                    continue
                answer = await self._action(session, port, file.slot, "restore", file.name)
                if answer is UNREACHED:  # the child went (an unload while it loaded)
                    break  # not the files' fault: they stay for its next load
                if answer is None:
                    log.warning("warm swaps: %s did not restore; deleted", file.name)
                    await asyncio.to_thread(self._delete, file.name)
                    self.statistics.dropped += 1
                    continue
                await asyncio.to_thread(os.utime, self.folder / file.name)  # recently used
                restored += 1
                self.statistics.restored += 1
        if restored:
            self.served(model, found[0].tenant)
        return restored

    def _session(self) -> aiohttp.ClientSession:
        timeout = aiohttp.ClientTimeout(total=SLOT_SECONDS)
        return aiohttp.ClientSession(timeout=timeout)

    async def _action(
        self, session: aiohttp.ClientSession, port: int, slot: int, action: str, name: str
    ) -> dict[str, Any] | Unreached | None:
        """The child's answer; None where it refused; UNREACHED where it did not answer."""
        url = f"http://{CHILD_HOST}:{port}/slots/{slot}?action={action}"
        headers = {"Authorization": f"Bearer {child_key(port)}"}
        try:
            async with session.post(url, json={"filename": name}, headers=headers) as answer:
                body = await answer.json(content_type=None)
                if answer.status != 200 or not isinstance(body, dict):
                    log.debug(
                        "warm swaps: slot %d %s: HTTP %d %s", slot, action, answer.status, body
                    )
                    return None
                return body
        except ValueError as exc:  # an answer, but not JSON
            log.debug("warm swaps: slot %d %s: not JSON: %s", slot, action, exc)
            return None
        except (aiohttp.ClientError, TimeoutError) as exc:
            log.warning("warm swaps: slot %d %s on port %d failed: %s", slot, action, port, exc)
            return UNREACHED

    # -- the folder ----------------------------------------------------------------------

    def saved(self, key: str | None = None) -> list[SavedSlot]:
        """The saved slots in the folder (``key``'s only, when given)."""
        found = []
        try:
            entries = list(os.scandir(self.folder))
        except OSError:
            return []
        for entry in entries:
            try:
                stat = entry.stat(follow_symlinks=False)
            except OSError:
                continue
            saved = parse_file(entry.name, stat.st_size, stat.st_mtime)
            if saved is not None and (key is None or saved.key == key):
                found.append(saved)
        return found

    def held(self, key: str) -> tuple[int, int]:
        """(files, bytes) saved for ``key``."""
        saved = self.saved(key)
        return len(saved), sum(s.size for s in saved)

    def _checksum(self, name: str) -> str:
        digest = hashlib.sha256()
        with open(self.folder / name, "rb") as file:
            while chunk := file.read(1 << 20):
                digest.update(chunk)
        return digest.hexdigest()

    def _seal(self, name: str) -> SavedSlot | None:
        """The file the child just wrote, renamed for its checksum (None: it is gone)."""
        try:
            sealed = sealed_file(name, self._checksum(name))
            os.replace(self.folder / name, self.folder / sealed)
            stat = os.stat(self.folder / sealed)
        except OSError as exc:
            log.warning("warm swaps: %s could not be sealed: %s", name, exc)
            return None
        return parse_file(sealed, stat.st_size, stat.st_mtime)

    def _intact(self, file: SavedSlot) -> bool:
        try:
            return checksum_matches(file, self._checksum(file.name))
        except OSError:
            return False

    def _tidy(self, written: list[SavedSlot]) -> None:
        """Delete what the save made stale, then what is over the budget."""
        for name in superseded(self.saved(), written):
            self._delete(name)
        keep = [file.name for file in written]
        for name in over_budget(self.saved(), self.budget, keep):
            log.info("warm swaps: %s goes (the folder is over its %d bytes)", name, self.budget)
            self._delete(name)

    def _delete(self, name: str) -> None:
        (self.folder / name).unlink(missing_ok=True)
