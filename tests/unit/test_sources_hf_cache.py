"""The Hugging Face hub cache, named as llama.cpp's router names it (org/repo:TAG)."""

from __future__ import annotations

from pathlib import Path

import pytest

from node_agent.sources.hf_cache import hub_dir, scan_hf_cache, split_gguf_name

COMMIT = "0123456789abcdef0123456789abcdef01234567"


def make_repo(hub: Path, folder: str, files: list[str], ref: str = "main") -> Path:
    repo = hub / folder
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / ref).write_text(COMMIT)
    snap = repo / "snapshots" / COMMIT
    (repo / "blobs").mkdir()
    for i, name in enumerate(files):
        target = snap / name
        target.parent.mkdir(parents=True, exist_ok=True)
        blob = repo / "blobs" / f"sha{i}"
        blob.touch()
        target.symlink_to(blob)
    return snap


def test_hub_folder_order() -> None:
    assert hub_dir({"LLAMA_CACHE": "/l", "HF_HUB_CACHE": "/h"}) == Path("/l")
    assert hub_dir({"HF_HUB_CACHE": "/h", "HF_HOME": "/home"}) == Path("/h")
    assert hub_dir({"HUGGINGFACE_HUB_CACHE": "/o", "HF_HOME": "/x"}) == Path("/o")
    assert hub_dir({"HF_HOME": "/x", "HOME": "/u"}) == Path("/x/hub")
    assert hub_dir({"XDG_CACHE_HOME": "/c", "HOME": "/u"}) == Path("/c/huggingface/hub")
    assert hub_dir({"HOME": "/u"}) == Path("/u/.cache/huggingface/hub")
    assert hub_dir({"LLAMA_CACHE": "", "HOME": "/u"}) == Path("/u/.cache/huggingface/hub")
    assert hub_dir({}) is None


@pytest.mark.parametrize(
    ("path", "expected"),
    [
        ("Llama-3.2-1B-Instruct-Q4_K_M.gguf", ("Q4_K_M", 1)),
        ("model.q8_0.gguf", ("Q8_0", 1)),
        ("Q8_0/Repo-Q8_0-00002-of-00003.gguf", ("Q8_0", 2)),
        ("model.gguf", None),  # no tag: not listed
        ("mmproj-model-F16.gguf", None),
        ("mtp-model-Q4_0.gguf", None),
        ("model-Q4_0.bin", None),
    ],
)
def test_tags_and_shards(path: str, expected: tuple[str, int] | None) -> None:
    assert split_gguf_name(path) == expected


def test_scan_names_sources_and_files(tmp_path: Path) -> None:
    snap = make_repo(
        tmp_path,
        "models--org--Repo-GGUF",
        [
            "Repo-q4_k_m.gguf",
            "Repo.gguf",
            "mmproj-Repo-F16.gguf",
            "Q8_0/Repo-Q8_0-00001-of-00002.gguf",
            "Q8_0/Repo-Q8_0-00002-of-00002.gguf",
            "README.md",
        ],
    )
    make_repo(tmp_path, "models--bert-base", ["bert-Q4_0.gguf"])  # no org: invalid repo id
    make_repo(tmp_path, "datasets--org--data", ["d-Q4_0.gguf"])
    specs = {s.name: s for s in scan_hf_cache(tmp_path)}
    assert sorted(specs) == ["org/Repo-GGUF:Q4_K_M", "org/Repo-GGUF:Q8_0"]
    q4 = specs["org/Repo-GGUF:Q4_K_M"]
    assert q4.source == "cache"
    assert q4.argv() == ("--hf-repo", "org/Repo-GGUF:Q4_K_M")  # what llama.cpp's child gets
    assert q4.model_path == str(snap / "Repo-q4_k_m.gguf")
    assert q4.mmproj == str(snap / "mmproj-Repo-F16.gguf")
    assert specs["org/Repo-GGUF:Q8_0"].model_path == str(
        snap / "Q8_0" / "Repo-Q8_0-00001-of-00002.gguf"
    )


def test_ref_fallback_missing_snapshot_and_broken_links(tmp_path: Path) -> None:
    make_repo(tmp_path, "models--a--b", ["b-Q4_0.gguf"], ref="v1")  # no main: any ref will do
    snap = make_repo(tmp_path, "models--c--d", ["d-Q4_0.gguf"])
    (snap / "d-Q5_0.gguf").symlink_to(snap / "missing-blob")  # not fully downloaded
    bad = tmp_path / "models--e--f"
    (bad / "refs").mkdir(parents=True)
    (bad / "refs" / "main").write_text("not-a-commit")
    assert [s.name for s in scan_hf_cache(tmp_path)] == ["a/b:Q4_0", "c/d:Q4_0"]


def test_absent_hub_lists_nothing(tmp_path: Path) -> None:
    assert scan_hf_cache(tmp_path / "nope") == []
    assert scan_hf_cache(None) == []
