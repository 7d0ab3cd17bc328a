"""The distribution ships every package (pyproject lists them by hand: see its comment)."""

from __future__ import annotations

import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_every_package_folder_is_listed_in_pyproject() -> None:
    config = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]
    listed = set(config["packages"])
    found = {
        ".".join(init.parent.relative_to(REPO).parts)
        for init in (REPO / "node_agent").rglob("__init__.py")
    }
    # operator/ ships under the import name preset_operator (the standard library owns
    # `operator`).
    found |= {
        ".".join(("preset_operator", *init.parent.relative_to(REPO / "operator").parts))
        for init in (REPO / "operator").rglob("__init__.py")
    }
    # data-only folders (the status page) are listed too, with their files in package-data
    found |= {name for name in config["package-data"] if name != "*"}
    assert listed == found
    assert config["package-dir"]["preset_operator"] == "operator"
