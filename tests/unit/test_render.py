"""The operator's pure core: parsing, placement, INI rendering, dedup, status."""

from __future__ import annotations

import datetime as dt
import json
import random
import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from preset_operator.ini import render_ini
from preset_operator.presets import InvalidPreset, parse_args, parse_preset
from preset_operator.render import NODES_KEY, configmap_patch, file_key, render
from preset_operator.status import (
    NODE_STATES,
    AgentReport,
    ModelReport,
    compute_status,
    needs_write,
    parse_models,
    transitions,
)

from node_agent.sources.preset_ini import parse_preset_text
from node_agent.sources.trust import Restricted
from tests.operator.agent_models import model_entry, model_list
from tests.operator.presets import preset

REPO = Path(__file__).resolve().parents[2]


NODES = {
    "gpu-a1": {"gpu": "a100", "zone": "x"},
    "gpu-a2": {"gpu": "a100", "zone": "y"},
    "gpu-h1": {"gpu": "h100", "zone": "x"},
    "cpu-1": {"zone": "x"},
}


def test_args_become_ini_keys() -> None:
    args = ["--ctx-size", "8192", "--flash-attn", "on", "-ngl", "-1", "--temp=0.7", "--no-repack"]
    assert parse_args(args) == (
        ("ctx-size", "8192"),
        ("flash-attn", "on"),
        ("ngl", "-1"),  # a negative number is a value, not an option
        ("temp", "0.7"),
        ("no-repack", "true"),  # a flag: no value follows it
    )


@pytest.mark.parametrize(
    ("args", "why"),
    [
        (["--port", "1"], "--port"),
        (["--host=0.0.0.0"], "--host"),
        (["-m", "/x.gguf"], "-m"),
        (["--models-max", "3"], "--models-max"),
        (["--no-models-autoload"], "--no-models-autoload"),
        (["--api-key", "k"], "--api-key"),
        (["--alias", "x"], "--alias"),
        (["4096"], "not an option"),
        (["--ctx-size", "1", "--ctx-size", "2"], "twice"),
        (["--chat-template", "a\nb"], "line break"),
        # Checked with the agent's own option table: a value it would refuse would make the
        # agent refuse the node's whole preset file.
        (["-c"], "needs a value"),
        (["--ctx-size", "lots"], "expects an integer"),
        (["--flash-attn", "maybe"], "expects one of"),
        (["--ctx-sise", "4096"], "did you mean --ctx-size"),
    ],
)
def test_bad_args_are_refused(args: list[str], why: str) -> None:
    with pytest.raises(InvalidPreset, match=why):
        parse_args(args)


def test_sources_become_model_arguments() -> None:
    hf = parse_preset(
        preset(
            "qwen",
            source={
                "huggingFace": {"repo": "Qwen/Qwen3-GGUF", "file": "q4.gguf", "revision": "v1"}
            },
        )
    )
    url = parse_preset(preset("u", source={"url": {"url": "https://x/y.gguf", "sha256": "a" * 64}}))
    pvc = parse_preset(preset("p", source={"pvc": {"claimName": "models", "subPath": "a/b.gguf"}}))
    text = render_ini([hf, url, pvc])
    assert "[qwen]\nhf-repo = Qwen/Qwen3-GGUF\nhf-file = q4.gguf\nhf-revision = v1\n" in text
    assert f"[u]\nmodel-url = https://x/y.gguf\nmodel-sha256 = {'a' * 64}\n" in text
    assert "[p]\nmodel = /mnt/corral/pvc/models/a/b.gguf\n" in text
    with pytest.raises(InvalidPreset, match="exactly one"):
        parse_preset(
            preset(
                "two",
                source={
                    "localPath": {"path": "/a"},
                    "url": {"url": "https://b", "sha256": "a" * 64},
                },
            )
        )


