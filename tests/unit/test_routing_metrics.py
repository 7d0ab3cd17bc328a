"""The routing metrics' text: what an InferencePool's endpoint picker is told of an agent."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
from prometheus_client.parser import text_string_to_metric_families

from node_agent.api.routing_metrics import NOTHING, QUEUED, RESIDENT, routing_text, shown
from node_agent.core.model_state import Statistics
from node_agent.redact import add_secret


@dataclass
class Residents:
    usable: list[str] = field(default_factory=list)
    loading: list[str] = field(default_factory=list)
    models_max: int = 4
    queue: tuple[tuple[str, int], ...] = ()

    def residents(self) -> tuple[list[str], list[str]]:
        return list(self.usable), list(self.loading)

    def statistics(self) -> Statistics:
        running = len(self.usable) + len(self.loading)
        free = self.models_max - running if self.models_max > 0 else None
        return Statistics(self.models_max, running, 0, 0, 0, free, self.queue)


def parsed(residents: Residents) -> dict[str, tuple[dict[str, str], float]]:
    """Each family's one sample: its labels and value, as a Prometheus parser reads them."""
    text = routing_text(residents).decode()
    out = {}
    for family in text_string_to_metric_families(text):
        (sample,) = family.samples
        out[family.name] = (sample.labels, sample.value)
    return out


def info(residents: Residents) -> dict[str, str]:
    return parsed(residents)[RESIDENT][0]


def test_the_models_served_and_loading_are_the_adapters_lists() -> None:
    labels = info(Residents(["a", "b"], ["c"], models_max=4))
    assert labels == {
        "running_lora_adapters": "a,b",
        "waiting_lora_adapters": "c",
        "max_lora": "4",  # 3 told, one free slot
    }


def test_running_nothing_is_said_with_a_list_the_picker_does_not_skip() -> None:
    """Both lists empty: the picker would skip the series and keep the previous lists."""
    labels = info(Residents(models_max=1))
    assert labels["running_lora_adapters"] == NOTHING
    assert labels["waiting_lora_adapters"] == ""
    # The picker sees one (empty) name: max_lora must stay above it while a slot is free.
    assert labels["max_lora"] == "2"


@pytest.mark.parametrize(
    ("usable", "loading", "models_max", "max_lora"),
    [
        (["a", "b", "c", "d"], [], 4, "4"),  # full: no room to load another
        (["a", "b", "c"], ["d"], 4, "4"),
        (["a"], [], 4, "4"),
        (["a", "b"], [], 0, "3"),  # no count limit: one more than told
        ([], [], 0, "2"),
    ],
)
def test_max_lora_is_above_what_is_told_exactly_while_there_is_room(
    usable: list[str], loading: list[str], models_max: int, max_lora: str
) -> None:
    assert info(Residents(usable, loading, models_max))["max_lora"] == max_lora


def test_queued_requests_are_summed_over_the_models() -> None:
    residents = Residents(["a"], queue=(("a", 2), ("b", 5)))
    assert parsed(residents)[QUEUED] == ({}, 7.0)
    assert parsed(Residents())[QUEUED] == ({}, 0.0)


def test_names_the_picker_cannot_be_told_are_left_out() -> None:
    add_secret("hf_routingtestsecret0123")
    assert shown(["a,b", "", "x/hf_routingtestsecret0123", "ok"]) == ["ok"]
    labels = info(Residents(["a,b", "ok"], ["x/hf_routingtestsecret0123"]))
    assert labels["running_lora_adapters"] == "ok"
    assert labels["waiting_lora_adapters"] == ""


def test_any_other_character_of_a_name_reaches_the_picker_as_it_is() -> None:
    name = 'we"ird\\na\nme é {x="y"}'
    labels = info(Residents([name, "b"]))
    assert labels["running_lora_adapters"] == f"{name},b"
