"""No import cycles among Corral's modules (issue 13), checked the way hack/import-cycles.py
reports them, so that it stays true."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import grimp

SCRIPT = Path(__file__).resolve().parents[2] / "hack" / "import-cycles.py"


def _script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("import_cycles", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_no_module_imports_itself_back() -> None:
    script = _script()
    graph = grimp.build_graph(*script.PACKAGES, cache_dir=None)
    assert script.cycles(graph) == []


def test_the_check_finds_a_cycle() -> None:
    graph = grimp.ImportGraph()
    for module in ("pkg", "pkg.a", "pkg.b", "pkg.c", "pkg.d"):
        graph.add_module(module)
    graph.add_import(importer="pkg.a", imported="pkg.b")
    graph.add_import(importer="pkg.b", imported="pkg.c")
    graph.add_import(importer="pkg.c", imported="pkg.a")
    graph.add_import(importer="pkg.c", imported="pkg.d")
    assert _script().cycles(graph) == [["pkg.a", "pkg.b", "pkg.c"]]
