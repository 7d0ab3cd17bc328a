"""Fixtures of the chart tests (helpers live in tests.chart.rendering)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.chart.rendering import SCENARIOS, Rendered, render_objects


@pytest.fixture(scope="session")
def render() -> Callable[..., Rendered]:
    def _do(values: dict[str, Any] | None = None) -> Rendered:
        return Rendered(render_objects(values))

    return _do


@pytest.fixture(params=SCENARIOS, ids=[p.name for p in SCENARIOS])
def scenario(request: pytest.FixtureRequest) -> Path:
    path: Path = request.param
    return path
