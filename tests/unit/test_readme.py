"""The README is a user's page, and every command it shows is run by a test.

A test that runs a README command takes it through ``tests.readme.shown``, given its start; this
module collects those calls from every test file and holds the README's shell commands to them,
so a command added to the README without a test (or a test whose command left the README)
fails here. The README's Python blocks are run whole by tests/integration/test_readme_clients.py.
"""

from __future__ import annotations

import re
from pathlib import Path

from tests import readme

TESTS = readme.REPO / "tests"
MAX_LINES = 300
# The project's own commands: CI (.ci/run) runs them, and they run every test.
RUN_BY_CI = {
    "make test": "make test",
    "make lint": "hack/lint.sh",  # the Makefile's lint target is this script
    "hack/test.sh tests/unit": "make test",  # make test is hack/test.sh with no arguments
}
CLAIM = re.compile(r"""readme\.shown\(\s*(?:"([^"]+)"|'([^']+)')\s*\)""")


def _claims() -> dict[str, Path]:
    found = {}
    for path in TESTS.rglob("*.py"):
        for match in CLAIM.finditer(path.read_text()):
            found[match.group(1) or match.group(2)] = path
    return found


def test_the_readme_is_a_users_page_under_300_lines() -> None:
    text = readme.README.read_text()
    assert len(text.splitlines()) <= MAX_LINES
    # its links into the repository lead somewhere
    for target in re.findall(r"\]\(([^)#:]+)(?:#[^)]*)?\)", text):
        assert (readme.REPO / target).exists(), f"README links to {target}, which is not there"


def test_every_command_the_readme_shows_is_run_by_a_test() -> None:
    claims = _claims()
    commands = readme.commands()
    assert commands
    untested = [
        c for c in commands if c not in RUN_BY_CI and not any(c.startswith(k) for k in claims)
    ]
    assert not untested, f"README commands no test runs (tests.readme.shown): {untested}"


def test_every_claim_names_one_command_the_readme_shows() -> None:
    commands = readme.commands()
    for start, path in _claims().items():
        matching = [c for c in commands if c.startswith(start)]
        assert len(matching) == 1, f"{path.name} runs shown({start!r}): {len(matching)} match"


def test_the_commands_ci_runs_are_the_ones_the_readme_names() -> None:
    ci = (readme.REPO / ".ci" / "run").read_text()
    makefile = (readme.REPO / "Makefile").read_text()
    assert "\nmake test\n" in ci and "\nhack/lint.sh\n" in ci
    assert "lint:" in makefile and "\thack/lint.sh" in makefile
    assert "\thack/test.sh\n" in makefile
    shown = set(readme.commands())
    assert set(RUN_BY_CI) <= shown, set(RUN_BY_CI) - shown


def test_the_readmes_python_blocks_are_run() -> None:
    runner = (TESTS / "integration" / "test_readme_clients.py").read_text()
    assert 'readme.blocks("python")' in runner
    assert len(readme.blocks("python")) == 2  # the OpenAI and the Ollama client


def test_commands_join_continued_lines_and_drop_comments() -> None:
    text = "```sh\nfoo --a 1 \\\n  --b 2   # why\n# a note\nbar  # x\n```\n```text\nnot me\n```\n"
    assert readme.commands(text) == ["foo --a 1 --b 2", "bar"]
