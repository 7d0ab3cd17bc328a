"""Hugging Face repositories into the hub cache, as llama.cpp b11434 downloads them.

What ``POST /models {"model": "org/repo[:quant]"}`` fetches (``common/hf-cache.cpp``,
``common/download.cpp``, ``common/arg.cpp``):

1. ``GET <endpoint>api/models/<repo>/refs``: the commit of ``main`` (else the first branch),
   written to ``refs/<branch>``;
2. ``GET <endpoint>api/models/<repo>/tree/<commit>?recursive=true``: the files, with their LFS
   ``oid`` (the SHA-256) and size;
3. the file for the quant tag (else ``Q4_K_M``, then ``Q8_0``, then the first model file), all of
   its shards, and the best ``mmproj`` beside it;
4. each into ``blobs/<oid>`` (through :func:`~node_agent.sources.download.transfer`, the one
   downloader), then ``snapshots/<commit>/<path>`` as a relative symlink to the blob.

So ``llama-server -hf org/repo:quant --offline`` and the cache scan (``sources.hf_cache``) both
find the result. The endpoint is ``$MODEL_ENDPOINT``, else ``$HF_ENDPOINT``, else
``https://huggingface.co/``; the token (``--hf-token``/``$HF_TOKEN``) goes in ``Authorization``.
"""

from __future__ import annotations

import asyncio
import functools
import json
import os
import re
import shutil
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

import aiohttp

from node_agent.redact import redact
from node_agent.sources.download import DownloadError, Limits, transfer
from node_agent.sources.hf_cache import NOT_MODELS, SHARD, TAG, gguf_files, snapshot_dir

DEFAULT_ENDPOINT = "https://huggingface.co/"
REPO_FORMAT = "error: invalid HF repo format, expected <user>/<model>[:quant]\n"  # llama.cpp's
DEFAULT_TAGS = ("Q4_K_M", "Q8_0")
_COMMIT = re.compile(r"[0-9a-fA-F]{40}")
_OID = re.compile(r"[0-9a-fA-F]{40}|[0-9a-fA-F]{64}")
_REPO_ID = re.compile(r"[A-Za-z0-9_]+(?:[.-][A-Za-z0-9_]+)*/[A-Za-z0-9_]+(?:[.-][A-Za-z0-9_]+)*")
MAX_API_BYTES = 16 * 1024 * 1024  # a repository's file list; a bigger answer is not the Hub's
OFF_LOOP_JSON = 256 * 1024  # a longer answer is parsed in a thread
# What no file path can hold here: NUL (the OS refuses it), other C0/C1 controls, and lone
# surrogates (JSON can carry them; they cannot be encoded as a file name).
_UNNAMEABLE = re.compile("[\x00-\x1f\x7f-\x9f\ud800-\udfff]")


@dataclass(frozen=True, slots=True)
class HubFile:
    path: str
    url: str
    size: int | None
    sha256: str | None
    """The LFS oid (the file's SHA-256), None for a non-LFS file."""
    blob: Path
    final: Path


@dataclass(frozen=True, slots=True)
class RepoPlan:
    """The files ``name`` downloads, and where they land."""

    name: str
    repo: str
    commit: str
    files: tuple[HubFile, ...]

    @property
    def blobs(self) -> frozenset[str]:
        return frozenset(str(f.blob) for f in self.files)


def endpoint(env: Mapping[str, str]) -> str:
    """llama.cpp's ``common_get_model_endpoint``."""
    value = env.get("MODEL_ENDPOINT") or env.get("HF_ENDPOINT") or DEFAULT_ENDPOINT
    return value if value.endswith("/") else value + "/"


def split_repo_tag(name: str) -> tuple[str, str]:
    """``org/repo:tag`` -> (``org/repo``, ``tag``); ValueError with llama.cpp's message."""
    parts = name.split(":")
    tag = parts[-1] if len(parts) > 1 else ""
    if len(parts[0].split("/")) != 2:
        raise ValueError(REPO_FORMAT)
    return parts[0], tag


