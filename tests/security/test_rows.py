"""The tier's index is whole: every row of the three rounds, in order, each with a test that
exists (renaming a test without its row fails here), or open with a reason."""

from __future__ import annotations

import ast
from pathlib import Path

from tests.security.rows import ROWS

ROOT = Path(__file__).resolve().parents[2]
ROUNDS = {1: 18, 2: 20, 3: 8}  # rows per round (issues 16, 26, 50)


def _tests_in(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    return {
        node.name
        for node in tree.body
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name.startswith("test")
    }


def test_every_row_of_every_round_is_listed_once_in_order() -> None:
    listed = [(r.round, r.row) for r in ROWS]
    assert listed == [(n, i) for n, rows in ROUNDS.items() for i in range(1, rows + 1)]


def test_every_rows_test_exists_or_the_row_says_why_it_is_open() -> None:
    for row in ROWS:
        if not row.test:
            assert row.open, row
            continue
        file, _, name = row.test.partition("::")
        assert name in _tests_in(ROOT / file), row


def test_the_readme_shows_every_row() -> None:
    readme = (ROOT / "tests/security/README.md").read_text()
    for row in ROWS:
        line = f"| {row.round} | {row.row} | {row.attack} |"
        assert line in readme, line
