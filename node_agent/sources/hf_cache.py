"""Models already in the Hugging Face hub cache (llama.cpp's ``common_list_cached_models``).

Layout: ``<hub>/models--org--repo/{refs/main, snapshots/<commit>/<file> -> ../../blobs/<sha>}``.
One model per repository and quant tag, named ``org/repo:TAG``; its child gets
``--hf-repo org/repo:TAG`` exactly as llama.cpp's router does, and Corral also records the
resolved file (``cache_file``) so the memory ledger can read its header without a download.

Rules taken from llama.cpp (``common/hf-cache.cpp``, ``common/download.cpp``):

* the hub folder is ``$LLAMA_CACHE`` itself, else ``$HF_HUB_CACHE``, ``$HUGGINGFACE_HUB_CACHE``,
  ``$HF_HOME/hub``, ``$XDG_CACHE_HOME/huggingface/hub``, ``~/.cache/huggingface/hub``;
* only ``models--<org>--<repo>`` folders with a valid repo id (exactly one ``/``);
* the snapshot is the commit in ``refs/main``, else in any other ref (40 hex digits);
* every ``.gguf`` under the snapshot, recursively: ``-NNNNN-of-NNNNN`` shards other than the
  first are skipped; the tag is the last ``-``/``.``-separated part of the name (before the
  shard suffix), upper-cased; a file with no tag is skipped; files whose path contains
  ``mmproj``, ``mtp-``, ``eagle3-``, ``dflash-`` or ``dspark-`` are projectors/draft heads,
  not models;
* a broken symlink (a blob not fully downloaded) is skipped, where llama.cpp would list it.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path

from node_agent.sources.spec import SOURCE_CACHE, ModelSpec

SHARD = re.compile(r"(.+)-([0-9]{5})-of-([0-9]{5})", re.IGNORECASE)
TAG = re.compile(r"[-.]([A-Z0-9_]+)$", re.IGNORECASE)
_COMMIT = re.compile(r"[0-9a-fA-F]{40}")
_REPO_ID = re.compile(r"[A-Za-z0-9_]+(?:[.-][A-Za-z0-9_]+)*/[A-Za-z0-9_]+(?:[.-][A-Za-z0-9_]+)*")
NOT_MODELS = ("mmproj", "mtp-", "eagle3-", "dflash-", "dspark-")


def hub_dir(env: Mapping[str, str]) -> Path | None:
    """The hub folder llama.cpp would scan for this environment."""
    for var, sub in (
        ("LLAMA_CACHE", ()),
        ("HF_HUB_CACHE", ()),
        ("HUGGINGFACE_HUB_CACHE", ()),
        ("HF_HOME", ("hub",)),
        ("XDG_CACHE_HOME", ("huggingface", "hub")),
        ("HOME", (".cache", "huggingface", "hub")),
    ):
        value = env.get(var)
        if value:
            return Path(value, *sub)
    return None


def split_gguf_name(path: str) -> tuple[str, int] | None:
    """``dir/model-Q4_K_M-00001-of-00002.gguf`` -> ("Q4_K_M", 1); None without a tag."""
    if not path.endswith(".gguf"):
        return None
    prefix = path[: -len(".gguf")]
    index = 1
    m = SHARD.fullmatch(prefix)
    if m:
        prefix, index = m.group(1), int(m.group(2))
    tag = TAG.search(prefix)
    if tag is None or any(marker in prefix for marker in NOT_MODELS):
        return None
    return tag.group(1).upper(), index


def scan_hf_cache(hub: Path | None) -> list[ModelSpec]:
    """The cached models, sorted by name; an absent or unreadable hub lists nothing."""
    if hub is None or not hub.is_dir():
        return []
    specs: dict[str, ModelSpec] = {}
    try:
        repos = sorted(os.scandir(hub), key=lambda e: e.name)
    except OSError:
        return []
    for repo in repos:
        if not repo.name.startswith("models--") or not repo.is_dir():
            continue
        repo_id = repo.name[len("models--") :].replace("--", "/")
        if not _REPO_ID.fullmatch(repo_id):
            continue
        snapshot = snapshot_dir(Path(repo.path))
        if snapshot is None:
            continue
        files = gguf_files(snapshot)
        # The projector -hf picks also depends on the quant; the ledger only needs one.
        mmproj = next((str(snapshot / rel) for rel in files if "mmproj" in rel), None)
        for rel in files:
            split = split_gguf_name(rel)
            if split is None or split[1] != 1:
                continue
            name = f"{repo_id}:{split[0]}"
            if name not in specs:  # first file of a tag wins, as in llama.cpp
                specs[name] = ModelSpec(
                    name=name,
                    source=SOURCE_CACHE,
                    options=(("hf-repo", name),),
                    cache_file=str(snapshot / rel),
                    cache_mmproj=mmproj,
                )
    return [specs[k] for k in sorted(specs)]


def snapshot_dir(repo: Path) -> Path | None:
    refs = repo / "refs"
    commit = _read_ref(refs / "main")
    if commit is None and refs.is_dir():
        for ref in sorted(p for p in refs.rglob("*") if p.is_file()):
            commit = _read_ref(ref)
            if commit is not None:
                break
    if commit is None:
        return None
    snapshot = repo / "snapshots" / commit
    return snapshot if snapshot.is_dir() else None


def _read_ref(path: Path) -> str | None:
    try:
        lines = path.read_text(encoding="ascii").splitlines()
    except (OSError, UnicodeDecodeError):
        return None
    commit = lines[0].strip() if lines else ""
    return commit if _COMMIT.fullmatch(commit) else None


def gguf_files(snapshot: Path) -> list[str]:
    found: list[str] = []
    for root, _dirs, files in os.walk(snapshot, followlinks=True):
        for file in files:
            full = os.path.join(root, file)
            if file.endswith(".gguf") and os.path.isfile(full):  # isfile: skip broken links
                found.append(os.path.relpath(full, snapshot).replace(os.sep, "/"))
    return sorted(found)
