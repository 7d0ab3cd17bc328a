"""The distribution ships every package (pyproject lists them by hand: see its comment)."""

from __future__ import annotations

import os
import subprocess
import sys
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_every_package_folder_is_listed_in_pyproject() -> None:
    config = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]
    listed = set(config["packages"])
    roots = {"node_agent": REPO, "preset_operator": REPO / "operator"}
    found = {
        ".".join(init.parent.relative_to(parent).parts)
        for name, parent in roots.items()
        for init in (parent / name).rglob("__init__.py")
    }
    # data-only folders (the status page) are listed too, with their files in package-data
    found |= {name for name in config["package-data"] if name != "*"}
    assert listed == found
    assert config["package-dir"]["preset_operator"] == "operator/preset_operator"


def test_the_operator_folder_does_not_shadow_the_standard_library() -> None:
    # A package named `operator` at the repository root would be imported instead of the
    # standard library's module by any `python -m ...` started there (kopf, asyncio need it).
    assert not (REPO / "operator" / "__init__.py").exists()
    run = subprocess.run(
        [sys.executable, "-c", "import operator; print(operator.__file__)"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
        env={k: v for k, v in os.environ.items() if k != "PYTHONSAFEPATH"},
    )
    assert str(REPO) not in run.stdout
