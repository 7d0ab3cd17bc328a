"""The installed Corral's version, as ``corral --version`` and ``corral agent --version`` say it."""

from __future__ import annotations

import functools

DISTRIBUTION = "corral"


@functools.cache
def version_line() -> str:
    """``corral X.Y.Z`` from the installed distribution's metadata (pyproject's version)."""
    # importlib.metadata is imported here, not at the top: the agent's start imports this
    # module (Ollama's /api/version) and would pay for it before it answers (S6).
    from importlib.metadata import PackageNotFoundError, version

    try:
        return f"corral {version(DISTRIBUTION)}"
    except PackageNotFoundError:
        # Run from a source tree that was never pip-installed: there is no metadata to read.
        return "corral (version unknown: not installed; run `pip install -e .` in the clone)"
