"""The agent picks its node's preset file out of the mounted presets ConfigMap."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from preset_operator.render import render

from node_agent.errors import ConfigError
from node_agent.sources.preset_dir import resolve_preset_files
from tests.kubelet import write_configmap_volume


def kubelet_volume(root: Path, files: dict[str, str], version: str = "v1") -> None:
    write_configmap_volume(root, files, version)


def index(files: list[str], nodes: dict[str, list[int]]) -> str:
    return json.dumps({"files": files, "nodes": nodes})


def test_picks_the_nodes_files(tmp_path: Path) -> None:
    kubelet_volume(
        tmp_path,
        {
            "preset-a.ini": "[a]\n",
            "preset-b.ini": "[b]\n",
            "nodes.json": index(["preset-a.ini", "preset-b.ini"], {"n1": [0], "n2": [0, 1]}),
        },
    )
    got = resolve_preset_files(tmp_path, "n2")
    assert [p.read_text() for p in got] == ["[a]\n", "[b]\n"]


def test_reads_what_the_operator_renders(tmp_path: Path) -> None:
    # The contract, end to end in one process: the operator's ConfigMap data, as the kubelet
    # lays it out, gives each node exactly the sections the operator placed there.
    rendering = render(
        [
            {
                "metadata": {"name": name, "creationTimestamp": "2026-01-01T00:00:00Z"},
                "spec": {"source": {"localPath": {"path": f"/models/{name}.gguf"}}, **spec},
            }
            for name, spec in (
                ("everywhere", {}),
                ("gpu-only", {"placement": {"nodeSelector": {"gpu": "yes"}}}),
            )
        ],
        {"cpu-1": {}, "gpu-1": {"gpu": "yes"}, "gpu-2": {"gpu": "yes"}},
    )
    kubelet_volume(tmp_path, rendering.configmap_data())
    sections = {
        node: [
            s
            for p in resolve_preset_files(tmp_path, node)
            for s in re.findall(r"^\[(.+)\]$", p.read_text(), re.M)
        ]
        for node in ("cpu-1", "gpu-1", "gpu-2", "other")
    }
    assert sections == {
        "cpu-1": ["everywhere"],
        "gpu-1": ["everywhere", "gpu-only"],
        "gpu-2": ["everywhere", "gpu-only"],
        "other": [],
    }


def test_the_older_index_is_still_read(tmp_path: Path) -> None:
    # node → one set file, as an operator before the per-preset files wrote it.
    kubelet_volume(
        tmp_path,
        {"set-a.ini": "[a]\n", "nodes.json": json.dumps({"n1": "set-a.ini"})},
    )
    assert [p.read_text() for p in resolve_preset_files(tmp_path, "n1")] == ["[a]\n"]
    assert resolve_preset_files(tmp_path, "n2") == []


def test_node_without_presets_gets_none(tmp_path: Path) -> None:
    kubelet_volume(tmp_path, {"nodes.json": index([], {})})
    assert resolve_preset_files(tmp_path, "n1") == []


def test_an_empty_configmap_means_no_presets_yet(tmp_path: Path) -> None:
    # The chart renders the ConfigMap without data; the operator writes nodes.json later.
    kubelet_volume(tmp_path, {})
    assert resolve_preset_files(tmp_path, "n1") == []
    # A kubelet volume with files but no index is still not a presets ConfigMap.
    other = tmp_path / "other"
    other.mkdir()
    kubelet_volume(other, {"x.ini": "[x]\n"})
    with pytest.raises(ConfigError, match=r"no nodes\.json"):
        resolve_preset_files(other, "n1")


def test_reads_index_and_files_from_one_version(tmp_path: Path) -> None:
    kubelet_volume(
        tmp_path, {"preset-a.ini": "[a]\n", "nodes.json": index(["preset-a.ini"], {"n1": [0]})}
    )
    kubelet_volume(
        tmp_path,
        {"preset-b.ini": "[b]\n", "nodes.json": index(["preset-b.ini"], {"n1": [0]})},
        "v2",
    )
    (got,) = resolve_preset_files(tmp_path, "n1")
    assert got.read_text() == "[b]\n"
    assert got.parent.name == "..v2"  # resolved through ..data, not a top-level link


def test_plain_directory_works_too(tmp_path: Path) -> None:
    (tmp_path / "preset-a.ini").write_text("[a]\n")
    (tmp_path / "nodes.json").write_text(index(["preset-a.ini"], {"n1": [0]}))
    assert resolve_preset_files(tmp_path, "n1") == [tmp_path / "preset-a.ini"]


@pytest.mark.parametrize(
    ("files", "node", "message"),
    [
        ({"x.ini": "[a]\n"}, "n1", "no nodes.json here"),
        ({"nodes.json": "{}"}, None, "NODE_NAME is not set"),
        ({"nodes.json": "{"}, "n1", "cannot read the node index"),
        ({"nodes.json": "[1]"}, "n1", "must map node names"),
        ({"nodes.json": json.dumps({"n1": "set-x.ini"})}, "n1", "not in the ConfigMap"),
        ({"nodes.json": json.dumps({"n1": "../etc/passwd"})}, "n1", "not a file name"),
        (
            {"nodes.json": index(["preset-a.ini"], {"n1": [1]})},
            "n1",
            r"indices into 'files' \(0\.\.0\)",
        ),
        ({"nodes.json": index(["preset-a.ini"], {"n1": [0]})}, "n1", "not in the ConfigMap"),
        ({"nodes.json": json.dumps({"files": "x", "nodes": {}})}, "n1", "must be a list of file"),
    ],
)
def test_clear_errors(
    tmp_path: Path, files: dict[str, str], node: str | None, message: str
) -> None:
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    with pytest.raises(ConfigError, match=message) as err:
        resolve_preset_files(tmp_path, node)
    assert str(tmp_path) in str(err.value)  # names the place


def test_not_a_directory(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="not a directory"):
        resolve_preset_files(tmp_path / "missing", "n1")
