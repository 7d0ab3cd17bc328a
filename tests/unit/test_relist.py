"""What the operator's own listings drop from kopf's indexes (relist.py, pure)."""

from __future__ import annotations

import pytest
from preset_operator.relist import Listing, page_items, vanished


def test_an_entry_the_listing_lacks_is_gone_unless_learnt_after_it() -> None:
    listing = Listing(frozenset({"kept"}), "100")
    indexed = [("kept", "90"), ("deleted", "95"), ("created-later", "101"), ("odd", "x1")]
    # "created-later" came through the watch after the listing; "odd" cannot be compared:
    # neither is dropped on a guess.
    assert vanished(indexed, listing) == {("deleted", "95")}


def test_a_listing_without_a_comparable_version_drops_nothing() -> None:
    assert vanished([("a", "1")], Listing(frozenset(), None)) == frozenset()
    assert vanished([("a", "1")], Listing(frozenset(), "abc")) == frozenset()


@pytest.mark.parametrize(
    "body",
    [
        {
            "metadata": {"resourceVersion": "7"},
            "items": [{"metadata": {"name": "a"}}, 3, {}, {"metadata": {"name": 5}}],
        },
        {
            "metadata": {"resourceVersion": "7", "continue": ""},
            "items": [{"metadata": {"name": "a"}}],
        },
    ],
)
def test_a_hostile_page_yields_only_well_formed_names(body: object) -> None:
    assert page_items(body) == (["a"], "7", None)


def test_a_page_that_is_not_an_object_is_refused() -> None:
    with pytest.raises(ValueError):
        page_items(["a"])
