"""--models-dir scanning, checked against what llama.cpp's router lists for the same tree."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from node_agent.errors import ConfigError
from node_agent.sources.catalog import load_catalog
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
    specs = {s.name: s for s in scan_models_dir(d).specs}
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
    assert scan_models_dir("md").specs[0].model_path == "md/a.gguf"  # as llama.cpp passes it


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
    specs = scan_models_dir(str(tmp_path)).specs
    assert len(specs) == 750
    assert time.perf_counter() - start < 1.0


def _gguf(path: Path) -> None:
    path.write_bytes(b"GGUF" + b"\0" * 60)  # the magic is what a link is checked for


def test_a_self_looping_link_is_skipped_alone(tmp_path: Path) -> None:
    """Issue 50 row 2: ``ln -s self.gguf self.gguf`` made every scan raise ``OSError: [Errno
    40] Too many levels of symbolic links``: the watcher died and ``?reload=1`` answered 500."""
    _gguf(tmp_path / "a.gguf")
    (tmp_path / "self.gguf").symlink_to("self.gguf")
    (tmp_path / "sub").mkdir()
    _gguf(tmp_path / "sub" / "m.gguf")
    (tmp_path / "sub" / "loop.gguf").symlink_to("loop.gguf")
    catalog = load_catalog(models_dir=str(tmp_path))
    assert sorted(catalog.models) == ["a", "sub"]
    origins = sorted(r.origin for r in catalog.refused)
    assert origins == [str(tmp_path / "self.gguf"), str(tmp_path / "sub" / "loop.gguf")]
    for refusal in catalog.refused:
        assert "too many levels of symbolic links" in refusal.reason.lower()


def test_links_out_of_the_folder_lead_only_to_gguf_files(tmp_path: Path) -> None:
    """Issue 50 row 2: a link to /etc/passwd was listed as a model and llama-server started on
    it; a link to the folder itself was listed as a model folder. A link to a GGUF elsewhere
    (the usual ``ln -s ~/Downloads/x.gguf ~/models/``) stays a model."""
    models, elsewhere = tmp_path / "models", tmp_path / "elsewhere"
    models.mkdir()
    elsewhere.mkdir()
    _gguf(elsewhere / "real.gguf")
    (elsewhere / "passwd").write_text("root:x:0:0:root:/root:/bin/bash\n")
    (models / "real.gguf").symlink_to(elsewhere / "real.gguf")
    (models / "passwd.gguf").symlink_to(elsewhere / "passwd")
    (models / "here").symlink_to(models)
    (models / "up").symlink_to(tmp_path)
    (models / "gone.gguf").symlink_to(elsewhere / "missing.gguf")
    catalog = load_catalog(models_dir=str(models))
    assert sorted(catalog.models) == ["real"]
    reasons = {Path(r.origin).name: r.reason for r in catalog.refused}
    assert sorted(reasons) == ["gone.gguf", "here", "passwd.gguf", "up"]
    assert "not a GGUF file" in reasons["passwd.gguf"]
    assert "the models folder itself" in reasons["here"]
    assert "the models folder itself" in reasons["up"]
