"""Model files the agent downloads itself, checked against a SHA-256 (SPEC: "a URL the agent
downloads to its cache with sha256 check").

Two preset sources lead here, both rendered by the operator with a Corral key llama-server
lacks: ``model-url`` + ``model-sha256`` and ``hf-repo`` + ``hf-file`` + ``hf-revision``. A plain
``model-url`` or ``hf-repo`` (no Corral key) still goes to the child, which downloads it itself,
exactly as llama.cpp's router does.

The registry asks :func:`needs_download` (pure) for a :class:`DownloadPlan`, awaits
:func:`fetch`, and starts the child on :func:`with_local_model`'s spec, which loads the
verified file with ``--model``.

Cache layout, one flat folder (``$LLAMA_CACHE``, where llama.cpp also puts ``--model-url``
files, else ``~/.cache/corral/models``)::

    <key>-<file name>          the verified file; key = expected SHA-256's first 16 digits,
                               else (no hash known) the URL's
    <key>-<file name>.sha256   "<full hex digest> <size in bytes>", written before the rename
    <key>-<file name>.part     the download in progress

A file is only renamed into place after its hash checked out, so a final file is complete; its
sidecar lets a restart trust it after a ``stat`` instead of re-hashing gigabytes.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import hashlib
import logging
import os
import re
import weakref
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote, unquote, urlsplit

import aiohttp

from node_agent.errors import ChildError, ConfigError
from node_agent.sources.spec import ModelSpec, OptionValue

log = logging.getLogger("corral.download")

HF_ENDPOINT = "https://huggingface.co"  # llama.cpp's default; HF_ENDPOINT overrides it
CHUNK = 1 << 20
# Progress is reported when it moved by at least this much: a GB file read in 64 KiB network
# chunks would otherwise flood /models/sse with tens of thousands of events.
PROGRESS_STEP = 0.01
# No total deadline: a multi-GB file takes as long as it takes; a stalled peer does not.
TIMEOUT = aiohttp.ClientTimeout(total=None, sock_connect=30, sock_read=60)
# The options a downloaded file replaces: the child must load the local file, not fetch again.
REMOTE_OPTIONS = ("model-url", "hf-repo", "hf-file")
_UNSAFE_NAME = re.compile(r"[^A-Za-z0-9._+-]")


class DownloadError(ChildError):
    """A model file could not be downloaded (network, HTTP status, disk)."""


class ChecksumError(DownloadError):
    """A downloaded file's SHA-256 is not the one the preset names; the file was deleted."""

    def __init__(self, url: str, expected: str, actual: str) -> None:
        super().__init__(
            f"download of {url} failed its checksum: expected sha256 {expected}, got {actual}; "
            "the file was deleted (is model-sha256 right, or did the file change upstream?)"
        )
        self.url = url
        self.expected = expected
        self.actual = actual


@dataclass(frozen=True, slots=True)
class DownloadPlan:
    """What to fetch for a model, and where the verified file will be."""

    url: str
    sha256: str | None
    """Expected lower-case hex digest; None for an ``hf-revision`` source without a hash."""
    destination: Path


def cache_dir(env: Mapping[str, str]) -> Path:
    """Where downloads go: ``$LLAMA_CACHE`` (llama.cpp's own download folder), else
    ``~/.cache/corral/models``."""
    if value := env.get("LLAMA_CACHE"):
        return Path(value)
    home = env.get("HOME") or str(Path.home())
    return Path(home, ".cache", "corral", "models")


def destination(url: str, dest_dir: Path, sha256: str | None) -> Path:
    """The cache path of ``url``'s file: its name, prefixed by a key that tells versions apart
    (two URLs with the same content share one file; one URL's name can repeat across repos)."""
    key = (sha256 or hashlib.sha256(url.encode()).hexdigest())[:16]
    name = unquote(urlsplit(url).path.rsplit("/", 1)[-1])
    name = _UNSAFE_NAME.sub("_", name).lstrip(".") or "model.gguf"
    return dest_dir / f"{key}-{name}"


def hf_url(repo: str, file: str, revision: str, endpoint: str = HF_ENDPOINT) -> str:
    """The Hub's download URL of ``file`` in ``repo`` at ``revision``.

    A ``:TAG`` on the repo is dropped: with a file named, llama.cpp's tag only picks a file.
    A revision such as ``refs/pr/1`` is escaped whole, as ``huggingface_hub`` does.
    """
    repo = repo.split(":", 1)[0]
    return (
        f"{endpoint.rstrip('/')}/{repo}/resolve/{quote(revision, safe='')}/"
        f"{quote(file.lstrip('/'), safe='/')}"
    )


def needs_download(
    spec: ModelSpec, cache: Path | None = None, env: Mapping[str, str] | None = None
) -> DownloadPlan | None:
    """The download ``spec`` needs before its child can start, or None (a local file, or a
    source the child fetches itself). ``cache``/``env`` default to the process environment.

    Raises ConfigError for an ``hf-revision`` without ``hf-repo`` and ``hf-file`` (without the
    file name there is nothing to pin; the Hub API is not consulted) and for a ``model-sha256``
    without ``model-url``.
    """
    if spec.model_sha256 is None and spec.hf_revision is None:
        return None
    env = os.environ if env is None else env
    cache = cache_dir(env) if cache is None else cache
    url = _text(spec.get("model-url"))
    if spec.model_sha256 is not None and url is None:
        raise ConfigError(f"model {spec.name}: model-sha256 is set but model-url is not")
    if url is None:
        repo, file = _text(spec.get("hf-repo")), _text(spec.get("hf-file"))
        if repo is None or file is None:
            raise ConfigError(
                f"model {spec.name}: hf-revision needs hf-repo and hf-file (the file to pin)"
            )
        assert spec.hf_revision is not None
        url = hf_url(repo, file, spec.hf_revision, env.get("HF_ENDPOINT") or HF_ENDPOINT)
    return DownloadPlan(url, spec.model_sha256, destination(url, cache, spec.model_sha256))


