"""The soak in a reduced size (the full one: ``hack/soak.py``); see :mod:`.soak`."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.integration.soak import SoakConfig, prepare_models, run_soak


@pytest.mark.slow
# 1,000 requests: about 30 s on 2 cores, busy or not (its children run one thread each).
@pytest.mark.timeout(600)
def test_soak_loses_nothing_and_leaks_nothing(
    demo_dir: Path, llama_server: str, tmp_path: Path
) -> None:
    config = SoakConfig(requests=1000, clients=16, binary=llama_server)
    figures = run_soak(config, prepare_models(tmp_path / "models", demo_dir), tmp_path)
    print(figures.report())
    assert figures.requests == 1000
    # Every request was answered with success, except those whose client hung up.
    assert figures.successes + figures.disconnected == figures.requests, figures.report()
    assert not figures.errors and not figures.documented_errors, figures.report()
    assert not figures.violations, figures.report()
    assert figures.leaks_found == 0, figures.report()
    # The invariants were really watched, and the load really crowded the two slots.
    assert figures.invariant_samples >= 50
    assert figures.max_children == config.models_max
    assert figures.unloads["200"] > 0
