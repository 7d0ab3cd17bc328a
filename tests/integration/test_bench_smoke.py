"""The benchmark's smoke size, end to end: it runs, and reports every scenario and target.

No timing is asserted (CI machines are noisy); the full size is run by hand (hack/bench.sh).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.integration.harness import REPO

SCENARIOS = ("S1", "S2", "S2R", "S3", "S4", "S5", "S6", "S7", "S8", "S9")
HEADER = "| Scenario | Metric | Corral | llama.cpp router | Direct child |"


def _processes_mentioning(text: str) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes()
            state = (entry / "stat").read_text().rpartition(")")[2].split()[0]
        except OSError:
            continue
        if text.encode() in cmdline and state != "Z":
            found.append(int(entry.name))
    return found


# A hang guard, not a speed check: 45 s was not enough while other processes kept both cores
# busy (issue 13).
SMOKE_LIMIT = 180


@pytest.mark.slow
@pytest.mark.timeout(SMOKE_LIMIT + 30)
def test_smoke_benchmark_reports_every_scenario_and_target(demo_dir: Path, tmp_path: Path) -> None:
    # The run puts its work folder (models dirs, logs) next to the models it is given: give
    # it models inside tmp_path, so that any process left behind can be found by that path.
    models = tmp_path / "demo"
    models.mkdir()
    for source in demo_dir.glob("*.gguf"):
        try:
            os.link(source, models / source.name)
        except OSError:  # another filesystem
            shutil.copyfile(source, models / source.name)
    out = tmp_path / "results"
    # As hack/bench.sh runs it.
    command = [
        sys.executable, "-m", "bench.run",
        "--smoke", "--out", str(out), "--models", str(models),
    ]  # fmt: skip
    run = subprocess.Popen(
        command, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        stdout, stderr = run.communicate(timeout=SMOKE_LIMIT)
    except subprocess.TimeoutExpired:
        # SIGTERM, not SIGKILL: the run then stops every server it started.
        run.terminate()
        stdout, stderr = run.communicate(timeout=10)
        pytest.fail(f"the smoke benchmark took over {SMOKE_LIMIT} s:\n{stderr[-3000:]}")
    assert run.returncode == 0, stderr[-3000:]
    assert HEADER in stdout

    data = json.loads((out / "latest.json").read_text())
    assert data["size"] == "smoke"
    assert {"cores", "cpu_model", "python", "llama_server"} <= set(data["machine"])
    by_id = {s["id"]: s for s in data["scenarios"]}
    assert sorted(by_id) == list(SCENARIOS)
    for scenario in by_id.values():
        assert scenario["errors"] == {}, scenario["errors"]
        for target in scenario["targets"]:
            assert scenario["samples"].get(target), (scenario["id"], target)
            # The headline metric has a figure for every target the scenario applies to.
            headline = scenario["metrics"][0]["values"]
            assert headline.get(target) is not None, (scenario["id"], target, headline)
        for router in ("corral", "llama.cpp"):
            assert router in scenario["resources"], (scenario["id"], router)

    table = (out / "latest.md").read_text()
    assert HEADER in table
    for scenario_id in SCENARIOS:
        assert f"| {scenario_id} |" in table
    assert not _processes_mentioning(str(tmp_path)), "the benchmark left processes running"


@pytest.mark.timeout(SMOKE_LIMIT)
@pytest.mark.parametrize("tls", [[], ["--tls"]], ids=["http", "https"])
def test_peers_at_scale_runs_and_leaves_nothing_behind(tls: list[str]) -> None:
    """``bench/peers_at_scale.py`` at a smoke size: every subscription opens (it says so,
    else exits 1), a figure is printed, and neither the agent nor the played peers outlive it."""
    done = subprocess.run(
        [sys.executable, "-m", "bench.peers_at_scale", "--peers", "3", "--seconds", "1", *tls],
        cwd=REPO, capture_output=True, text=True, timeout=SMOKE_LIMIT, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    scheme = "HTTPS" if tls else "HTTP"
    assert f"1 agent, 3 peers ({scheme}), 40 models each" in done.stdout, done.stdout
    assert "the agent's CPU" in done.stdout
    assert _processes_mentioning("bench.peers_at_scale") == []
