"""All sources merged with llama.cpp's precedence; reload diffs."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import pytest

from node_agent.errors import ConfigError
from node_agent.sources.catalog import Catalog, diff_catalogs, load_catalog
from node_agent.sources.spec import ModelSpec

COMMIT = "0123456789abcdef0123456789abcdef01234567"


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    md = tmp_path / "md"
    (md / "sub").mkdir(parents=True)
    (md / "a.gguf").touch()
    (md / "sub" / "w.gguf").touch()
    hub = tmp_path / "hub" / "models--org--repo"
    (hub / "refs").mkdir(parents=True)
    (hub / "refs" / "main").write_text(COMMIT)
    (hub / "snapshots" / COMMIT).mkdir(parents=True)
    (hub / "snapshots" / COMMIT / "repo-Q4_0.gguf").touch()
    return tmp_path


def write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def test_precedence_cache_dir_preset_command_line(tree: Path) -> None:
    ini = write(
        tree / "p.ini",
        "[*]\nc = 1024\nngl = 10\n"
        "[a]\nngl = 20\nalias = first\n"
        "[org/repo:Q4_0]\ntemp = 0.1\n"
        "[remote]\nhf-repo = x/y:Q8_0\nstop-timeout = 3\nload-on-startup = true\n",
    )
    cat = load_catalog(
        hub=tree / "hub",
        models_dir=str(tree / "md"),
        preset_files=[ini],
        cli_options=[("ctx-size", "4096"), ("repack", False), ("model", "ignored.gguf")],
    )
    assert sorted(cat) == ["a", "org/repo:Q4_0", "remote", "sub"]
    assert {n: s.source for n, s in cat.items()} == {
        "a": "preset",  # a section for a scanned model makes it a preset model, as llama.cpp says
        "org/repo:Q4_0": "preset",
        "remote": "preset",
        "sub": "models_dir",
    }
    a = cat["a"]
    # [*] under the model, the section over it, the command line over everything.
    assert a.get("ctx-size") == "4096"
    assert a.get("n-gpu-layers") == "20"
    assert a.get("repack") is False
    assert a.model_path == os.path.join(str(tree / "md"), "a.gguf")  # -m never comes from CLI
    assert cat["sub"].get("n-gpu-layers") == "10"  # [*] reaches models without a section
    assert cat["org/repo:Q4_0"].get("temperature") == "0.1"
    assert cat["org/repo:Q4_0"].get("hf-repo") == "org/repo:Q4_0"
    remote = cat["remote"]
    assert (remote.stop_timeout, remote.load_on_startup) == (3.0, True)
    assert cat["sub"].stop_timeout == 10.0
    assert cat.resolve("first") is a and cat.resolve("a") is a and cat.resolve("zzz") is None
    assert "--no-repack" in a.argv() and "--alias" not in a.argv()


def test_preset_section_merges_into_a_cached_model(tmp_path: Path) -> None:
    hub = tmp_path / "hub" / "models--org--repo"
    (hub / "refs").mkdir(parents=True)
    (hub / "refs" / "main").write_text(COMMIT)
    (hub / "snapshots" / COMMIT).mkdir(parents=True)
    (hub / "snapshots" / COMMIT / "repo-Q4_0.gguf").touch()
    ini = write(tmp_path / "p.ini", "[org/repo:Q4_0]\nngl = 1\n")
    cat = load_catalog(hub=tmp_path / "hub", preset_files=[ini])
    assert dict(cat["org/repo:Q4_0"].options) == {"hf-repo": "org/repo:Q4_0", "n-gpu-layers": "1"}


def test_preset_naming_no_model_is_an_error(tree: Path) -> None:
    ini = write(tree / "p.ini", "[*]\nc = 1\n\n[typo]\nngl = 1\n")
    with pytest.raises(ConfigError) as err:
        load_catalog(models_dir=str(tree / "md"), preset_files=[ini])
    assert err.value.path == str(ini) and err.value.line == 4
    assert "preset [typo] names no model" in str(err.value)


def test_alias_collisions(tree: Path) -> None:
    ini = write(tree / "p.ini", "[a]\nalias = sub\n")
    with pytest.raises(
        ConfigError, match="alias 'sub' for model 'a' conflicts with existing model"
    ):
        load_catalog(models_dir=str(tree / "md"), preset_files=[ini])
    ini = write(tree / "p.ini", "[a]\nalias = x\n[sub]\nalias = x\n")
    with pytest.raises(
        ConfigError, match="alias 'x' for model 'sub' conflicts with alias of model 'a'"
    ):
        load_catalog(models_dir=str(tree / "md"), preset_files=[ini])
    ini = write(tree / "p.ini", "[a]\nalias = a, b\n")  # its own name is harmless
    assert load_catalog(models_dir=str(tree / "md"), preset_files=[ini]).aliases == {"b": "a"}


def test_several_preset_files_merge_in_order(tree: Path) -> None:
    one = write(tree / "1.ini", "[*]\nc = 1\n[a]\nngl = 1\ntemp = 0.1\n")
    two = write(tree / "2.ini", "[*]\nc = 2\n[a]\nngl = 2\n")
    a = load_catalog(models_dir=str(tree / "md"), preset_files=[one, two])["a"]
    assert (a.get("ctx-size"), a.get("n-gpu-layers"), a.get("temperature")) == ("2", "2", "0.1")


def spec(name: str, **kw: object) -> ModelSpec:
    base = ModelSpec(name, "models_dir", options=(("model", f"/m/{name}.gguf"),))
    return dataclasses.replace(base, **kw)  # type: ignore[arg-type]


def test_diff_for_reload() -> None:
    old = Catalog(
        {
            "keep": spec("keep"),
            "gone": spec("gone"),
            "args": spec("args"),
            "meta": spec("meta"),
            "order": spec("order", options=(("model", "/m/o.gguf"), ("ctx-size", "1"))),
        }
    )
    new = Catalog(
        {
            "keep": spec("keep"),
            "args": spec("args", options=(("model", "/m/args.gguf"), ("ctx-size", "8"))),
            "meta": spec("meta", aliases=("m",), ttl=60.0, stop_timeout=3.0, priority=2),
            "order": spec("order", options=(("ctx-size", "1"), ("model", "/m/o.gguf"))),
            "new": spec("new"),
        }
    )
    diff = diff_catalogs(old, new)
    assert diff.added == ("new",)
    assert diff.removed == ("gone",)
    assert diff.changed == ("args",)
    assert diff.updated == ("meta", "order")  # same arguments in another order: no restart


def test_a_folder_model_a_preset_of_another_name_loads_is_listed_once(tmp_path: Path) -> None:
    """Issue 29: one file was listed twice, as the folder's model and as the preset's."""
    folder = tmp_path / "md"
    folder.mkdir()
    (folder / "tiny.gguf").write_bytes(b"GGUF")
    (folder / "other.gguf").write_bytes(b"GGUF-other")
    ini = write(tmp_path / "p.ini", f"[chat]\nmodel = {folder / 'tiny.gguf'}\nc = 512\n")
    cat = load_catalog(models_dir=str(folder), preset_files=[ini])
    listed = sorted(name for name, spec in cat.models.items() if not spec.hidden)
    assert listed == ["chat", "other"]
    assert cat.resolve("tiny") is not None  # still usable by its name