def test_section_carries_aliases_lifecycle_and_args() -> None:
    p = parse_preset(
        preset(
            "llama",
            modelName="meta/llama:Q4",
            aliases=["llama", "l3"],
            args=["--ctx-size", "4096"],
            lifecycle={
                "loadOnStartup": True,
                "stopTimeout": 20,
                "ttl": 300,
                "pin": False,
                "priority": 5,
            },
        )
    )
    assert render_ini([p]).endswith(
        "; ModelPreset llama\n[meta/llama:Q4]\nmodel = /models/llama.gguf\nalias = llama,l3\n"
        "load-on-startup = true\nstop-timeout = 20\nttl = 300\npin = false\npriority = 5\n"
        "ctx-size = 4096\n"
    )


def test_env_becomes_env_keys_that_the_restricted_agent_reads_back(tmp_path: Path) -> None:
    """spec.env → ``env.NAME = value`` lines, sorted; the agent reads them from the operator's
    (restricted) files with the same allow-list as the administrator's."""
    from node_agent.sources.preset_ini import parse_preset_text
    from node_agent.sources.trust import Restricted

    env = {"GGML_CUDA_NO_PINNED": "1", "CUDA_VISIBLE_DEVICES": "0,1"}
    text = render_ini([parse_preset(preset("big", env=env))])
    assert text.endswith("env.CUDA_VISIBLE_DEVICES = 0,1\nenv.GGML_CUDA_NO_PINNED = 1\n")
    parsed = parse_preset_text(text, "p.ini", Restricted.under([tmp_path]))
    assert dict(parsed.sections["big"].env) == env


@pytest.mark.parametrize(
    ("env", "why"),
    [
        ({"LD_PRELOAD": "/tmp/x.so"}, "may not set LD_PRELOAD"),
        ({"CUDA_DEVICE_ORDER": "FASTEST_FIRST"}, "set by Corral for every child"),
        ({"CUDA_VISIBLE_DEVICES": "0\nmodel = /etc/shadow"}, "is not a device list"),
        ({"CUDA_VISIBLE_DEVICES": 0}, "spec.env must be a map of variable names to strings"),
        (["CUDA_VISIBLE_DEVICES=0"], "spec.env must be a map"),
    ],
)
def test_bad_env_is_refused(env: Any, why: str) -> None:
    # The CRD refuses these too; an operator run against an older CRD must not render them.
    with pytest.raises(InvalidPreset, match=re.escape(why)):
        parse_preset(preset("big", env=env))


def sections(ini: str) -> list[str]:
    return re.findall(r"^\[(.+)\]$", ini, re.M)


def node_models(r: Any, node: str) -> list[str]:
    return [name for key in r.node_sets.get(node, ()) for name in sections(r.files[key])]


def test_placement_files_and_index() -> None:
    objs = [
        preset("small"),  # no selector: every agent node
        preset("big", placement={"nodeSelector": {"gpu": "a100"}}),
        preset("huge", placement={"nodeSelector": {"gpu": "h100"}}),
        preset("nowhere", placement={"nodeSelector": {"gpu": "tpu"}}),
    ]
    r = render(objs, NODES)
    assert r.matched == {
        "small": ("cpu-1", "gpu-a1", "gpu-a2", "gpu-h1"),
        "big": ("gpu-a1", "gpu-a2"),
        "huge": ("gpu-h1",),
        "nowhere": (),
    }
    # One file per placed preset (not "nowhere"), each node listing its own, by model name.
    assert sorted(sections(r.files[k]) for k in r.files) == [["big"], ["huge"], ["small"]]
    assert node_models(r, "gpu-a1") == node_models(r, "gpu-a2") == ["big", "small"]
    assert node_models(r, "cpu-1") == ["small"] and node_models(r, "gpu-h1") == ["huge", "small"]
    for key, text in r.files.items():
        assert key == file_key(text)
    data = r.configmap_data()
    index = json.loads(data[NODES_KEY])
    assert index["files"] == sorted(r.files)
    assert {n: [index["files"][i] for i in ix] for n, ix in index["nodes"].items()} == {
        n: list(keys) for n, keys in r.node_sets.items()
    }
    assert set(data) == set(r.files) | {NODES_KEY}


