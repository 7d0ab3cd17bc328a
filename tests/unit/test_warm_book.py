"""Warm swaps' pure bookkeeping: identities, file names and the byte budget."""

from __future__ import annotations

from node_agent.core.warm_book import (
    NOBODY,
    OPEN,
    SavedSlot,
    checksum_matches,
    identity,
    over_budget,
    parse_file,
    restorable,
    save_tenant,
    sealed_file,
    slot_file,
    superseded,
    tenant_of,
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
    key, tenant = identity(MODEL, BINARY, OPTIONS), tenant_of("a-key")
    written = slot_file(key, tenant, 3)
    assert parse_file(written, 10, 1.0) == SavedSlot(written, key, tenant, 3, 10, 1.0, None)
    sealed = sealed_file(written, "ab" * 32)
    assert parse_file(sealed, 10, 1.0) == SavedSlot(sealed, key, tenant, 3, 10, 1.0, "ab" * 16)
    for name in (
        "../x-slot0.bin",
        f"{written}.tmp",
        "notes.txt",
        f"{key}-slot0.bin",  # no tenant: never anyone's
        f"{key[:-1]}-{tenant}-slot0.bin",
        f"{key}-{tenant}-slot0-{'ab' * 15}.bin",  # a checksum cut short
    ):
        assert parse_file(name, 10, 1.0) is None


def test_a_tenant_is_a_digest_of_its_key_and_one_for_an_agent_without_keys() -> None:
    assert tenant_of("key-a") != tenant_of("key-b")
    assert tenant_of("key-a") == tenant_of("key-a") and "key-a" not in tenant_of("key-a")
    assert tenant_of("") == OPEN and len(OPEN) == 16
    assert save_tenant({NOBODY}) is None  # a request of no known key: never saved


def test_a_childs_caches_are_saved_only_for_the_one_tenant_it_served() -> None:
    a, b = tenant_of("key-a"), tenant_of("key-b")
    assert save_tenant({a}) == a
    assert save_tenant(set()) is None  # it served nobody: nothing of anyone's
    assert save_tenant({a, b}) is None
    assert save_tenant({a, NOBODY}) is None


def saved_slot(key: str, tenant: str, slot: int, used: float, sealed: bool = True) -> SavedSlot:
    written = slot_file(key, tenant, slot)
    name = sealed_file(written, f"{int(used):02x}" * 32) if sealed else written
    return parse_file(name, 10, used) or SavedSlot("", "", "", 0, 0, 0.0)


def test_only_the_one_waiting_tenants_sealed_caches_are_restored_the_newest_per_slot() -> None:
    key, other = identity(MODEL, BINARY, OPTIONS), identity(MODEL, BINARY, ())
    a, b = tenant_of("key-a"), tenant_of("key-b")
    old, new = saved_slot(key, a, 0, 1.0), saved_slot(key, a, 0, 2.0)
    one = saved_slot(key, a, 1, 1.0)
    others = [
        saved_slot(key, b, 0, 3.0),  # another tenant's
        saved_slot(other, a, 0, 3.0),  # another identity's
        saved_slot(key, a, 2, 3.0, sealed=False),  # never sealed (a save cut short)
    ]
    saved = [one, old, new, *others]
    assert restorable(saved, key, frozenset({a})) == [new, one]
    assert restorable(saved, key, frozenset({b})) == [others[0]]
    assert restorable(saved, key, frozenset({a, b})) == []  # b could probe a's
    assert restorable(saved, key, frozenset()) == []
    assert restorable(saved, key, frozenset({NOBODY})) == []


def test_a_save_supersedes_all_of_its_tenants_older_files_and_nothing_else() -> None:
    key, a, b = identity(MODEL, BINARY, OPTIONS), tenant_of("key-a"), tenant_of("key-b")
    other_key = identity(("/m/b.gguf", 1000, 5), BINARY, OPTIONS)
    old, new = saved_slot(key, a, 0, 1.0), saved_slot(key, a, 0, 2.0)
    written = saved_slot(key, a, 0, 2.0, sealed=False)
    older_slot = saved_slot(key, a, 1, 1.0)  # a slot this save found empty: another save's
    kept = [saved_slot(key, b, 0, 1.0), saved_slot(other_key, a, 1, 1.0)]
    everything = [old, new, written, older_slot, *kept]
    assert sorted(superseded(everything, [new])) == sorted(
        [old.name, written.name, older_slot.name]
    )
    assert superseded(everything, []) == []  # a save of empty slots keeps the older one


def test_a_file_is_intact_only_with_the_checksum_in_its_name() -> None:
    file = saved_slot(identity(MODEL, BINARY, OPTIONS), OPEN, 0, 7.0)
    assert checksum_matches(file, "07" * 32)
    assert not checksum_matches(file, "08" * 32)
    unsealed = saved_slot(identity(MODEL, BINARY, OPTIONS), OPEN, 0, 7.0, sealed=False)
    assert not checksum_matches(unsealed, "07" * 32)


def test_the_budget_drops_the_least_recently_used_first_and_what_was_just_written_last() -> None:
    saved = [
        SavedSlot("a", "k1", OPEN, 0, 40, used=3.0),
        SavedSlot("b", "k2", OPEN, 0, 40, used=1.0),
        SavedSlot("c", "k3", OPEN, 0, 40, used=2.0),
    ]
    assert over_budget(saved, 120) == []
    assert over_budget(saved, 100) == ["b"]
    assert over_budget(saved, 50) == ["b", "c"]
    assert over_budget(saved, 50, keep=["b"]) == ["c", "a"]  # just written: it stays
    assert over_budget(saved, 30, keep=["b"]) == ["c", "a", "b"]  # the bound always holds
