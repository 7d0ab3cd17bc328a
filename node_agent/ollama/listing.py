"""Ollama's read-only routes: ``/api/tags``, ``/api/ps``, ``/api/show``, ``/api/version``.

The models are the agent's own catalog, named as ``GET /models`` names them. Ollama's
``digest`` is its manifest's hash; a GGUF on disk has none, so here it is a hash of the file's
path, size and modification time: it changes when the file does, which is what clients use it
for, and costs no read of the file.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import re
import time
from collections import OrderedDict
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from aiohttp import web

from node_agent.api.replies import json_reply
from node_agent.api.state import STATE
from node_agent.api.views import preset_text
from node_agent.core.model_state import ModelState
from node_agent.errors import ApiError
from node_agent.memory.devices import HostProbe
from node_agent.ollama.translate import model_name
from node_agent.version import version_line

if TYPE_CHECKING:
    from node_agent.runtime.registry import Registry

# A quantization tag at the end of a file name (SmolLM2-135M-Instruct.Q4_1.gguf -> Q4_1).
_QUANT: Final = re.compile(r"[-.](I?Q\d[A-Z0-9_]*|F16|BF16|F32)$", re.IGNORECASE)
# /api/show's model_info: scalar metadata only, each string at most this long (a chat template
# has its own field), at most this many keys.
INFO_TEXT: Final = 1000
INFO_KEYS: Final = 500
HEADER_SECONDS: Final = 2.0
# /api/show's metadata, kept per file version (path, size, mtime): a header is read once, not
# once a call (issue 50, row 7: 30 calls on a GGUF with a 7.8 MB header, six read at a time,
# took the agent to 379 MiB). What is kept is small: scalars and short strings.
SHOWN_FILES: Final = 64
# How far in the future Ollama's clients read as "never" (a model kept forever).
FOREVER: Final = "9999-12-31T23:59:59Z"
RUNNING: Final = (ModelState.LOADING, ModelState.LOADED, ModelState.SLEEPING)
# What Ollama's clients put before a Hugging Face repository's name.
HF_PREFIXES: Final = ("hf.co/", "huggingface.co/", "https://huggingface.co/")


def find(registry: Registry, given: str) -> str | None:
    """The canonical name for what an Ollama client names, or None. Its clients add
    ``:latest`` to a bare name and keep what they pulled (``hf.co/org/repo``, a tag in any
    case): a Hugging Face repository's name finds its cached model, untagged when it has one
    model only (the file ``/api/pull`` chose), its tag in any case (issue 50, row 8: a pull
    of ``org/repo`` made ``org/repo:Q8_0`` and answered "the download made no model")."""
    for name in (given, given.removesuffix(":latest")):
        for prefix in HF_PREFIXES:
            name = name.removeprefix(prefix)
        if (found := registry.resolve(name)) is not None:
            return found
    repo, _, tag = name.partition(":")
    if "/" not in repo:
        return None
    wanted = f"{repo}:".lower()
    same = [n for n in registry.specs() if n.lower().startswith(wanted)]
    if tag:
        same = [n for n in same if n.partition(":")[2].upper() == tag.upper()]
    return same[0] if len(same) == 1 else None


def resolve(registry: Registry, given: str) -> str:
    """The canonical name for ``given`` (:func:`find`); 404 when there is none."""
    name = find(registry, given)
    if name is None:
        raise ApiError(404, f"model '{given[:200]}' not found (GET /api/tags lists the models)")
    return name


def _iso(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, UTC).isoformat().replace("+00:00", "Z")


def _quant(path: str) -> str:
    match = _QUANT.search(Path(path).stem)
    return match.group(1).upper() if match else ""


def _file_facts(path: str | None) -> tuple[int, float, str]:
    """Size, modification time and Ollama's digest (see the module's docstring)."""
    if path is None:
        return 0, 0.0, ""
    try:
        st = Path(path).stat()
    except OSError:
        return 0, 0.0, ""
    key = f"{path}\0{st.st_size}\0{st.st_mtime_ns}".encode()
    return st.st_size, st.st_mtime, hashlib.sha256(key).hexdigest()


def _details(path: str | None, family: str = "", size_label: str = "") -> dict[str, Any]:
    return {
        "parent_model": "",
        "format": "gguf",
        "family": family,
        "families": [family] if family else None,
        "parameter_size": size_label,
        "quantization_level": _quant(path) if path else "",
    }


def model_facts(name: str, path: str | None) -> dict[str, Any]:
    """One model as ``/api/tags`` lists it (blocking: it stats the file)."""
    size, mtime, digest = _file_facts(path)
    return {
        "name": name,
        "model": name,
        "modified_at": _iso(mtime),
        "size": size,
        "digest": digest,
        "details": _details(path),
    }


async def tags(request: web.Request) -> web.StreamResponse:
    registry = request.app[STATE].registry
    paths = [(n, spec.model_path) for n, spec in registry.listed().items()]
    # Off the loop: one stat per model, and a node may have a thousand.
    models = await asyncio.to_thread(lambda: [model_facts(n, path) for n, path in paths])
    return json_reply({"models": models})  # orjson: 10,000 models in a few ms of the loop


@dataclass(frozen=True)
class Running:
    """What ``/api/ps`` says of one running model, read on the loop (the registry's owner):
    the thread that reads files gets this copy, never the registry."""

    name: str
    path: str | None
    state: str
    pid: int | None
    held: dict[str, int]  # bytes per device, from the ledger (empty when it is off)
    ttl: float | None
    unload_in: float | None  # seconds until an idle unload; None: never
    pinned: bool
    in_flight: int
    queued: int


def running(registry: Registry, name: str, now: float) -> Running:
    view = registry.scheduler.view(name)
    child = registry.child(name)
    spec = registry.spec(name)
    held: dict[str, int] = {}
    if registry.memory is not None:
        held = {d: b for d, b in registry.memory.figures(name)["held"].items() if b}
    ttl = view.ttl
    until = None
    if ttl is not None and not spec.pin:
        idle = 0.0 if view.in_flight else max(0.0, now - view.last_used)
        until = max(0.0, ttl - idle)
    return Running(
        name=name,
        path=spec.model_path,
        state=view.state.value,
        pid=child.pid if child is not None else None,
        held=held,
        ttl=ttl,
        unload_in=until,
        pinned=spec.pin,
        in_flight=view.in_flight,
        queued=view.queued,
    )


def _process_bytes(pid: int | None) -> int:
    """The child's own memory, counted as the ledger counts a running child's (``smaps``)."""
    if pid is None:
        return 0
    return HostProbe().process_usage([pid]).get("host", 0)


def running_entry(model: Running, wall: float) -> dict[str, Any]:
    """One model as ``/api/ps`` lists it, with Corral's own figures under ``corral`` (what
    ``corral ps`` shows). Blocking: it stats the file, and reads the child's ``smaps`` when
    the ledger is off."""
    size = sum(model.held.values()) if model.held else _process_bytes(model.pid)
    until = model.unload_in
    return {
        **model_facts(model.name, model.path),
        "expires_at": _iso(wall + until) if until is not None else FOREVER,
        "size": size,
        "size_vram": sum(b for d, b in model.held.items() if d != "host"),
        "corral": {
            "state": model.state,
            "pid": model.pid,
            "memory": size,
            "memory_source": "ledger" if model.held else "process",
            "devices": sorted(model.held) or ["host"],
            "ttl": model.ttl,
            "unload_in": until,
            "pinned": model.pinned,
            "in_flight": model.in_flight,
            "queued": model.queued,
        },
    }


async def ps(request: web.Request) -> web.StreamResponse:
    registry = request.app[STATE].registry
    now, wall = registry.now(), time.time()
    models = [running(registry, n, now) for n in registry.specs() if registry.state(n) in RUNNING]
    entries = await asyncio.to_thread(lambda: [running_entry(m, wall) for m in models])
    return web.json_response({"models": entries})


class _Shown:
    """The metadata of the last :data:`SHOWN_FILES` files shown, one read at a time each."""

    def __init__(self) -> None:
        self._kept: OrderedDict[tuple[str, int, int], dict[str, Any]] = OrderedDict()
        self._reads: dict[tuple[str, int, int], asyncio.Lock] = {}

    async def metadata(self, path: str | None) -> dict[str, Any]:
        """A copy of ``path``'s metadata: read off the loop the first time for its version,
        by one caller while the others wait for it."""
        try:
            st = os.stat(path) if path is not None else None
        except OSError:
            st = None
        if path is None or st is None:
            return await asyncio.to_thread(_metadata, path)
        key = (path, st.st_size, st.st_mtime_ns)
        lock = self._reads.setdefault(key, asyncio.Lock())
        try:
            async with lock:
                if key not in self._kept:
                    self._kept[key] = await asyncio.to_thread(_metadata, path)
                    while len(self._kept) > SHOWN_FILES:
                        self._kept.popitem(last=False)
                self._kept.move_to_end(key)
                return dict(self._kept[key])
        finally:
            if not lock.locked() and self._reads.get(key) is lock:
                del self._reads[key]


SHOWN = _Shown()


def _metadata(path: str | None) -> dict[str, Any]:
    """The GGUF's scalar metadata (bounded); empty when it cannot be read in time."""
    if path is None:
        return {}
    from node_agent.memory.gguf_header import GgufError, read_header  # gguf: lazily

    try:
        header = read_header(Path(path), time_limit=HEADER_SECONDS)
    except GgufError:
        return {}
    out: dict[str, Any] = {}
    for key, value in header.metadata.items():
        if len(out) >= INFO_KEYS:
            break
        scalar = isinstance(value, (bool, int, float))
        text = isinstance(value, str) and (
            len(value) <= INFO_TEXT or key == "tokenizer.chat_template"
        )
        if scalar or text:
            out[key] = value
    return out


