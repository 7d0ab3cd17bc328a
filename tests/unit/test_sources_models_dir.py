"""--models-dir scanning, checked against what llama.cpp's router lists for the same tree."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from node_agent.errors import ConfigError
from node_agent.sources.models_dir import scan_models_dir


def touch(root: Path, *names: str) -> None:
    for name in names:
        p = root / name
        p.parent.mkdir(parents=True, exist_ok=True)
        p.touch()


def test_files_and_folders_as_llama_cpp_lists_them(tmp_path: Path) -> None:
    # Same tree as the llama-server experiment in the report (GET /models of the real router).
    touch(
        tmp_path,
        "a.gguf",
        "b.Q4_K_M.gguf",
        "mmproj-top.gguf",
        "notes.txt",
        "sub/model-f16.gguf",
        "sub/mmproj-model-f16.gguf",
        "shard/big-00002-of-00002.gguf",
        "shard/big-00001-of-00002.gguf",
        ".hidden/x.gguf",
        "empty/readme.md",
    )
    d = str(tmp_path)
    specs = {s.name: s for s in scan_models_dir(d)}
    assert sorted(specs) == [".hidden", "a", "b.Q4_K_M", "mmproj-top", "shard", "sub"]
    assert all(s.source == "models_dir" for s in specs.values())
    assert specs["a"].model_path == os.path.join(d, "a.gguf")
    assert specs["shard"].model_path == os.path.join(d, "shard", "big-00001-of-00002.gguf")
    assert specs["sub"].model_path == os.path.join(d, "sub", "model-f16.gguf")
    assert specs["sub"].mmproj == os.path.join(d, "sub", "mmproj-model-f16.gguf")
    assert specs["sub"].argv() == (
        "--model",
        os.path.join(d, "sub", "model-f16.gguf"),
        "--mmproj",
        os.path.join(d, "sub", "mmproj-model-f16.gguf"),
    )


def test_relative_dir_gives_relative_paths(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    touch(tmp_path, "md/a.gguf")
    monkeypatch.chdir(tmp_path)
    assert scan_models_dir("md")[0].model_path == "md/a.gguf"  # as llama.cpp passes it


def test_missing_or_not_a_directory(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"--models-dir '.*nope' does not exist or is not a"):
        scan_models_dir(str(tmp_path / "nope"))
    touch(tmp_path, "f.gguf")
    with pytest.raises(ConfigError, match="is not a directory"):
        scan_models_dir(str(tmp_path / "f.gguf"))


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads anything")
def test_unreadable_directory(tmp_path: Path) -> None:
    d = tmp_path / "locked"
    d.mkdir()
    d.chmod(0)
    try:
        with pytest.raises(ConfigError, match="cannot be read"):
            scan_models_dir(str(d))
    finally:
        d.chmod(0o755)


def test_thousand_files_scan_fast(tmp_path: Path) -> None:
    for i in range(500):
        (tmp_path / f"m{i}.gguf").touch()
    for i in range(250):
        touch(tmp_path, f"d{i}/w-00001-of-00002.gguf", f"d{i}/w-00002-of-00002.gguf")
    start = time.perf_counter()
    specs = scan_models_dir(str(tmp_path))
    assert len(specs) == 750
    assert time.perf_counter() - start < 1.0