def test_nodes_without_presets_are_absent_from_the_index() -> None:
    r = render([preset("big", placement={"nodeSelector": {"gpu": "a100"}})], NODES)
    assert set(r.node_sets) == {"gpu-a1", "gpu-a2"}
    assert render([], NODES).configmap_data() == {NODES_KEY: '{"files":[],\n"nodes":{}}\n'}


def test_output_is_deterministic_whatever_the_input_order() -> None:
    objs = [preset(f"m{i}", placement={"nodeSelector": {"zone": "xy"[i % 2]}}) for i in range(8)]
    first = render(objs, NODES).configmap_data()
    for seed in range(5):
        shuffled = objs[:]
        random.Random(seed).shuffle(shuffled)
        nodes = dict(random.Random(seed).sample(sorted(NODES.items()), len(NODES)))
        assert render(shuffled, nodes).configmap_data() == first


def test_name_conflicts_keep_the_older_preset() -> None:
    objs = [
        preset("new", created="2026-02-01T00:00:00Z", aliases=["shared"]),
        preset("old", created="2026-01-01T00:00:00Z", modelName="shared"),
    ]
    r = render(objs, {"n1": {}})
    assert r.offered("old") == ("n1",) and r.offered("new") == ()
    assert "already served on this node by ModelPreset old" in r.conflicts["new"]["n1"]
    assert node_models(r, "n1") == ["shared"]


def test_invalid_presets_are_reported_not_rendered() -> None:
    objs = [
        preset("ok"),
        preset("bad", args=["--port", "9"]),
        preset("dup", args=["--ttl", "3"], lifecycle={"ttl": 5}),
    ]
    r = render(objs, {"n1": {}})
    assert set(r.invalid) == {"bad", "dup"}
    assert node_models(r, "n1") == ["ok"]


def test_configmap_patch_adds_changes_and_removes() -> None:
    assert configmap_patch({"a": "1", "b": "2"}, {"a": "1", "c": "3"}) == {"c": "3", "b": None}
    assert configmap_patch({"a": "1"}, {"a": "1"}) == {}


NOW = dt.datetime(2026, 3, 1, 12, 0, 0, tzinfo=dt.UTC)
STALE = dt.timedelta(seconds=30)


def report(**models: ModelReport) -> AgentReport:
    return AgentReport(last_seen=NOW, models=models)


def cond(status: dict[str, Any], ctype: str) -> dict[str, Any]:
    return next(c for c in status["conditions"] if c["type"] == ctype)


def test_status_ready_when_every_node_serves() -> None:
    st = compute_status(
        model_name="m",
        generation=3,
        matched=["a", "b"],
        reports={
            "a": report(m=ModelReport("loaded", memory={"host": 5})),
            "b": report(m=ModelReport("sleeping")),
        },
        previous=None,
        now=NOW,
        stale_after=STALE,
    )
    assert st["observedGeneration"] == 3 and st["matchedNodes"] == 2 and st["loadedNodes"] == 1
    # No per-node heartbeat time: it would make every poll a status write.
    assert st["nodes"][0] == {"name": "a", "state": "Loaded", "memory": {"host": 5}}
    assert {k: v for k, v in st["nodeCounts"].items() if v} == {"Loaded": 1, "Sleeping": 1}
    # Every state is counted, zeros too: a merge patch would keep a state left out.
    assert set(st["nodeCounts"]) == set(NODE_STATES)
    assert cond(st, "Ready")["status"] == "True" and cond(st, "Degraded")["status"] == "False"
    assert cond(st, "Ready")["observedGeneration"] == 3


def test_status_problems_make_it_degraded_with_an_event() -> None:
    # What keeps the operator from carrying a preset out (a foreign Service of its name, a
    # ConfigMap over the limit) is a reason to be Degraded, named first, and an Event.
    kw: dict[str, Any] = {
        "model_name": "m",
        "generation": 1,
        "matched": ["a"],
        "reports": {"a": report(m=ModelReport("loaded"))},
        "now": NOW,
        "stale_after": STALE,
    }
    ok = compute_status(**kw, previous=None)
    st = compute_status(
        **kw, previous=ok, problems=[("ConfigMapTooLarge", "the presets ConfigMap would be 2 MB")]
    )
    degraded = cond(st, "Degraded")
    assert (degraded["status"], degraded["reason"]) == ("True", "ConfigMapTooLarge")
    assert degraded["message"] == "the presets ConfigMap would be 2 MB"
    assert cond(st, "Ready")["status"] == "True"  # what the nodes serve is unchanged
    assert [(e.type, e.reason) for e in transitions(ok, st)] == [("Warning", "ConfigMapTooLarge")]


