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
    <key>-<file name>.downloadInProgress   the download in progress (resumed after a restart)

A file is only renamed into place after its hash checked out, so a final file is complete; its
sidecar lets a restart trust it after a ``stat`` instead of re-hashing gigabytes.

:func:`transfer` is the one download of the code base: these preset downloads and the
Hugging Face repositories of ``POST /models`` (``sources.hf_hub``) both go through it.
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
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote, unquote, urljoin, urlsplit

import aiohttp

from node_agent.errors import ChildError, ConfigError
from node_agent.redact import redact
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
PARTIAL = ".downloadInProgress"  # llama.cpp's suffix: each resumes the other's partial file
MAX_REDIRECTS = 5
# Where Hugging Face redirects its downloads (its LFS and Xet CDNs): allowed from its own hosts.
HF_CDN_HOSTS = ("huggingface.co", ".huggingface.co", "hf.co", ".hf.co")
# A download never leaves less than this free on the cache's disk (issue 50, row 3: nothing
# bounded one by default, and anyone with the key could fill the disk); checked before the
# body and every DISK_CHECK_BYTES written.
DISK_RESERVE = 1 << 30
DISK_CHECK_BYTES = 64 << 20


@dataclass(frozen=True, slots=True)
class Limits:
    """What a download may do (issue 16, row 9)."""

    max_bytes: int | None = None
    """``--max-download-size``: no file larger than this (None: only the declared size)."""
    redirect_hosts: tuple[str, ...] = ()
    """Hosts (or ``.suffix``es) a redirect may lead to, beyond the same host and HF's CDN."""
    reserve_bytes: int = DISK_RESERVE
    """What a download leaves free on the cache's disk at least."""


class DownloadError(ChildError):
    """A model file could not be downloaded (network, HTTP status, disk)."""


class ChecksumError(DownloadError):
    """A downloaded file's SHA-256 is not the one the preset names; the file was deleted."""

    def __init__(self, url: str) -> None:
        # Neither hash in the message: a client learns nothing of what the remote served.
        super().__init__(
            f"download of {url} failed: checksum mismatch; the file was deleted (is "
            "model-sha256 right, or did the file change upstream?)"
        )
        self.url = url


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
    limits: Limits = Limits(),
) -> Path:
    """Download ``url`` into ``dest_dir`` (unless already there and intact); its final path.

    ``progress`` gets the fraction done (0..1) when the server sends a length. Raises
    ChecksumError on a hash mismatch and DownloadError on any other failure; a failure or a
    cancellation keeps the partial file for the next try to resume.
    """
    final = destination(url, dest_dir, sha256)
    lock = _locks.setdefault(final, asyncio.Lock())
    async with lock:
        # In a thread: a file put there without a sidecar is hashed, seconds of CPU per GB.
        if await asyncio.to_thread(use_cached, final, sha256):
            log.info("using cached %s for %s", final, redact(url))
            return final
        if session is not None:
            await _download(session, url, final, sha256, progress, limits)
        else:
            async with aiohttp.ClientSession(timeout=TIMEOUT) as own:
                await _download(own, url, final, sha256, progress, limits)
        return final


def use_cached(final: Path, sha256: str | None) -> bool:
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
        log.warning("cached %s has the wrong sha256: downloading again", final)
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
    limits: Limits,
) -> None:
    reported = 0.0

    def fraction(done: int, total: int | None) -> None:
        nonlocal reported
        if progress is not None and total:
            value = min(done / total, 1.0)
            if value - reported >= PROGRESS_STEP:
                reported = value
                progress(value)

    actual, size = await transfer(
        session, url, final, sha256=sha256, progress=fraction, limits=limits
    )
    # Sidecar after the rename is fine: a final file without one is only hashed again.
    _write_sidecar(final, actual, size)
    if progress is not None and reported < 1.0:
        progress(1.0)


