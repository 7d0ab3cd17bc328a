"""The routing metrics' text: what an InferencePool's endpoint picker is told of an agent,
from the real scheduler (tests/cluster/test_inference_pool.py holds it to the real picker)."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
from prometheus_client.parser import text_string_to_metric_families

from node_agent.api.routing_metrics import NOTHING, QUEUED, RESIDENT_INFO, routing_text, shown
from node_agent.core.scheduler import DecisionKind, Scheduler
from tests.unit.test_scheduler import load, make


@dataclass
class Downloads:
    going: list[str] = field(default_factory=list)

    def active(self, name: str) -> bool:
        return name in self.going

    def names(self) -> list[str]:
        return list(self.going)


def parsed(
    sched: Scheduler, downloads: Downloads | None = None
) -> dict[str, tuple[dict[str, str], float]]:
    """Each family's one sample: its labels and value, as a Prometheus parser reads them."""
    text = routing_text(sched, downloads or Downloads()).decode()
    out = {}
    for family in text_string_to_metric_families(text):
        (sample,) = family.samples
        out[family.name] = (sample.labels, sample.value)
    return out


def info(sched: Scheduler, downloads: Downloads | None = None) -> dict[str, str]:
    return parsed(sched, downloads)[RESIDENT_INFO][0]


def loading(sched: Scheduler, name: str) -> None:
    waiter = sched.join(name)
    assert sched.poll(waiter, 0).kind is DecisionKind.LOAD
    sched.claim_done(name, spawned=True)


def test_the_models_an_agent_has_or_is_getting_are_the_running_adapters() -> None:
    sched = make(5, "a", "b", "c", "d", "e", "f")
    load(sched, "a")
    load(sched, "b")
    sched.on_sleeping("b")
    loading(sched, "c")
    sched.join("d")  # queued for, not claimed yet: in effect loading (peer_rank)
    labels = info(sched, Downloads(["e"]))
    assert labels["running_lora_adapters"].split(",") == ["a", "b", "c", "d", "e"]
    assert labels["waiting_lora_adapters"] == ""
    assert labels["max_lora"] == "5"  # five of --models-max 5: no room for "f"


def test_a_stopping_model_is_not_a_place_to_send_its_requests() -> None:
    sched = make(4, "a", "b")
    load(sched, "a")
    load(sched, "b")
    assert sched.request_stop("a")
    assert info(sched)["running_lora_adapters"] == "b"


def test_having_nothing_is_said_with_a_list_the_picker_does_not_skip() -> None:
    """Both lists empty: the picker would skip the series and keep the previous lists."""
    labels = info(make(1, "a"))
    assert labels["running_lora_adapters"] == NOTHING
    # The picker sees one (empty) name: max_lora must stay above it while a slot is free.
    assert labels["max_lora"] == "2"


@pytest.mark.parametrize(
    ("loaded", "models_max", "max_lora"),
    [
        (4, 4, "4"),  # full: no room to load another
        (3, 4, "4"),
        (1, 4, "2"),
        (2, 0, "3"),  # no count limit: always room
        (0, 0, "2"),
    ],
)
def test_max_lora_is_above_what_is_told_exactly_while_there_is_room(
    loaded: int, models_max: int, max_lora: str
) -> None:
    sched = make(models_max, *"abcd")
    for name in "abcd"[:loaded]:
        load(sched, name)
    assert info(sched)["max_lora"] == max_lora


def test_a_download_holds_a_slot_as_peers_count_it() -> None:
    sched = make(2, "a")
    load(sched, "a")
    assert info(sched, Downloads(["repo/x:Q4"]))["max_lora"] == "2"  # both slots taken


def test_queued_requests_are_summed_over_the_models() -> None:
    sched = make(1, "a", "b")
    load(sched, "a")
    for model in ("b", "b", "a"):  # a's slot is taken: b waits; a's lease is free: a leases
        sched.join(model)
    assert parsed(sched)[QUEUED] == ({}, 3.0)
    assert parsed(make(1, "a"))[QUEUED] == ({}, 0.0)


def test_names_the_picker_cannot_be_told_are_left_out() -> None:
    hidden = ["a,b", "", "x/hf_abcdefghijklmnopqrstuvwxyz0123", "\udcff.gguf"]
    assert shown([*hidden, "ok"]) == ["ok"]
    sched = make(0, *hidden[:1], *hidden[2:], "ok")
    for name in (*hidden[:1], *hidden[2:], "ok"):
        load(sched, name)
    assert info(sched)["running_lora_adapters"] == "ok"


def test_any_other_character_of_a_name_reaches_the_picker_as_it_is() -> None:
    name = 'we"ird\\na\nme é {x="y"}'
    sched = make(0, name, "b")
    load(sched, name)
    load(sched, "b")
    assert info(sched)["running_lora_adapters"] == f"{name},b"