def test_status_failed_stale_pending() -> None:
    old = NOW - dt.timedelta(minutes=5)
    st = compute_status(
        model_name="m",
        generation=1,
        matched=["a", "b", "c", "d"],
        reports={
            "a": report(m=ModelReport("unloaded", failed=True, exit_code=137)),
            "b": AgentReport(
                last_seen=old, models={"m": ModelReport("loaded")}, error="agent unreachable: x"
            ),
            "c": report(),
        },
        previous=None,
        now=NOW,
        stale_after=STALE,
    )
    states = {n["name"]: n["state"] for n in st["nodes"]}
    assert states == {"a": "Failed", "b": "Unknown", "c": "Pending", "d": "Unknown"}
    assert st["nodes"][0]["lastError"] == "llama-server exited with code 137"
    assert st["nodes"][1]["lastError"] == "agent unreachable: x"
    assert cond(st, "Ready")["reason"] == "NodesFailed"
    assert cond(st, "Degraded")["status"] == "True"
    assert cond(st, "Degraded")["reason"] == "NodesFailed"


def test_unloaded_counts_as_ready_only_for_lazy_models() -> None:
    kw: dict[str, Any] = dict(
        model_name="m",
        generation=1,
        matched=["a"],
        reports={"a": report(m=ModelReport("unloaded"))},
        previous=None,
        now=NOW,
        stale_after=STALE,
    )
    assert cond(compute_status(**kw), "Ready")["status"] == "True"
    assert cond(compute_status(**kw, load_on_startup=True), "Ready")["status"] == "False"


def test_conditions_keep_transition_time_and_events_fire_on_transitions_only() -> None:
    kw: dict[str, Any] = dict(model_name="m", generation=1, matched=["a"], stale_after=STALE)
    first = compute_status(
        **kw, reports={"a": report(m=ModelReport("loaded"))}, previous=None, now=NOW
    )
    later = NOW + dt.timedelta(seconds=5)
    same = compute_status(
        **kw,
        reports={"a": AgentReport(later, {"m": ModelReport("loaded")})},
        previous=first,
        now=later,
    )
    assert cond(same, "Ready")["lastTransitionTime"] == "2026-03-01T12:00:00Z"
    assert transitions(first, same) == []
    # A later poll that found the same: nothing to write (no heartbeat in the status).
    assert not needs_write(first, same)
    failed = compute_status(
        **kw,
        reports={"a": AgentReport(later, {"m": ModelReport("unloaded", failed=True)})},
        previous=same,
        now=later,
    )
    assert [(t.type, t.reason) for t in transitions(same, failed)] == [
        ("Warning", "NotReady"),
        ("Warning", "NodesFailed"),
    ]
    assert cond(failed, "Ready")["lastTransitionTime"] == "2026-03-01T12:00:05Z"
    assert [t.reason for t in transitions(None, first)] == ["Ready"]


def test_invalid_and_unmatched_status() -> None:
    kw: dict[str, Any] = dict(
        model_name="m", generation=1, reports={}, previous=None, now=NOW, stale_after=STALE
    )
    bad = compute_status(**kw, matched=[], invalid="args may not set --port")
    assert (
        cond(bad, "Degraded")["reason"] == "InvalidSpec" and cond(bad, "Ready")["status"] == "False"
    )
    none = compute_status(**kw, matched=[])
    assert (
        cond(none, "Ready")["reason"] == "NoMatchingNodes"
        and cond(none, "Degraded")["status"] == "False"
    )


