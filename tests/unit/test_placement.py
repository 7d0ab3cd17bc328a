"""Automatic GPU placement (core.placement): each rule, then properties against brute force."""

from __future__ import annotations

import itertools
from collections.abc import Mapping

import pytest
from hypothesis import given
from hypothesis import strategies as st

from node_agent.core.placement import Gpu, Holder, Placement, choose

GIB = 1 << 30


def single_need(gpus: list[Gpu], size: int, host: int = GIB // 4) -> dict[str, dict[str, int]]:
    return {g.name: {"host": host, g.name: size} for g in gpus}


def proportional(size: int, overhead: int = 0) -> object:
    def need(names: tuple[str, ...], fractions: tuple[float, ...]) -> Mapping[str, int]:
        out = {"host": GIB // 4}
        out.update({n: int(size * f) + overhead for n, f in zip(names, fractions, strict=True)})
        return out

    return need


def place(gpus: list[Gpu], size: int, candidates: list[Holder] = (), **kw: int) -> Placement:  # type: ignore[assignment]
    return choose(gpus, single_need(gpus, size), proportional(size, **kw), candidates)  # type: ignore[arg-type]


def test_fits_where_least_is_wasted() -> None:
    gpus = [Gpu("CUDA0", 20 * GIB), Gpu("CUDA1", 7 * GIB), Gpu("CUDA2", 70 * GIB)]
    plan = place(gpus, 6 * GIB)
    assert (plan.kind, plan.gpus, plan.victims) == ("fits", ("CUDA1",), ())
    assert "least waste" in plan.reason
    assert plan.need == {"host": GIB // 4, "CUDA1": 6 * GIB}


def test_evicts_the_fewest_then_the_least_valuable_on_one_gpu_only() -> None:
    gpus = [Gpu("CUDA0", 2 * GIB), Gpu("CUDA1", 1 * GIB)]
    candidates = [  # best victim first
        Holder("small-a", {"CUDA0": 1 * GIB}),
        Holder("small-b", {"CUDA0": 2 * GIB}),
        Holder("big", {"CUDA1": 8 * GIB}),
        Holder("both", {"CUDA0": 9 * GIB, "CUDA1": 9 * GIB}),
    ]
    plan = place(gpus, 5 * GIB, candidates)
    # CUDA0 needs small-a + small-b (two); CUDA1 needs only big (one): fewest wins.
    assert (plan.kind, plan.gpus, plan.victims) == ("evict", ("CUDA1",), ("big",))
    # "both" frees the most, but it also holds CUDA0, which the new model would not use.
    assert "both" not in plan.victims


def test_among_equally_few_victims_the_cheapest_set() -> None:
    gpus = [Gpu("CUDA0", 0)]
    candidates = [Holder("cheap", {"CUDA0": 4 * GIB}), Holder("dear", {"CUDA0": 4 * GIB})]
    assert place(gpus, 3 * GIB, candidates).victims == ("cheap",)


def test_splits_in_proportion_when_no_gpu_can_hold_it() -> None:
    gpus = [Gpu("CUDA0", 6 * GIB), Gpu("CUDA1", 2 * GIB), Gpu("CUDA2", 3 * GIB)]
    plan = place(gpus, 8 * GIB)
    assert plan.kind == "split"
    assert plan.gpus == ("CUDA0", "CUDA2")  # the fewest GPUs, largest rooms first
    assert plan.split == pytest.approx((6 / 9, 3 / 9))
    assert all(plan.need[g] <= r for g, r in (("CUDA0", 6 * GIB), ("CUDA2", 3 * GIB)))


def test_a_split_needs_every_part_to_fit_with_its_overhead() -> None:
    gpus = [Gpu("CUDA0", 4 * GIB), Gpu("CUDA1", 4 * GIB), Gpu("CUDA2", 4 * GIB)]
    # Two GPUs would hold 8 GiB in all, but each part carries 1 GiB of compute buffers too.
    plan = place(gpus, 8 * GIB, overhead=GIB)
    assert (plan.kind, plan.gpus) == ("split", ("CUDA0", "CUDA1", "CUDA2"))


def test_short_everywhere_goes_to_the_most_room() -> None:
    gpus = [Gpu("CUDA0", GIB), Gpu("CUDA1", 3 * GIB)]
    plan = place(gpus, 40 * GIB)
    assert (plan.kind, plan.gpus) == ("short", ("CUDA1",))


def test_no_gpu_is_an_error_of_the_caller() -> None:
    with pytest.raises(ValueError, match="no GPU"):
        choose([], {}, proportional(GIB))  # type: ignore[arg-type]


# -- properties ------------------------------------------------------------------------------

names = [f"CUDA{i}" for i in range(4)]
sizes = st.integers(min_value=0, max_value=24).map(lambda n: n * GIB // 2)


@st.composite
def machines(draw: st.DrawFn) -> tuple[list[Gpu], int, list[Holder]]:
    count = draw(st.integers(1, 4))
    gpus = [Gpu(names[i], draw(st.integers(-2, 24)) * GIB // 2) for i in range(count)]
    size = draw(st.integers(1, 40)) * GIB // 2
    holders = []
    for index in range(draw(st.integers(0, 6))):
        on = draw(st.lists(st.sampled_from(names[:count]), min_size=1, max_size=2, unique=True))
        holders.append(Holder(f"m{index}", {g: draw(sizes) + GIB // 2 for g in on}))
    return gpus, size, holders


@given(machines())
def test_properties_against_brute_force(machine: tuple[list[Gpu], int, list[Holder]]) -> None:
    gpus, size, holders = machine
    rooms = {g.name: g.room or 0 for g in gpus}
    plan = place(gpus, size, holders)
    fitting = [g for g in gpus if size <= rooms[g.name]]
    if fitting:
        assert plan.kind == "fits"
        least = min(rooms[g.name] - size for g in fitting)
        assert rooms[plan.gpus[0]] - size == least
        return
    # Brute force: every (GPU, subset of holders on that GPU alone) that makes room.
    options = []
    for g in gpus:
        alone = [(r, h) for r, h in enumerate(holders) if set(h.held) == {g.name}]
        for k in range(1, len(alone) + 1):
            for combo in itertools.combinations(alone, k):
                if rooms[g.name] + sum(h.held[g.name] for _, h in combo) >= size:
                    options.append((k, sum(r for r, _ in combo)))
    if options:
        assert plan.kind == "evict"
        (gpu,) = plan.gpus
        victims = [h for h in holders if h.model in plan.victims]
        assert all(set(h.held) == {gpu} for h in victims)  # only on the GPU it goes to
        assert rooms[gpu] + sum(h.held[gpu] for h in victims) >= size
        ranks = sum(i for i, h in enumerate(holders) if h.model in plan.victims)
        assert (len(victims), ranks) == min(options)
        return
    assert plan.victims == ()
    if plan.kind == "split":
        assert len(plan.gpus) >= 2
        assert sum(plan.split) == pytest.approx(1.0)
        assert all(plan.need[g] <= rooms[g] for g in plan.gpus)
    else:
        assert plan.kind == "short"
        assert rooms[plan.gpus[0]] == max(rooms.values())
