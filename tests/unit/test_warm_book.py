"""Warm swaps' pure bookkeeping: identities, file names and the byte budget."""

from __future__ import annotations

from node_agent.core.warm_book import (
    SavedSlot,
    identity,
    over_budget,
    parse_file,
    slot_file,
)

MODEL = ("/m/a.gguf", 1000, 5)
BINARY = ("/b/llama-server", 10, 7)
OPTIONS = (("ctx-size", "4096"), ("flash-attn", "on"))


def test_a_cache_is_only_ever_asked_for_by_the_same_model_binary_and_options() -> None:
    key = identity(MODEL, BINARY, OPTIONS)
    assert key == identity(MODEL, BINARY, tuple(reversed(OPTIONS)))  # order does not matter
    others = [
        identity(("/m/b.gguf", 1000, 5), BINARY, OPTIONS),  # another model
        identity(("/m/a.gguf", 1000, 6), BINARY, OPTIONS),  # the file was replaced
        identity(MODEL, ("/b/llama-server", 10, 8), OPTIONS),  # another build
        identity(MODEL, BINARY, (("ctx-size", "8192"), ("flash-attn", "on"))),
        identity(MODEL, BINARY, (*OPTIONS, ("cache-type-k", "q8_0"))),
    ]
    assert key not in others and len(set(others)) == len(others)


def test_file_names_round_trip_and_nothing_else_is_a_saved_slot() -> None:
    key = identity(MODEL, BINARY, OPTIONS)
    saved = parse_file(slot_file(key, 3), 10, 1.0)
    assert saved == SavedSlot(slot_file(key, 3), key, 3, 10, 1.0)
    for name in ("../x-slot0.bin", f"{key}-slot0.bin.tmp", "notes.txt", f"{key[:-1]}-slot0.bin"):
        assert parse_file(name, 10, 1.0) is None


def test_the_budget_drops_the_least_recently_used_first_and_what_was_just_written_last() -> None:
    saved = [
        SavedSlot("a", "k1", 0, 40, used=3.0),
        SavedSlot("b", "k2", 0, 40, used=1.0),
        SavedSlot("c", "k3", 0, 40, used=2.0),
    ]
    assert over_budget(saved, 120) == []
    assert over_budget(saved, 100) == ["b"]
    assert over_budget(saved, 50) == ["b", "c"]
    assert over_budget(saved, 50, keep=["b"]) == ["c", "a"]  # just written: it stays
    assert over_budget(saved, 30, keep=["b"]) == ["c", "a", "b"]  # the bound always holds
