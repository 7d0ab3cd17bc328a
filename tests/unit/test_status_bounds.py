"""ModelPreset.status stays bounded whatever the number of nodes (pure; the real apiserver's
422 on an oversized condition message is in tests/cluster/test_status_bounds.py)."""

from __future__ import annotations

import datetime as dt
import json

from preset_operator.status import (
    MESSAGE_LIMIT,
    NODES_SHOWN,
    AgentReport,
    ModelReport,
    compute_status,
)

NOW = dt.datetime(2026, 3, 1, 12, tzinfo=dt.UTC)
STALE = dt.timedelta(seconds=30)
LONG = ".".join(["n" * 60] * 4)  # a 243-character node name


def status_of(nodes: int, reports: dict[str, AgentReport]) -> dict[str, object]:
    return compute_status(
        model_name="m",
        generation=1,
        matched=[f"{i:05d}.{LONG}"[:253] for i in range(nodes)],
        reports=reports,
        previous=None,
        now=NOW,
        stale_after=STALE,
    )


def test_ten_thousand_unknown_nodes_make_a_small_status() -> None:
    st = status_of(10_000, {})
    for cond in st["conditions"]:  # type: ignore[union-attr]
        assert len(cond["message"]) <= MESSAGE_LIMIT
    assert {k: v for k, v in st["nodeCounts"].items() if v} == {"Unknown": 10_000}  # type: ignore[union-attr]
    assert st["matchedNodes"] == 10_000
    assert len(st["nodes"]) == NODES_SHOWN  # type: ignore[arg-type]
    assert len(json.dumps(st)) < 24 * 1024
    ready = next(c for c in st["conditions"] if c["type"] == "Ready")  # type: ignore[union-attr]
    assert ready["message"].startswith("Unknown on 10000 of 10000 node(s): 00000.")
    assert ready["message"].endswith("… and 9990 more")


def test_the_nodes_shown_are_the_ones_that_need_a_look() -> None:
    names = [f"{i:05d}.{LONG}"[:253] for i in range(100)]
    failed = ModelReport("unloaded", failed=True, error="x" * 5000)
    reports = {n: AgentReport(NOW, {"m": ModelReport("loaded")}) for n in names}
    reports[names[70]] = AgentReport(NOW, {"m": failed})
    st = status_of(100, reports)
    shown = {n["name"]: n for n in st["nodes"]}  # type: ignore[union-attr]
    assert names[70] in shown and shown[names[70]]["state"] == "Failed"
    assert len(shown[names[70]]["lastError"]) <= 1024
    assert {k: v for k, v in st["nodeCounts"].items() if v} == {"Failed": 1, "Loaded": 99}  # type: ignore[union-attr]
    degraded = next(c for c in st["conditions"] if c["type"] == "Degraded")  # type: ignore[union-attr]
    assert degraded["status"] == "True" and len(degraded["message"]) < 600
