"""How to install one of Corral's optional parts, worded one way wherever it is missing."""

from __future__ import annotations

EXTRAS = {
    "cpu": "a prebuilt llama-server for Linux x86_64 with AVX-512",
    "nvidia": "pynvml, for the memory ledger's GPU figures",
    "operator": "kopf and the Kubernetes client",
}


def install_hint(extra: str) -> str:
    """One line: what the extra brings and the command that installs it."""
    # Corral is not on PyPI yet: the install is from a clone (README, "Install").
    return (
        f"Corral's `{extra}` extra ({EXTRAS[extra]}) installs it: "
        f"pip install '.[{extra}]' in Corral's folder"
    )
