"""The agent picks its node's preset file out of the mounted presets ConfigMap."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from node_agent.errors import ConfigError
from node_agent.sources.preset_dir import resolve_preset_file
from tests.kubelet import write_configmap_volume


def kubelet_volume(root: Path, files: dict[str, str], version: str = "v1") -> None:
    write_configmap_volume(root, files, version)


def test_picks_the_nodes_set(tmp_path: Path) -> None:
    kubelet_volume(
        tmp_path,
        {
            "set-a.ini": "[a]\n",
            "set-b.ini": "[b]\n",
            "nodes.json": json.dumps({"n1": "set-a.ini", "n2": "set-b.ini"}),
        },
    )
    got = resolve_preset_file(tmp_path, "n2")
    assert got is not None and got.read_text() == "[b]\n"


def test_node_without_presets_gets_none(tmp_path: Path) -> None:
    kubelet_volume(tmp_path, {"nodes.json": "{}\n"})
    assert resolve_preset_file(tmp_path, "n1") is None


def test_an_empty_configmap_means_no_presets_yet(tmp_path: Path) -> None:
    # The chart renders the ConfigMap without data; the operator writes nodes.json later.
    kubelet_volume(tmp_path, {})
    assert resolve_preset_file(tmp_path, "n1") is None
    # A kubelet volume with files but no index is still not a presets ConfigMap.
    other = tmp_path / "other"
    other.mkdir()
    kubelet_volume(other, {"x.ini": "[x]\n"})
    with pytest.raises(ConfigError, match=r"no nodes\.json"):
        resolve_preset_file(other, "n1")


def test_reads_index_and_file_from_one_version(tmp_path: Path) -> None:
    kubelet_volume(tmp_path, {"set-a.ini": "[a]\n", "nodes.json": json.dumps({"n1": "set-a.ini"})})
    kubelet_volume(
        tmp_path, {"set-b.ini": "[b]\n", "nodes.json": json.dumps({"n1": "set-b.ini"})}, "v2"
    )
    got = resolve_preset_file(tmp_path, "n1")
    assert got is not None and got.read_text() == "[b]\n"
    assert got.parent.name == "..v2"  # resolved through ..data, not a top-level link


def test_plain_directory_works_too(tmp_path: Path) -> None:
    (tmp_path / "set-a.ini").write_text("[a]\n")
    (tmp_path / "nodes.json").write_text(json.dumps({"n1": "set-a.ini"}))
    assert resolve_preset_file(tmp_path, "n1") == tmp_path / "set-a.ini"


@pytest.mark.parametrize(
    ("files", "node", "message"),
    [
        ({"x.ini": "[a]\n"}, "n1", "no nodes.json here"),
        ({"nodes.json": "{}"}, None, "NODE_NAME is not set"),
        ({"nodes.json": "{"}, "n1", "cannot read the node index"),
        ({"nodes.json": "[1]"}, "n1", "must map node names"),
        ({"nodes.json": json.dumps({"n1": "set-x.ini"})}, "n1", "not in the ConfigMap"),
        ({"nodes.json": json.dumps({"n1": "../etc/passwd"})}, "n1", "not a file name"),
    ],
)
def test_clear_errors(
    tmp_path: Path, files: dict[str, str], node: str | None, message: str
) -> None:
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    with pytest.raises(ConfigError, match=message) as err:
        resolve_preset_file(tmp_path, node)
    assert str(tmp_path) in str(err.value)  # names the place


def test_not_a_directory(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="not a directory"):
        resolve_preset_file(tmp_path / "missing", "n1")
