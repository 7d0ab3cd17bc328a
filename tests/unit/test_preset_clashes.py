"""A restricted preset (the operator's, from a ModelPreset) that clashes with the node's own
models is refused alone, with its reason; it never merges over them (issue 26, rows 9 and 10).

Row 9: a ModelPreset alias equal to a models-dir or cache model's name raised ConfigError for
the whole catalog (the agent did not start; every later preset update failed). Row 10: a
ModelPreset named like a models-dir model merged over it and replaced its file and options.
The administrator's own INI keeps llama.cpp's semantics: a section merges into the model of its
name, and a clash of names fails the whole file.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from node_agent.errors import ConfigError
from node_agent.sources.catalog import Catalog, load_catalog
from node_agent.sources.trust import Restricted

COMMIT = "0123456789abcdef0123456789abcdef01234567"


@pytest.fixture
def node(tmp_path: Path) -> Path:
    """A models dir with ``local`` and a hub cache with ``org/repo:Q4_0``."""
    models = tmp_path / "models"
    models.mkdir()
    (models / "local.gguf").write_bytes(b"GGUF")
    (models / "other.gguf").write_bytes(b"GGUF")
    repo = tmp_path / "hub" / "models--org--repo"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(COMMIT)
    (repo / "snapshots" / COMMIT).mkdir(parents=True)
    (repo / "snapshots" / COMMIT / "repo-Q4_0.gguf").write_bytes(b"GGUF")
    return tmp_path


def operator_files(node: Path, **presets: str) -> list[Path]:
    """One INI file per preset, as the operator renders its ConfigMap."""
    paths = []
    for name, text in presets.items():
        path = node / f"preset-{name}.ini"
        path.write_text(f"; Rendered by the corral operator\n{text}")
        paths.append(path)
    return paths


def catalog(node: Path, files: list[Path], *, restricted: bool = True) -> Catalog:
    return load_catalog(
        hub=node / "hub",
        models_dir=str(node / "models"),
        preset_files=files,
        restricted=Restricted.under([node / "models", node / "hub"]) if restricted else None,
    )


@pytest.mark.parametrize("alias", ["local", "org/repo:Q4_0"])
def test_row9_an_alias_equal_to_a_node_model_refuses_that_preset_alone(
    node: Path, alias: str
) -> None:
    model = node / "models" / "other.gguf"
    files = operator_files(
        node,
        good=f"[good]\nmodel = {model}\n",
        taker=f"[taker]\nmodel = {model}\nalias = {alias}\n",
    )
    cat = catalog(node, files)
    assert sorted(cat) == ["good", "local", "org/repo:Q4_0", "other"]
    assert cat.resolve(alias) is cat[alias]  # the node's model keeps its name
    (refusal,) = cat.refused
    assert refusal.models == ("taker",)
    assert refusal.origin == f"{files[1]}:2"
    assert (
        f"alias '{alias}'" in refusal.reason
        and "already the name of a model this node has" in refusal.reason
    )


def test_row9_an_alias_equal_to_another_presets_name_or_alias_refuses_one(node: Path) -> None:
    model = node / "models" / "other.gguf"
    files = operator_files(
        node,
        a=f"[a]\nmodel = {model}\nalias = shared\n",
        b=f"[b]\nmodel = {model}\nalias = shared\n",
        c=f"[c]\nmodel = {model}\nalias = a\n",
    )
    cat = catalog(node, files)
    assert "a" in cat and cat.resolve("shared") is cat["a"]
    assert {r.models for r in cat.refused} == {("b",), ("c",)}


@pytest.mark.parametrize("name", ["local", "org/repo:Q4_0"])
def test_row10_a_preset_named_like_a_node_model_never_merges_over_it(node: Path, name: str) -> None:
    before = catalog(node, [])[name]
    evil = node / "models" / "other.gguf"
    files = operator_files(node, evil=f"[{name}]\nmodel = {evil}\nctx-size = 64\n")
    cat = catalog(node, files)
    assert cat[name] == before  # its file and options are the node's, untouched
    (refusal,) = cat.refused
    assert refusal.models == (name,)
    assert "this node already has a model of that name" in refusal.reason


def test_row10_a_section_without_a_file_does_not_borrow_the_node_models(node: Path) -> None:
    files = operator_files(node, opts="[local]\nctx-size = 64\n")
    cat = catalog(node, files)
    assert cat["local"].get("ctx-size") is None
    assert [r.models for r in cat.refused] == [("local",)]


def test_a_preset_may_name_the_cache_entry_of_its_own_download(node: Path) -> None:
    """A ModelPreset whose Hugging Face source the agent downloaded into the cache, named as
    the cache names it: the same file, so the section still applies to it."""
    own = "[org/repo:Q4_0]\nhf-repo = org/repo\nhf-file = repo-Q4_0.gguf\nctx-size = 64\n"
    cat = catalog(node, operator_files(node, own=own))
    assert cat.refused == ()
    assert cat["org/repo:Q4_0"].get("ctx-size") == "64"
    other = "[org/repo:Q4_0]\nhf-repo = org/other\nhf-file = repo-Q4_0.gguf\n"
    cat = catalog(node, operator_files(node, own=other))
    assert [r.models for r in cat.refused] == [("org/repo:Q4_0",)]


def test_the_administrators_presets_keep_llama_cpps_merge(node: Path) -> None:
    model = node / "models" / "other.gguf"
    (ini,) = operator_files(node, admin=f"[local]\nmodel = {model}\nctx-size = 64\n")
    cat = catalog(node, [ini], restricted=False)
    assert cat["local"].model_path == str(model)  # merged over the scanned model
    assert cat["local"].get("ctx-size") == "64"
    (clash,) = operator_files(node, admin2=f"[x]\nmodel = {model}\nalias = local\n")
    with pytest.raises(ConfigError, match="conflicts with existing model name"):
        catalog(node, [clash], restricted=False)


def entry(name: str, source: str, state: str = "loaded") -> dict[str, object]:
    """A GET /models entry with what the schema requires."""
    return {
        "id": name,
        "aliases": [],
        "tags": [],
        "object": "model",
        "owned_by": "llamacpp",
        "created": 0,
        "status": {"value": state, "args": []},
        "architecture": {},
        "source": source,
        "can_remove": False,
    }


def test_the_operator_shows_a_refusal_over_the_nodes_own_model_of_that_name() -> None:
    from preset_operator.status import parse_models

    refused = [{"origin": "/p/preset-local.ini:2", "reason": "taken", "models": ["local"]}]
    body = {"object": "list", "data": [entry("local", "models_dir")], "refused": refused}
    report = parse_models(body)["local"]
    assert report.failed and report.error is not None and "taken" in report.error
    # the preset's earlier version, kept running after a bad update, still shows as it runs
    body["data"] = [entry("local", "preset")]
    assert parse_models(body)["local"].value == "loaded"