def test_parse_models_reads_what_the_agent_serves() -> None:
    # Corral's figures are under each entry's ``corral`` key (the agent's schema), llama.cpp's
    # own router sends none, and a malformed entry is skipped without blanking the others.
    llama_cpp = model_entry("c")
    del llama_cpp["corral"]
    body = model_list(
        [
            model_entry("a", memory={"CUDA0": 7}),
            model_entry("b", "unloaded", exit_code=1, error="error: failed to load model"),
            llama_cpp,
        ]
    )
    body["data"].append({"no": "id"})
    models = parse_models(body)
    assert set(models) == {"a", "b", "c"}
    assert models["a"].memory == {
        "min": {"CUDA0": 7},
        "max": {"CUDA0": 7},
        "effective": {"CUDA0": 7},
        "held": {"CUDA0": 7},
        "placement": None,  # the agent's own figures, as it reports them
    }
    assert models["b"].failed and models["b"].exit_code == 1
    assert models["b"].error == "error: failed to load model"
    assert models["c"].value == "loaded" and models["c"].memory is None
    with pytest.raises(ValueError):
        parse_models({"error": "x"})


def test_every_condition_fits_the_crds_condition_schema() -> None:
    # The CRD validates conditions as metav1.Condition does (type and reason patterns): a
    # status the operator writes with a reason outside them would be refused whole.
    crd = yaml.safe_load((REPO / "crds" / "modelpresets.corral.dev.yaml").read_text())
    schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    item = schema["properties"]["status"]["properties"]["conditions"]["items"]["properties"]
    patterns = {key: re.compile(item[key]["pattern"]) for key in ("type", "reason")}
    base: dict[str, Any] = {"model_name": "m", "generation": 1, "now": NOW, "stale_after": STALE}
    failed = report(m=ModelReport("unloaded", failed=True))
    statuses = [
        compute_status(
            **base, matched=["a"], reports={"a": report(m=ModelReport(state))}, previous=None
        )
        for state in ("loaded", "loading", "downloading", "unloaded")
    ] + [
        compute_status(**base, matched=[], reports={}, previous=None),
        compute_status(**base, matched=["a"], reports={}, previous=None),
        compute_status(**base, matched=["a"], reports={"a": report()}, previous=None),
        compute_status(**base, matched=["a"], reports={"a": failed}, previous=None),
        compute_status(**base, matched=["a"], reports={}, previous=None, invalid="bad"),
        compute_status(**base, matched=["a"], reports={}, previous=None, conflicts={"a": "x"}),
        compute_status(
            **base, matched=["a"], reports={}, previous=None, problems=[("ServiceConflict", "x")]
        ),
        compute_status(
            **base, matched=["a"], reports={}, previous=None, problems=[("ConfigMapTooLarge", "x")]
        ),
        compute_status(
            **base,
            matched=["a"],
            reports={"a": report(m=ModelReport("loaded"))},
            previous=None,
            preset_hash="new",
        ),
    ]
    reasons = set()
    for st in statuses:
        for c in st["conditions"]:
            assert patterns["type"].match(c["type"]) and patterns["reason"].match(c["reason"]), c
            reasons.add(c["reason"])
    assert len(reasons) >= 10  # the scenarios above reach most of them


