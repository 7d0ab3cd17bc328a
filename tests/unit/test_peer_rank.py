"""Where a request is served (core.peer_rank): every tier against every other, the two rules
that come before the ranking, and the tie-breaks."""

from __future__ import annotations

import itertools

import pytest

from node_agent.core.peer_rank import (
    DOWNLOADING,
    LOADED,
    LOADING,
    SLEEPING,
    UNLOADED,
    Node,
    Tier,
    choose,
    effective_state,
    fits,
    tier,
)

# One node per tier, in the order of the ranking.
BY_TIER = {
    Tier.LOADED_IDLE: (LOADED, 0, False),
    Tier.LOADED_BUSY: (LOADED, 3, False),
    Tier.SLEEPING: (SLEEPING, 0, False),
    Tier.LOADING: (LOADING, 2, False),
    Tier.FITS: (UNLOADED, 0, True),
    Tier.EVICTS: (UNLOADED, 0, False),
}


def node(peer: str | None, state: str, queue: int = 0, fit: bool = False) -> Node:
    return Node(peer=peer, state=state, queue=queue, fits=fit)


def at(peer: str | None, t: Tier) -> Node:
    state, queue, fit = BY_TIER[t]
    return node(peer, state, queue, fit)


@pytest.mark.parametrize("t", list(Tier))
def test_each_state_falls_in_its_tier(t: Tier) -> None:
    assert tier(at("p", t)) is t


def test_downloading_ranks_as_loading() -> None:
    assert tier(node("p", DOWNLOADING)) is Tier.LOADING


@pytest.mark.parametrize(("a", "b"), list(itertools.combinations(list(Tier), 2)))
def test_a_better_tier_wins_between_peers_in_either_order(a: Tier, b: Tier) -> None:
    # a < b: a ranks better. Here needs an eviction, so only a peer in FITS or better beats it
    # (a tie with here goes to here, tested below).
    here = at(None, Tier.EVICTS)
    for peers in ([at("a", a), at("b", b)], [at("b", b), at("a", a)]):
        choice = choose(here, peers, forwarded=False)
        assert choice.peer == ("a" if a < Tier.EVICTS else None), (a, b, choice)


@pytest.mark.parametrize("mine", [Tier.SLEEPING, Tier.FITS, Tier.EVICTS])
@pytest.mark.parametrize("theirs", list(Tier))
def test_here_against_one_peer(mine: Tier, theirs: Tier) -> None:
    choice = choose(at(None, mine), [at("p", theirs)], forwarded=False)
    # Equal tiers: the queue decides (here's figures are BY_TIER's too, so equal), then here.
    assert choice.peer == ("p" if theirs < mine else None), choice


@pytest.mark.parametrize("state", [LOADED, LOADING, DOWNLOADING])
def test_a_model_loaded_or_loading_here_is_served_here(state: str) -> None:
    # Even with a long queue here and an idle peer: no hop for what this node can answer.
    choice = choose(node(None, state, queue=50), [at("p", Tier.LOADED_IDLE)], forwarded=False)
    assert choice.peer is None
    assert state in choice.why


@pytest.mark.parametrize("peer_tier", list(Tier))
@pytest.mark.parametrize("mine", list(Tier))
def test_a_forwarded_request_is_never_forwarded_again(peer_tier: Tier, mine: Tier) -> None:
    choice = choose(at(None, mine), [at("p", peer_tier)], forwarded=True)
    assert choice.peer is None
    assert "forwarded" in choice.why


def test_ties_go_by_queue_depth_then_to_the_peer_given_first() -> None:
    busy = [node("a", LOADED, 5), node("b", LOADED, 2), node("c", LOADED, 2)]
    assert choose(at(None, Tier.EVICTS), busy, forwarded=False).peer == "b"
    loading = [node("a", LOADING, 4), node("b", LOADING, 1)]
    assert choose(at(None, Tier.FITS), loading, forwarded=False).peer == "b"


def test_an_idle_loaded_peer_beats_a_busy_one_whatever_its_queue() -> None:
    peers = [node("busy", LOADED, 1), node("idle", LOADED, 0)]
    assert choose(at(None, Tier.EVICTS), peers, forwarded=False).peer == "idle"