def with_local_model(spec: ModelSpec, path: Path) -> ModelSpec:
    """``spec`` loading ``path`` with ``--model``, without the options that would make the
    child download it again. An HF model's projector, which ``--hf-repo`` found, stays."""
    options: list[tuple[str, OptionValue]] = [
        (k, v) for k, v in spec.options if k not in REMOTE_OPTIONS and k != "model"
    ]
    options.append(("model", str(path)))
    if spec.cache_mmproj is not None and spec.get("mmproj") is None:
        options.append(("mmproj", spec.cache_mmproj))
    return dataclasses.replace(spec, options=tuple(options), cache_file=None)


def _text(value: OptionValue | None) -> str | None:
    return value if isinstance(value, str) and value else None


# One lock per destination, so two loads of one model never write the same .part: the second
# waits, then finds the file in place. Weak values: a lock lives only while someone holds it,
# and so never outlives the event loop it is bound to.
_locks: weakref.WeakValueDictionary[Path, asyncio.Lock] = weakref.WeakValueDictionary()


async def fetch(
    url: str,
    dest_dir: Path,
    sha256: str | None,
    *,
    session: aiohttp.ClientSession | None = None,
    progress: Callable[[float], None] | None = None,
) -> Path:
    """Download ``url`` into ``dest_dir`` (unless already there and intact); its final path.

    ``progress`` gets the fraction done (0..1) when the server sends a length. Raises
    ChecksumError on a hash mismatch and DownloadError on any other failure; cancelling it
    removes the partial file.
    """
    final = destination(url, dest_dir, sha256)
    lock = _locks.setdefault(final, asyncio.Lock())
    async with lock:
        # In a thread: a file put there without a sidecar is hashed, seconds of CPU per GB.
        if await asyncio.to_thread(_use_cached, final, sha256):
            log.info("using cached %s for %s", final, url)
            return final
        if session is not None:
            await _download(session, url, final, sha256, progress)
        else:
            async with aiohttp.ClientSession(timeout=TIMEOUT) as own:
                await _download(own, url, final, sha256, progress)
        return final


def _use_cached(final: Path, sha256: str | None) -> bool:
    """Whether ``final`` is a complete, verified download (hashing it only without a sidecar);
    when not, its folder is made ready for the download."""
    try:
        size = final.stat().st_size
    except FileNotFoundError:
        final.parent.mkdir(parents=True, exist_ok=True)
        return False
    recorded = _read_sidecar(_sidecar(final))
    if recorded is not None and recorded[1] == size and sha256 in (None, recorded[0]):
        return True
    # No (or a stale) sidecar: a file put there by hand, or a sidecar write that failed.
    actual = _hash_file(final)
    if sha256 is not None and actual != sha256:
        log.warning("cached %s has sha256 %s, not %s: downloading again", final, actual, sha256)
        final.unlink(missing_ok=True)
        return False
    _write_sidecar(final, actual, size)
    return True


async def _download(
    session: aiohttp.ClientSession,
    url: str,
    final: Path,
    sha256: str | None,
    progress: Callable[[float], None] | None,
) -> None:
    part = final.with_name(final.name + ".part")
    digest = hashlib.sha256()
    size = 0
    reported = 0.0
    log.info("downloading %s to %s", url, final)
    try:
        async with session.get(url) as response:
            if response.status != 200:
                raise DownloadError(f"download of {url} failed: HTTP {response.status}")
            total = response.content_length
            # Hashing and writing on the loop: per 1 MiB chunk both take well under a
            # millisecond (page cache), cheaper than a thread hop each.
            with part.open("wb") as out:
                async for chunk in response.content.iter_chunked(CHUNK):
                    digest.update(chunk)
                    out.write(chunk)
                    size += len(chunk)
                    if progress is not None and total:
                        done = min(size / total, 1.0)
                        if done - reported >= PROGRESS_STEP:
                            reported = done
                            progress(done)
            if total is not None and size != total:
                raise DownloadError(f"download of {url} ended early: {size} of {total} bytes")
        actual = digest.hexdigest()
        if sha256 is not None and actual != sha256:
            raise ChecksumError(url, sha256, actual)
        # Sidecar first, then the atomic rename: a final file always has its record.
        _write_sidecar(final, actual, size)
        part.replace(final)
    except BaseException as exc:
        # Also on cancellation (a stop during the download): never leave a .part to be
        # mistaken for progress; the next load starts over.
        part.unlink(missing_ok=True)
        if isinstance(exc, aiohttp.ClientError | TimeoutError):
            raise DownloadError(f"download of {url} failed: {exc or type(exc).__name__}") from exc
        if isinstance(exc, OSError):
            raise DownloadError(f"download of {url} to {part} failed: {exc}") from exc
        raise
    if progress is not None and reported < 1.0:
        progress(1.0)
    log.info("downloaded %s (%d bytes, sha256 %s)", final, size, actual)


def _sidecar(final: Path) -> Path:
    return final.with_name(final.name + ".sha256")


def _read_sidecar(path: Path) -> tuple[str, int] | None:
    try:
        digest, size = path.read_text(encoding="ascii").split()
        return digest, int(size)
    except (OSError, ValueError):
        return None


def _write_sidecar(final: Path, digest: str, size: int) -> None:
    with contextlib.suppress(OSError):  # only a cache hint: without it the file is re-hashed
        _sidecar(final).write_text(f"{digest} {size}\n", encoding="ascii")


def _hash_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(CHUNK):
            digest.update(chunk)
    return digest.hexdigest()
