"""The soak in a reduced size, on a busy machine (the full one: ``hack/soak.py``); see
:mod:`.soak`."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.integration.soak import SoakConfig, prepare_models, run_soak


@pytest.mark.slow
# 800 requests from 64 clients beside two spinning processes: about 20 s on 2 cores.
@pytest.mark.timeout(600)
def test_soak_loses_nothing_and_leaks_nothing(
    demo_dir: Path, llama_server: str, tmp_path: Path
) -> None:
    config = SoakConfig(
        requests=800,
        clients=64,
        hog=2,  # other work takes both cores' worth: a busy machine (issue 48)
        binary=llama_server,
        # At -c 512 demo-medium's estimate is 64.6 MiB: two of them never fit in 120 MiB
        # together, any other pair does, so the ledger evicts as well as the count.
        corral_flags=("--memory-limit", "host=120MiB"),
    )
    figures = run_soak(config, prepare_models(tmp_path / "models", demo_dir), tmp_path)
    print(figures.report())
    assert figures.requests == 800
    # Every request was answered (a malformed one with its 4xx), except those whose client
    # hung up: none waited until its client gave up (60 s).
    assert figures.successes + figures.disconnected == figures.requests, figures.report()
    assert not figures.errors and not figures.documented_errors, figures.report()
    assert not figures.violations, figures.report()
    assert figures.leaks_found == 0, figures.report()
    # The invariants were really watched, and the load really crowded the two slots.
    assert figures.invariant_samples >= 50
    assert figures.max_children == config.models_max
    assert figures.max_ledger_held > 0
    assert figures.unloads["200"] > 0