def repo_folder(hub: Path, repo: str) -> Path:
    return hub / ("models--" + repo.replace("/", "--"))


def choose(paths: Sequence[str], tag: str) -> list[str]:
    """The files of the model for ``tag``: its shards (first first), then its mmproj.

    llama.cpp's ``find_best_model``: the first model file whose path matches ``<tag>[.-]``
    (case-insensitive), trying ``Q4_K_M`` then ``Q8_0`` when no tag is given, then (no tag
    only) the first model file; a shard other than the first never starts a model.
    """
    models = [p for p in paths if _is_model(p)]
    primary = None
    for t in (tag,) if tag else DEFAULT_TAGS:
        pattern = re.compile(re.escape(t) + r"[.-]", re.IGNORECASE)
        primary = next((p for p in models if pattern.search(p) and _first_shard(p)), None)
        if primary is not None:
            break
    if primary is None and not tag:
        primary = next((p for p in models if _first_shard(p)), None)
    if primary is None:
        return []
    files = _shards(paths, primary)
    mmproj = _best_mmproj(paths, primary)
    return files + ([mmproj] if mmproj else [])


def _is_model(path: str) -> bool:
    name = path.rsplit("/", 1)[-1]
    return name.endswith(".gguf") and not any(m in name for m in (*NOT_MODELS, "imatrix"))


def _first_shard(path: str) -> bool:
    m = SHARD.fullmatch(path.removesuffix(".gguf"))
    return m is None or int(m.group(2)) == 1


def _shards(paths: Sequence[str], primary: str) -> list[str]:
    m = SHARD.fullmatch(primary.removesuffix(".gguf"))
    if m is None:
        return [primary]
    prefix, count = m.group(1), m.group(3)
    found = []
    for p in paths:
        s = SHARD.fullmatch(p.removesuffix(".gguf"))
        if s is not None and s.group(1) == prefix and s.group(3) == count:
            found.append(p)
    return sorted(found)


def _best_mmproj(paths: Sequence[str], primary: str) -> str | None:
    """The projector beside the model: deepest shared folder, then the closest quant bits."""
    model_dir = primary.split("/")[:-1]
    bits = _quant_bits(primary)
    best: tuple[int, int] | None = None
    chosen = None
    for p in paths:
        if not p.endswith(".gguf") or "mmproj" not in p:
            continue
        folder = p.split("/")[:-1]
        if folder != model_dir[: len(folder)]:
            continue
        rank = (-len(folder), abs(_quant_bits(p) - bits))
        if best is None or rank < best:
            best, chosen = rank, p
    return chosen


def _tag(path: str) -> str:
    """llama.cpp's ``get_gguf_split_info(path).tag``: the last ``-``/``.`` part before the
    shard suffix, upper-cased ("" without one); projectors have tags too."""
    prefix = path.removesuffix(".gguf")
    m = SHARD.fullmatch(prefix)
    if m is not None:
        prefix = m.group(1)
    tag = TAG.search(prefix)
    return tag.group(1).upper() if tag else ""


def _quant_bits(path: str) -> int:
    digits = re.search(r"\d+", _tag(path))
    return int(digits.group()) if digits else 0


async def plan(
    session: aiohttp.ClientSession,
    name: str,
    *,
    hub: Path,
    env: Mapping[str, str],
    token: str | None,
) -> RepoPlan:
    """Ask the Hub what ``name`` downloads (two API calls). Raises ValueError for a name that
    is not ``org/repo[:quant]`` and DownloadError when the Hub has no such model."""
    repo, tag = split_repo_tag(name)
    if not _REPO_ID.fullmatch(repo):
        raise DownloadError(f"model '{name}': '{repo}' is not a valid repository id")
    base = endpoint(env)
    refs = await _api(session, f"{base}api/models/{repo}/refs", token, name)
    branch, commit = _branch(refs)
    if commit is None:
        raise DownloadError(f"model '{name}': the repository has no branch to download")
    tree = await _api(session, f"{base}api/models/{repo}/tree/{commit}?recursive=true", token, name)
    entries = _tree_files(tree, name)
    chosen = choose(sorted(entries), tag)
    if not chosen:
        what = f"for tag {tag}" if tag else ""
        ggufs = ", ".join(p for p in sorted(entries) if p.endswith(".gguf")) or "none"
        raise DownloadError(
            f"model '{name}': no GGUF model file {what} in {repo} (its GGUF files: {ggufs})"
        )
    folder = repo_folder(hub, repo)
    files = []
    for path in chosen:
        oid, size, sha256 = entries[path]
        final = folder / "snapshots" / commit / path
        blob = folder / "blobs" / oid if oid else final
        url = f"{base}{repo}/resolve/{commit}/{quote(path, safe='/')}"
        files.append(HubFile(path, url, size, sha256, blob, final))
    _write_ref(folder, branch, commit)
    return RepoPlan(name, repo, commit, tuple(files))


