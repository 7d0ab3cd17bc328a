"""The option table's value checks against the llama-server it was generated from (b11434, as
`corral llama-server build` makes it): it runs the binary a few hundred times
(``flag value --help``), so it lives with the tests that spawn real processes."""

from __future__ import annotations

import os
import re
import subprocess
from concurrent.futures import ThreadPoolExecutor

import pytest

from node_agent.sources.options import llama_options
from tests.integration.harness import b11434_path

# Values tried on every checked option: whatever the table refuses, the binary must refuse too.
PROBES = ("lots", "", "auto", "all", "on", "true", ".5", "1", "-1")


def _binary() -> str | None:
    path = str(b11434_path())
    return path if os.access(path, os.X_OK) else None


def _binary_takes(binary: str, flag: str, value: str) -> bool:
    # llama.cpp parses every argument before it acts on --help, so a bad value fails here.
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LLAMA_", "HF_"))}
    done = subprocess.run(
        [binary, flag, value, "--help"], capture_output=True, env=env, timeout=30, check=False
    )
    return done.returncode == 0


def test_checks_agree_with_the_pinned_binary() -> None:
    """The real llama-server refuses every value the table refuses, and takes every default
    and choice the table takes. Deliberate exception: numbers with trailing junk ("1.5" or
    "8k" for an integer), which std::stoi/stof cut short silently instead of refusing."""
    binary = _binary()
    if binary is None:
        pytest.skip("the pinned llama-server is not installed")
    refused: list[tuple[str, str]] = []
    taken: list[tuple[str, str]] = []
    for opt in llama_options():
        if opt.kind not in ("integer", "number", "choice"):
            continue
        flag = opt.flags[-1]
        for value in PROBES:
            if opt.check(value) is not None and not re.match(r"\s*[+-]?\.?[0-9]", value):
                refused.append((flag, value))
        taken += [(flag, v) for v in sorted(opt.accepted()) if v not in ("-1", "1", "0")]
        if opt.default is not None:
            taken.append((flag, opt.default))
    tries = refused + taken
    with ThreadPoolExecutor(max_workers=4) as pool:
        took = dict(zip(tries, pool.map(lambda fv: _binary_takes(binary, *fv), tries), strict=True))
    assert [fv for fv in refused if took[fv]] == []
    assert [fv for fv in taken if not took[fv]] == []
    assert len(refused) > 300
