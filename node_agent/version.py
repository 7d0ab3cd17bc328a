"""The installed Corral's version, as ``corral --version`` and ``corral agent --version`` say it."""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

DISTRIBUTION = "corral"


def version_line() -> str:
    """``corral X.Y.Z`` from the installed distribution's metadata (pyproject's version)."""
    try:
        return f"corral {version(DISTRIBUTION)}"
    except PackageNotFoundError:
        # Run from a source tree that was never pip-installed: there is no metadata to read.
        return "corral (version unknown: not installed; run `pip install -e .` in the clone)"