def _file_type(value: object) -> str:
    """GGUF's ``general.file_type`` as a quantization's name (``MOSTLY_Q4_1`` -> ``Q4_1``)."""
    from gguf.constants import LlamaFileType  # gguf: lazily (start-up time)

    if not isinstance(value, int) or isinstance(value, bool):
        return ""
    try:
        return LlamaFileType(value).name.removeprefix("MOSTLY_")
    except ValueError:
        return ""


async def show(request: web.Request, body: dict[str, Any]) -> dict[str, Any]:
    """``POST /api/show``: the model's details, template and metadata."""
    registry = request.app[STATE].registry
    name = resolve(registry, model_name(body))
    spec = registry.spec(name)
    path = spec.model_path
    meta = await SHOWN.metadata(path)
    template = meta.pop("tokenizer.chat_template", "")
    family = str(meta.get("general.architecture", ""))
    size_label = str(meta.get("general.size_label", ""))
    details = _details(path, family, size_label)
    details["quantization_level"] = (
        _file_type(meta.get("general.file_type")) or details["quantization_level"]
    )
    capabilities = ["completion"]
    if spec.mmproj:
        capabilities.append("vision")
    if "tools" in template:
        capabilities.append("tools")
    _, mtime, _ = _file_facts(path)
    return {
        "modelfile": f"# Corral model {name}\nFROM {path or '(downloaded at its first load)'}\n",
        "parameters": preset_text(spec),
        "template": template,
        "details": details,
        "model_info": meta,
        "capabilities": capabilities,
        "modified_at": _iso(mtime),
    }


async def version(request: web.Request) -> web.StreamResponse:
    # Corral's own version: clients show it, and none of Ollama's numbers would be true.
    return web.json_response({"version": version_line().removeprefix("corral ")})