def test_a_sleeping_model_here_ties_a_sleeping_peer_and_stays() -> None:
    assert choose(node(None, SLEEPING), [node("p", SLEEPING)], forwarded=False).peer is None
    # ...but a busier sleeping model here (waiters for its wake) loses to a quiet one.
    assert choose(node(None, SLEEPING, 2), [node("p", SLEEPING)], forwarded=False).peer == "p"


def test_with_no_peer_or_no_peer_better_it_is_served_here() -> None:
    assert choose(at(None, Tier.EVICTS), [], forwarded=False).peer is None
    choice = choose(at(None, Tier.FITS), [at("p", Tier.FITS)], forwarded=False)
    assert choice.peer is None
    assert "fits" in choice.why


def test_a_peer_with_a_free_slot_beats_an_eviction_here() -> None:
    choice = choose(at(None, Tier.EVICTS), [at("p", Tier.FITS)], forwarded=False)
    assert choice.peer == "p"
    assert "fits on p" in choice.why


@pytest.mark.parametrize(
    ("states", "models_max", "expected"),
    [
        ((), 1, True),
        ((UNLOADED, UNLOADED), 1, True),
        ((LOADED, UNLOADED), 1, False),
        ((LOADING,), 1, False),
        ((SLEEPING,), 1, False),
        ((DOWNLOADING,), 1, False),
        ((LOADED, UNLOADED), 2, True),
        ((LOADED, SLEEPING), 2, False),
        ((LOADED, LOADED, LOADED), 0, True),  # no limit
        ((LOADED,), -1, True),
    ],
)
def test_fits_counts_the_models_holding_a_slot(
    states: tuple[str, ...], models_max: int, expected: bool
) -> None:
    assert fits(states, models_max) is expected


GIB = 2**30


@pytest.mark.parametrize(
    ("need", "free", "expected"),
    [
        ({"CUDA0": 4 * GIB, "host": GIB}, {"CUDA0": 4 * GIB, "host": 2 * GIB}, True),
        ({"CUDA0": 4 * GIB + 1}, {"CUDA0": 4 * GIB}, False),  # one byte short
        ({"CUDA0": 4 * GIB, "CUDA1": 4 * GIB}, {"CUDA0": 8 * GIB, "CUDA1": GIB}, False),
        ({"CUDA0": GIB}, {"CUDA0": -GIB}, False),  # others took the margin already
        ({"CUDA0": GIB}, {"CUDA0": None}, True),  # no limit known on that device
        ({"CUDA1": GIB}, {"CUDA0": 0}, True),  # a device that node's ledger does not list
        ({"CUDA0": 0, "host": GIB}, {"CUDA0": 0, "host": GIB}, True),
        (None, {"CUDA0": 0}, True),  # that node's ledger is off: slots only
        ({"CUDA0": GIB}, None, True),
    ],
)
def test_fits_with_no_eviction_needs_the_models_min_in_the_nodes_free_memory(
    need: dict[str, int] | None, free: dict[str, int | None] | None, expected: bool
) -> None:
    assert fits([LOADED], 2, need, free) is expected
    # A free slot is needed as well, whatever the memory.
    assert fits([LOADED], 1, need, free) is False


def test_a_peer_with_free_memory_beats_a_node_where_the_model_does_not_fit() -> None:
    # Both have a free slot; only the peer has the memory for the model's min.
    need = {"CUDA0": 10 * GIB}
    here = node(None, UNLOADED, fit=fits([LOADED], 2, need, {"CUDA0": 2 * GIB}))
    roomy = node("p", UNLOADED, fit=fits([LOADED], 2, need, {"CUDA0": 20 * GIB}))
    assert choose(here, [roomy], forwarded=False).peer == "p"
    assert choose(node(None, UNLOADED, fit=True), [roomy], forwarded=False).peer is None


@pytest.mark.parametrize(
    ("state", "queued", "expected"),
    [
        (UNLOADED, 0, UNLOADED),
        (UNLOADED, 3, LOADING),  # requests wait for it: it takes the next slot
        (LOADED, 3, LOADED),
        (SLEEPING, 1, SLEEPING),
        (LOADING, 0, LOADING),
    ],
)
def test_a_model_with_requests_queued_for_it_is_in_effect_loading(
    state: str, queued: int, expected: str
) -> None:
    assert effective_state(state, queued) == expected
    # ...so it holds a slot: a node with it queued has no room for another.
    assert fits([effective_state(state, queued)], 1) is (expected == UNLOADED)