async def transfer(
    session: aiohttp.ClientSession,
    url: str,
    final: Path,
    *,
    sha256: str | None = None,
    size: int | None = None,
    headers: Mapping[str, str] | None = None,
    progress: Callable[[int, int | None], None] | None = None,
    limits: Limits = Limits(),
) -> tuple[str, int]:
    """Download ``url`` to ``final``; its (sha256, size). The one transfer of the code base:
    preset downloads and ``POST /models`` both come here.

    The bytes go to ``<final>.downloadInProgress`` (llama.cpp's name, so either program resumes
    the other's partial file) and are renamed into place once complete and checked. A partial
    file left by a failure, a cancellation (a shutdown) or a crash is resumed with a ``Range``
    request; whoever cancels a download for good removes it (:func:`discard_partial`).
    Redirects are followed only to the same host or an allowed one. The size the source
    declares (a hub's listing) bounds the body: a ``Content-Length`` that disagrees is refused
    at once, and so is a body of no known size that no SHA-256 checks (it could end anywhere
    and look complete). The body may not outgrow ``limits.max_bytes`` either, nor leave less
    than ``limits.reserve_bytes`` free on the disk. Errors say what failed without the
    remote's status or the body's hash (those go to the log): DownloadError, ChecksumError.
    """
    part = final.with_name(final.name + PARTIAL)
    shown = redact(url)
    await asyncio.to_thread(final.parent.mkdir, parents=True, exist_ok=True)
    digest, have = await asyncio.to_thread(_resume_state, part)
    cap = limits.max_bytes
    if size is not None and cap is not None and size > cap:
        raise DownloadError(
            f"download of {shown} refused: it is {size} bytes, over --max-download-size ({cap})"
        )
    try:
        async with _open(session, url, dict(headers or {}), have, limits) as response:
            if have and response.status != 206:
                have, digest = 0, hashlib.sha256()  # the server ignored the range: start over
            total = _expected_total(response, have, size, shown)
            if total is None and sha256 is None:
                part.unlink(missing_ok=True)
                raise DownloadError(
                    f"download of {shown} refused: the source declares no size and the server "
                    "sends no length, and no sha256 checks it: it cannot be told complete"
                )
            if cap is not None and total is not None and total > cap:
                raise DownloadError(
                    f"download of {shown} refused: it is {total} bytes, over "
                    f"--max-download-size ({cap})"
                )
            if total is not None:
                _check_room(part, total - have, limits.reserve_bytes, shown)
            bound = min(b for b in (total, cap) if b is not None) if (total or cap) else None
            done = have
            checked = done
            if progress is not None:
                progress(done, total)
            with part.open("ab" if have else "wb") as out:
                async for chunk in response.content.iter_chunked(CHUNK):
                    done += len(chunk)
                    if bound is not None and done > bound:
                        part.unlink(missing_ok=True)  # not worth resuming
                        raise DownloadError(
                            f"download of {shown} stopped: the body is larger than "
                            f"{'declared' if total is not None and bound == total else 'allowed'}"
                            f" ({bound} bytes)"
                        )
                    digest.update(chunk)
                    out.write(chunk)
                    if done - checked >= DISK_CHECK_BYTES:
                        checked = done
                        _check_room(part, 0, limits.reserve_bytes, shown)
                    if progress is not None:
                        progress(done, total)
            if total is not None and done != total:
                raise DownloadError(f"download of {shown} ended early: {done} of {total} bytes")
        actual = digest.hexdigest()
        if sha256 is not None and actual != sha256:
            log.warning("download of %s: sha256 %s, expected %s", shown, actual, sha256)
            part.unlink(missing_ok=True)
            raise ChecksumError(shown)
        part.replace(final)
    except (aiohttp.ClientError, TimeoutError) as exc:
        log.warning("download of %s failed: %s", shown, redact(str(exc) or type(exc).__name__))
        raise DownloadError(f"download of {shown} failed: the connection failed") from exc
    except OSError as exc:
        raise DownloadError(f"download of {shown} to {part} failed: {exc.strerror}") from exc
    log.info("downloaded %s to %s (%d bytes, sha256 %s)", shown, final, done, actual)
    return actual, done


@contextlib.asynccontextmanager
async def _open(
    session: aiohttp.ClientSession,
    url: str,
    headers: dict[str, str],
    have: int,
    limits: Limits,
) -> AsyncIterator[aiohttp.ClientResponse]:
    """GET ``url`` following only allowed redirects; the response once it is the file's."""
    if have:
        headers["Range"] = f"bytes={have}-"
    current = url
    for _ in range(MAX_REDIRECTS + 1):
        sent = headers if same_host(url, current) else _without_auth(headers)
        response = await session.get(current, headers=sent, allow_redirects=False)
        try:
            if response.status in (301, 302, 303, 307, 308):
                target = urljoin(current, response.headers.get("Location", ""))
                if not redirect_allowed(url, target, limits.redirect_hosts):
                    log.warning(
                        "download of %s: refused a redirect to %s", redact(url), redact(target)
                    )
                    raise DownloadError(
                        f"download of {redact(url)} refused: {_redirect_refusal(url, target)}"
                    )
                current = target
                continue
            if response.status not in (200, 206):
                log.warning("download of %s: HTTP %d", redact(current), response.status)
                raise DownloadError(
                    f"download of {redact(url)} failed: the server refused it"
                    + (" (not found)" if response.status == 404 else "")
                    + (
                        " (authentication needed: set HF_TOKEN)"
                        if response.status in (401, 403)
                        else ""
                    )
                )
            yield response
            return
        finally:
            response.release()
    raise DownloadError(f"download of {redact(url)} failed: too many redirects")