async def _api(session: aiohttp.ClientSession, url: str, token: str | None, name: str) -> object:
    headers = {"Accept": "application/json"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    try:
        async with session.get(url, headers=headers, allow_redirects=False) as response:
            if response.status != 200:
                raise DownloadError(
                    f"model '{name}' cannot be downloaded: the model endpoint "
                    + (
                        "has no such repository"
                        if response.status == 404
                        else "needs a valid token (--hf-token or HF_TOKEN)"
                        if response.status in (401, 403)
                        else "refused the request"
                    )
                )
            body = await _read_up_to(response, MAX_API_BYTES + 1)
    except (aiohttp.ClientError, TimeoutError) as exc:
        where = redact(url.split("api/")[0])
        raise DownloadError(
            f"model '{name}' cannot be downloaded: the model endpoint {where} cannot be reached"
        ) from exc
    if len(body) > MAX_API_BYTES:
        raise DownloadError(f"model '{name}': the model endpoint's answer is too large")
    try:
        # Off the loop when large: a listing of megabytes takes the parser tens of ms.
        parsed: object = (
            json.loads(body)
            if len(body) < OFF_LOOP_JSON
            else await asyncio.to_thread(json.loads, body)
        )
    except ValueError as exc:
        raise DownloadError(f"model '{name}': the model endpoint's answer is not JSON") from exc
    return parsed


async def _read_up_to(response: aiohttp.ClientResponse, limit: int) -> bytes:
    """The body, or its first ``limit`` bytes: one ``read(n)`` returns what is buffered, not
    the whole body (issue 50, row 4: a listing that came in two reads was cut in half)."""
    chunks: list[bytes] = []
    got = 0
    while got < limit:
        chunk = await response.content.read(limit - got)
        if not chunk:
            break
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)


def _branch(refs: object) -> tuple[str, str | None]:
    branches = refs.get("branches") if isinstance(refs, dict) else None
    found: tuple[str, str | None] = ("main", None)
    for b in branches if isinstance(branches, list) else []:
        if not isinstance(b, dict):
            continue
        name, commit = b.get("name"), b.get("targetCommit")
        if not isinstance(name, str) or not isinstance(commit, str):
            continue
        if not _COMMIT.fullmatch(commit) or ".." in name or name.startswith("/"):
            continue
        if name == "main":
            return name, commit
        if found[1] is None:
            found = (name, commit)
    return found


def _tree_files(
    tree: object, name: str = "?"
) -> dict[str, tuple[str | None, int | None, str | None]]:
    """path -> (blob oid, size, sha256) for each safe file entry of a tree listing.

    A path no file can have (a NUL, a control character, half of a surrogate pair) refuses
    the whole listing: the Hub never sends one, and once it killed the download task with the
    model stuck in ``downloading`` (issue 26, row 12)."""
    files: dict[str, tuple[str | None, int | None, str | None]] = {}
    for item in tree if isinstance(tree, list) else []:
        if not isinstance(item, dict) or item.get("type") != "file":
            continue
        path = item.get("path")
        if isinstance(path, str) and _UNNAMEABLE.search(path):
            raise DownloadError(
                f"model '{name}': the model endpoint lists a file path no file can have "
                f"(a NUL or control character): {path[:200]!r}"
            )
        if not isinstance(path, str) or not _safe_subpath(path):
            continue
        lfs = item.get("lfs")
        oid = lfs.get("oid") if isinstance(lfs, dict) else item.get("oid")
        if oid is not None and (not isinstance(oid, str) or not _OID.fullmatch(oid)):
            continue
        size = (lfs if isinstance(lfs, dict) else item).get("size")
        sha256 = oid if isinstance(lfs, dict) and isinstance(oid, str) and len(oid) == 64 else None
        files[path] = (oid, size if isinstance(size, int) and size >= 0 else None, sha256)
    return files