def test_a_node_that_serves_an_earlier_version_is_outdated_until_it_reports_this_one() -> None:
    """Ready and observedGeneration wait until every node reports the section's current hash
    (issue 25): after an args change a node keeps listing its old child as loaded until its
    kubelet syncs the file and the agent restarts the child."""
    kw: dict[str, Any] = {"model_name": "m", "matched": ["a", "b"], "stale_after": STALE}
    both_v1 = {
        "a": report(m=ModelReport("loaded", preset_hash="v1")),
        "b": report(m=ModelReport("loaded", preset_hash="v1")),
    }
    first = compute_status(
        **kw, generation=1, reports=both_v1, previous=None, now=NOW, preset_hash="v1"
    )
    assert first["observedGeneration"] == 1 and cond(first, "Ready")["status"] == "True"

    # Generation 2: a took it up, b still runs v1, and one agent without a hash (an older
    # one) cannot confirm it either.
    mixed = {
        "a": report(m=ModelReport("loaded", preset_hash="v2")),
        "b": report(m=ModelReport("loaded", preset_hash="v1")),
    }
    st = compute_status(
        **kw, generation=2, reports=mixed, previous=first, now=NOW, preset_hash="v2"
    )
    ready = cond(st, "Ready")
    assert (ready["status"], ready["reason"]) == ("False", "Updating")
    assert ready["message"] == "Outdated on 1 of 2 node(s): b"
    assert st["observedGeneration"] == 1  # the last generation every node confirmed
    assert [n["state"] for n in st["nodes"]] == ["Loaded", "Outdated"]
    assert st["nodeCounts"]["Outdated"] == 1 and st["loadedNodes"] == 1
    assert cond(st, "Degraded")["status"] == "False"  # on its way, not broken
    assert [(e.type, e.reason) for e in transitions(first, st)] == [("Warning", "NotReady")]
    unhashed = {**mixed, "b": report(m=ModelReport("loaded"))}
    assert (
        compute_status(
            **kw, generation=2, reports=unhashed, previous=first, now=NOW, preset_hash="v2"
        )["nodes"][1]["state"]
        == "Outdated"
    )

    done = {**mixed, "b": report(m=ModelReport("unloaded", preset_hash="v2"))}
    st = compute_status(**kw, generation=2, reports=done, previous=st, now=NOW, preset_hash="v2")
    assert st["observedGeneration"] == 2 and cond(st, "Ready")["status"] == "True"


def test_a_new_preset_has_no_observed_generation_until_its_nodes_take_it_up() -> None:
    kw: dict[str, Any] = {
        "model_name": "m",
        "generation": 1,
        "matched": ["a"],
        "previous": None,
        "now": NOW,
        "stale_after": STALE,
        "preset_hash": "v1",
    }
    assert "observedGeneration" not in compute_status(**kw, reports={"a": report()})  # Pending
    # An agent not seen does not hold it (it is Degraded, and Ready stays False).
    unknown = compute_status(**kw, reports={})
    assert unknown["observedGeneration"] == 1 and cond(unknown, "Ready")["status"] == "False"
    # An invalid spec or no node to serve it on: the operator has done all it can.
    assert compute_status(**{**kw, "matched": []}, reports={})["observedGeneration"] == 1
    assert compute_status(**kw, reports={}, invalid="bad")["observedGeneration"] == 1


def test_a_node_that_failed_is_failed_whatever_version_it_reports() -> None:
    """A refused preset (no hash: the agent never ran it) or a failed child is a reason for a
    human to look: it must not hide as Outdated (issue 25, review)."""
    refused = AgentReport(
        last_seen=NOW,
        models=parse_models(
            {
                "object": "list",
                "data": [],
                "refused": [{"origin": "p.ini:1", "reason": "bad", "models": ["m"]}],
            }
        ),
    )
    st = compute_status(
        model_name="m",
        generation=2,
        matched=["a"],
        reports={"a": refused},
        previous=None,
        now=NOW,
        stale_after=STALE,
        preset_hash="v2",
    )
    assert st["nodes"][0]["state"] == "Failed" and "p.ini:1" in st["nodes"][0]["lastError"]
    assert cond(st, "Degraded")["status"] == "True"


def test_the_operator_expects_the_hash_an_agent_computes_reading_its_file(tmp_path: Path) -> None:
    """The operator's expected hash (``Rendering.hashes``) is what an agent reports once it
    read the operator's file with the restricted policy (JSON-quoted values and all)."""
    objs = [preset("q", args=["--temp=0.5"], env={"CUDA_VISIBLE_DEVICES": "0,1"})]
    r = render(objs, {"n1": {}})
    ((key, text),) = r.files.items()
    agent_view = parse_preset_text(text, key, Restricted.under(["/models"]))
    assert agent_view.sections[r.presets["q"].model_name].preset_hash == r.hashes["q"]
    changed = render(
        [preset("q", args=["--temp=0.6"], env={"CUDA_VISIBLE_DEVICES": "0,1"})], {"n1": {}}
    )
    assert changed.hashes["q"] != r.hashes["q"]
