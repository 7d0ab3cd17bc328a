"""``corral demo-models DIR``: the default set written to disk (~56 MB; moved from the unit
tier, whose generator tests use a smaller model)."""

from __future__ import annotations

from pathlib import Path

import pytest

from node_agent import demo_models as dm
from node_agent.real_model import HOW_TO_GET, MODEL_NAME, real_model_path


def test_cli_writes_the_default_set(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert dm.main([str(tmp_path / "models")]) == 0
    written = sorted(p.name for p in (tmp_path / "models").iterdir())
    # the real model beside them where its wheel is installed (hack/setup.sh installs it;
    # tests/packaging runs the same command in a venv without it)
    real = real_model_path()
    expected = ["demo-medium.gguf", "demo-small.gguf", "demo-tiny.gguf"]
    expected += [f"{MODEL_NAME}.gguf"] if real else []
    assert written == sorted(expected)
    captured = capsys.readouterr()
    assert "demo-tiny.gguf" in captured.out and "MB" in captured.out
    assert "word salad" in captured.err
    assert ("is a real model" if real else HOW_TO_GET) in captured.err
    if real:  # a hard link, or a copy across file systems
        assert (tmp_path / "models" / f"{MODEL_NAME}.gguf").stat().st_size == real.stat().st_size