def _safe_subpath(path: str) -> bool:
    parts = path.split("/")
    return bool(path) and not path.startswith("/") and ".." not in parts and "" not in parts


def _write_ref(folder: Path, branch: str, commit: str) -> None:
    ref = folder / "refs" / branch
    ref.parent.mkdir(parents=True, exist_ok=True)
    tmp = ref.with_name(ref.name + ".tmp")
    tmp.write_text(commit, encoding="ascii")  # no newline, as llama.cpp writes it
    tmp.replace(ref)


async def download(
    session: aiohttp.ClientSession,
    plan: RepoPlan,
    *,
    token: str | None,
    limits: Limits,
    progress: Callable[[str, int, int | None], None],
) -> None:
    """Fetch every file of ``plan`` not yet in the cache, then link it into its snapshot."""
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    for file in plan.files:
        if not file.final.exists() and not file.blob.exists():
            await transfer(
                session,
                file.url,
                file.blob,
                sha256=file.sha256,
                size=file.size,
                headers=headers,
                progress=functools.partial(progress, file.url),
                limits=limits,
            )
        else:
            progress(file.url, file.size or 0, file.size)
        _link(file)


def _link(file: HubFile) -> None:
    """``snapshots/<commit>/<path>`` -> ``../../blobs/<oid>`` (llama.cpp's finalize_file)."""
    if file.blob == file.final or os.path.lexists(file.final):
        return
    file.final.parent.mkdir(parents=True, exist_ok=True)
    file.final.symlink_to(os.path.relpath(file.blob, file.final.parent))


def resolve_cached(hub: Path | None, name: str, file: str | None = None) -> str | None:
    """The cached file ``-hf name`` (with ``--hf-file file``) loads, without the network
    (llama.cpp's ``common_download_resolve_path``); None when it is not in the cache."""
    try:
        repo, tag = split_repo_tag(name)
    except ValueError:
        return None
    snapshot = snapshot_dir(repo_folder(hub, repo)) if hub is not None else None
    if snapshot is None:
        return None
    files = gguf_files(snapshot)
    if file:
        return str(snapshot / file) if file in files else None
    chosen = choose(files, tag)
    return str(snapshot / chosen[0]) if chosen else None


def remove_cached(hub: Path, name: str) -> bool:
    """llama.cpp's ``common_download_remove``: the snapshot entries of ``name``'s tag, then the
    blobs no remaining entry links to (no tag: the whole repository). False: nothing there."""
    repo, tag = split_repo_tag(name)
    folder = repo_folder(hub, repo)
    if not tag:
        if not folder.is_dir():
            return False
        shutil.rmtree(folder, ignore_errors=True)
        return True
    snapshots = folder / "snapshots"
    entries = [p for p in snapshots.rglob("*") if p.is_symlink() or p.is_file()]
    doomed = [p for p in entries if p.name.endswith(".gguf") and _tag(p.name) == tag.upper()]
    if not doomed:
        return False
    blobs = {_target(p) for p in doomed if p.is_symlink()}
    kept = {_target(p) for p in entries if p.is_symlink() and p not in doomed}
    for p in doomed:
        p.unlink(missing_ok=True)
    for blob in blobs - kept:
        blob.unlink(missing_ok=True)
    return True


def _target(link: Path) -> Path:
    return Path(os.path.normpath(link.parent / os.readlink(link)))