def _redirect_refusal(origin: str, target: str) -> str:
    """Why a redirect was not followed, in words (a ``file://`` one has no host to name)."""
    scheme = urlsplit(target).scheme
    if scheme not in ("http", "https"):
        return f"it redirects to a {scheme or 'schemeless'}:// URL, which is not allowed"
    if urlsplit(origin).scheme == "https" and scheme != "https":
        return "it redirects from https to http, which is not allowed"
    return f"it redirects to another host ({urlsplit(target).hostname}), which is not allowed"


def discard_partial(final: Path) -> None:
    """Remove the partial file of ``final`` (a download cancelled for good: llama.cpp's rule)."""
    final.with_name(final.name + PARTIAL).unlink(missing_ok=True)


def _expected_total(
    response: aiohttp.ClientResponse, have: int, size: int | None, shown: str
) -> int | None:
    """The file's size: the one declared, else what the server says it sends. A server that
    says otherwise than the declaration is refused (a 1,000-byte file sent as 10^12 bytes)."""
    length = response.content_length
    sent = None if length is None else have + length
    if size is not None and sent is not None and sent != size:
        raise DownloadError(
            f"download of {shown} refused: the server sends {sent} bytes of a file declared "
            f"at {size} bytes"
        )
    return size if size is not None else sent


def _check_room(part: Path, more: int, reserve: int, shown: str) -> None:
    """Refuse (and drop the partial file) when writing ``more`` bytes would leave less than
    ``reserve`` free on ``part``'s disk."""
    stats = os.statvfs(part.parent)
    free = stats.f_bavail * stats.f_frsize
    if free - more < reserve:
        part.unlink(missing_ok=True)
        raise DownloadError(
            f"download of {shown} stopped: the disk of {part.parent} has {free >> 20} MiB free, "
            f"and a download leaves at least {reserve >> 20} MiB free"
            + (f" (this one needs {more >> 20} MiB more)" if more else "")
        )


def _resume_state(part: Path) -> tuple[Any, int]:
    """The digest of a partial file's bytes and its length (0 when there is none)."""
    digest = hashlib.sha256()
    try:
        with part.open("rb") as f:
            while chunk := f.read(CHUNK):
                digest.update(chunk)
        return digest, part.stat().st_size
    except FileNotFoundError:
        return digest, 0


def _without_auth(headers: Mapping[str, str]) -> dict[str, str]:
    # A token is for the host it was given for, never for where that host redirects.
    return {k: v for k, v in headers.items() if k.lower() != "authorization"}


def same_host(a: str, b: str) -> bool:
    x, y = urlsplit(a), urlsplit(b)
    return (x.scheme, x.hostname, x.port) == (y.scheme, y.hostname, y.port)


def redirect_allowed(origin: str, target: str, extra_hosts: tuple[str, ...] = ()) -> bool:
    """Whether a download from ``origin`` may follow a redirect to ``target``: the same host,
    Hugging Face's own CDN when the download started at Hugging Face, or a host (or
    ``.suffix``) the operator allowed. Never a downgrade from https to http."""
    o, t = urlsplit(origin), urlsplit(target)
    if t.scheme not in ("http", "https") or (o.scheme == "https" and t.scheme != "https"):
        return False
    if same_host(origin, target):
        return True
    host = (t.hostname or "").lower()
    allowed = [h.lower() for h in extra_hosts]
    if _is_hf_host(o.hostname or ""):
        allowed.extend(HF_CDN_HOSTS)
    return any(host == h.lstrip(".") or (h.startswith(".") and host.endswith(h)) for h in allowed)


def _is_hf_host(host: str) -> bool:
    host = host.lower()
    return any(host == h.lstrip(".") or host.endswith(h) for h in HF_CDN_HOSTS)


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
