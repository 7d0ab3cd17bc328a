"""``--models-dir``: GGUF files and model folders (llama.cpp's ``load_from_models_dir``).

* A top-level ``x.gguf`` is model ``x`` — every one, as llama.cpp lists them (shards and
  ``mmproj`` files at the top level included: put multi-file models in a folder).
* A folder is one model named after the folder: its first shard (``-00001-of-``) or else its
  ``.gguf``; a file whose name contains ``mmproj`` becomes ``--mmproj``. A folder with no
  model file is skipped. Only one level deep; hidden entries count, as in llama.cpp.

Nothing is opened but what a symbolic link leads to. Listing 1,000 files costs a few
``scandir`` calls. Paths are joined to the directory as given (relative stays relative), which
is what llama.cpp passes to its children. Where llama.cpp depends on directory order (a folder
with several plain ``.gguf`` files), Corral picks the first by name so that the result is stable.

Links are followed (``ln -s ~/Downloads/x.gguf ~/models/`` is how many users keep models), but
an entry that cannot be followed is skipped alone and reported (issue 50, row 2: one
``ln -s self.gguf self.gguf`` raised ``ELOOP`` out of every scan, and hot reload died for the
agent's life): a link that loops or leads nowhere, a link to a file that is not GGUF (one to
``/etc/passwd`` was listed, and llama-server started on it), a link to the models folder
itself or a folder above it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from node_agent.errors import ConfigError
from node_agent.sources.spec import SOURCE_MODELS_DIR, ModelSpec

GGUF = ".gguf"  # case-sensitive, as llama.cpp's string_ends_with
GGUF_MAGIC = b"GGUF"
FIRST_SHARD = "-00001-of-"


@dataclass(frozen=True)
class ModelsDir:
    """What a scan of ``--models-dir`` found: the models, sorted by name, and the entries it
    skipped, each with why (path, reason)."""

    specs: list[ModelSpec] = field(default_factory=list)
    skipped: list[tuple[str, str]] = field(default_factory=list)


class _Skip(Exception):
    """An entry that cannot be a model: skipped, with the reason."""


def scan_models_dir(models_dir: str) -> ModelsDir:
    """The models in ``models_dir`` and the entries skipped."""
    if not os.path.isdir(models_dir):
        raise ConfigError(f"--models-dir {models_dir!r} does not exist or is not a directory")
    try:
        entries = sorted(os.scandir(models_dir), key=lambda e: e.name)
    except OSError as e:
        raise ConfigError(f"--models-dir {models_dir!r} cannot be read: {e.strerror}") from e
    found = ModelsDir()
    for entry in entries:
        path = os.path.join(models_dir, entry.name)
        try:
            if _is_dir(entry, models_dir):  # follows links, like std::filesystem::is_directory
                spec = _scan_folder(path, entry.name, found)
                if spec is not None:
                    found.specs.append(spec)
            elif entry.name.endswith(GGUF) and _is_gguf_file(entry):
                # llama.cpp removes every ".gguf" from the name (string_replace_all).
                name = entry.name.replace(GGUF, "")
                model = (("model", path),)
                found.specs.append(ModelSpec(name=name, source=SOURCE_MODELS_DIR, options=model))
        except _Skip as skip:
            found.skipped.append((path, str(skip)))
    return found


def _is_dir(entry: os.DirEntry[str], models_dir: str) -> bool:
    """Whether ``entry`` is a folder to look into (a link to the models folder itself or one
    above it is not: it would list the folder's own models again, or everything above)."""
    try:
        is_dir = entry.is_dir()
    except OSError as exc:
        raise _Skip(_unfollowable(exc)) from None
    if is_dir and entry.is_symlink():
        target, top = os.path.realpath(entry.path), os.path.realpath(models_dir)
        if top == target or top.startswith(target.rstrip(os.sep) + os.sep):
            raise _Skip(f"a link to the models folder itself or a folder above it ({target})")
    return is_dir


def _is_gguf_file(entry: os.DirEntry[str]) -> bool:
    """Whether ``entry`` is a regular file to list; a link must lead to a GGUF file."""
    try:
        if not entry.is_file():
            if entry.is_symlink() and not os.path.exists(entry.path):
                raise _Skip(f"a link that leads nowhere ({os.readlink(entry.path)})")
            return False
        if not entry.is_symlink():
            return True
        # Only a regular file is opened (a link to a FIFO would block the open).
        fd = os.open(entry.path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        try:
            magic = os.read(fd, len(GGUF_MAGIC))
        finally:
            os.close(fd)
    except OSError as exc:
        raise _Skip(_unfollowable(exc)) from None
    if magic != GGUF_MAGIC:
        raise _Skip(f"a link to a file that is not a GGUF file ({os.path.realpath(entry.path)})")
    return True


def _unfollowable(exc: OSError) -> str:
    return f"cannot be followed: {exc.strerror}"


def _scan_folder(folder: str, name: str, found: ModelsDir) -> ModelSpec | None:
    try:
        entries = list(os.scandir(folder))
    except OSError:
        # An unreadable folder holds no model we could start; llama.cpp skips it too.
        return None
    files = []
    for entry in entries:
        try:
            if entry.name.endswith(GGUF) and _is_gguf_file(entry):
                files.append(entry.name)
        except _Skip as skip:
            found.skipped.append((entry.path, str(skip)))
    files.sort()
    model = first_shard = mmproj = None
    for file in files:
        if "mmproj" in file:
            mmproj = mmproj or file
        elif FIRST_SHARD in file:
            first_shard = first_shard or file
        else:
            model = model or file
    chosen = first_shard or model
    if chosen is None:
        return None
    options: list[tuple[str, str | bool]] = [("model", os.path.join(folder, chosen))]
    if mmproj is not None:
        options.append(("mmproj", os.path.join(folder, mmproj)))
    return ModelSpec(name=name, source=SOURCE_MODELS_DIR, options=tuple(options))
