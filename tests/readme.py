"""The README's code, for the tests that run it.

A test that runs a command the README shows takes it from here (``shown``), so the command it
runs is the one a user reads, and tests/unit/test_readme.py can tell that every command shown
is run somewhere: it collects the ``shown("...")`` calls of every test.
"""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
SHELL = ("sh", "bash", "shell")


def blocks(language: str, text: str | None = None) -> list[str]:
    """The README's fenced blocks of ``language`` (```sh, ```python …), in order."""
    found: list[str] = []
    current: list[str] | None = None
    for line in (README.read_text() if text is None else text).splitlines():
        if current is None:
            if line.startswith("```") and line[3:].strip() == language:
                current = []
        elif line.startswith("```"):
            found.append("\n".join(current))
            current = None
        else:
            current.append(line)
    return found


def commands(text: str | None = None) -> list[str]:
    """Every command of the README's shell blocks: a line continued with ``\\`` is one command
    (its parts joined by one space), and a comment after it is the reader's, not the shell's."""
    found = []
    for block in (b for language in SHELL for b in blocks(language, text)):
        pending = ""
        for line in block.splitlines():
            if not line.strip() or line.lstrip().startswith("#"):
                continue
            if line.rstrip().endswith("\\"):
                pending += line.rstrip()[:-1].strip() + " "
                continue
            found.append(re.sub(r"\s+#\s.*$", "", pending + line.strip()).strip())
            pending = ""
    return found


def shown(start: str) -> str:
    """The one command of the README that begins with ``start``, as the README writes it."""
    matches = [c for c in commands() if c.startswith(start)]
    assert len(matches) == 1, f"the README shows {len(matches)} commands that start {start!r}"
    return matches[0]
