#!/usr/bin/env python3
"""Import cycles among Corral's modules (issue 13): there must be none.

    python hack/import-cycles.py [--modules]

Builds the import graph with grimp (import-linter's engine), every import counted: those inside
functions and under ``TYPE_CHECKING`` too. Prints each cycle (a strongly connected group of
modules) and exits 1 if there is one; ``--modules`` also lists every module with its line count.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import grimp

PACKAGES = ("node_agent", "preset_operator")
REPO = Path(__file__).resolve().parents[1]


def cycles(graph: grimp.ImportGraph) -> list[list[str]]:
    """Groups of modules that import each other, directly or not (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(module: str) -> None:
        # Iterative: a deep chain of imports must not hit Python's recursion limit.
        work = [(module, iter(sorted(graph.find_modules_directly_imported_by(module))))]
        index[module] = low[module] = len(index)
        stack.append(module)
        on_stack.add(module)
        while work:
            node, targets = work[-1]
            for target in targets:
                if target not in graph.modules:
                    continue
                if target not in index:
                    index[target] = low[target] = len(index)
                    stack.append(target)
                    on_stack.add(target)
                    imported = graph.find_modules_directly_imported_by(target)
                    work.append((target, iter(sorted(imported))))
                    break
                if target in on_stack:
                    low[node] = min(low[node], index[target])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    group = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        group.append(member)
                        if member == node:
                            break
                    if len(group) > 1 or node in graph.find_modules_directly_imported_by(node):
                        found.append(sorted(group))

    for module in sorted(graph.modules):
        if module not in index:
            visit(module)
    return found


def line_counts(graph: grimp.ImportGraph) -> list[tuple[str, int]]:
    rows = []
    for module in sorted(graph.modules):
        spec = importlib.util.find_spec(module)
        if spec is not None and spec.origin and spec.origin.endswith(".py"):
            rows.append((module, len(Path(spec.origin).read_text().splitlines())))
    return rows


def main(argv: list[str]) -> int:
    sys.path.insert(0, str(REPO))
    graph = grimp.build_graph(*PACKAGES, cache_dir=None)
    if "--modules" in argv:
        rows = line_counts(graph)
        for module, lines in rows:
            print(f"{lines:6d}  {module}")
        print(f"{sum(n for _, n in rows):6d}  total, {len(rows)} modules")
    found = cycles(graph)
    for group in found:
        print("import cycle: " + " <-> ".join(group))
    if not found:
        print(f"no import cycles among {len(graph.modules)} modules of {', '.join(PACKAGES)}")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
