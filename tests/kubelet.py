"""A ConfigMap volume laid out as the kubelet lays it out, for tests of what reads one.

A timestamped directory per version, ``..data`` pointing at the current one, and top-level
symlinks through ``..data``; a new version is an atomic rename of ``..data``, after which links
of removed keys and the old version go (the kubelet's AtomicWriter).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path


def write_configmap_volume(root: Path, files: dict[str, str], version: str) -> None:
    old = (root / "..data").resolve() if (root / "..data").is_symlink() else None
    target = root / f"..{version}"
    target.mkdir()
    for name, text in files.items():
        (target / name).write_text(text)
    tmp = root / "..data_tmp"
    tmp.symlink_to(target.name)
    os.replace(tmp, root / "..data")
    for name in files:
        link = root / name
        if not link.is_symlink():
            link.symlink_to(f"..data/{name}")
    for link in root.iterdir():
        if link.is_symlink() and not link.name.startswith("..") and link.name not in files:
            link.unlink()
    if old is not None and old != target.resolve():
        shutil.rmtree(old)
