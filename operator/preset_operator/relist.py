"""Objects that vanished while no watch saw them go.

kopf drops an index entry only when it sees a DELETED event (kopf/_core/engines/indexing.py).
A watch resumed after a gap the apiserver can no longer replay gets 410 Gone (after an
apiserver restart, whose new watch cache starts at the current revision; or after etcd
compacted the revision), and kopf lists again; a listing only shows what exists, so an object
deleted during the gap stayed in the index for good: its preset in every node's file, its
Service re-created, its status PATCHed in a loop.

So the reconciler lists each kind it indexes itself, now and then, metadata only (what an
informer's periodic re-list does), and leaves out what its index holds but the listing lacks —
unless the index learnt of it after that listing (a resourceVersion newer than the listing's).
Pure: the listing is fetched by the reconciler.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

# A metadata-only listing: names and versions, not the objects (pods and presets can be large).
METADATA_LIST = "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1,application/json"
PAGE = 500  # items per page of a listing (the apiserver's continue tokens chain the pages)
MAX_PAGES = 200  # 100,000 objects: past that a listing is not trusted to be complete


@dataclass(frozen=True)
class Listing:
    """What one listing showed: the names, and the resourceVersion it was taken at."""

    names: frozenset[str]
    resource_version: str | None


def _version(value: object) -> int | None:
    # resourceVersions are opaque by contract; etcd's are increasing integers. Anything else is
    # never compared (so never dropped on a guess).
    if isinstance(value, str) and value.isdigit() and len(value) <= 20:
        return int(value)
    return None


def page_items(body: object) -> tuple[list[str], str | None, str | None]:
    """One page of a (metadata) listing → (names, its resourceVersion, its continue token).
    Hostile input: entries that are not objects with a string name are skipped."""
    if not isinstance(body, Mapping):
        raise ValueError("a listing that is not an object")
    meta = body.get("metadata")
    meta = meta if isinstance(meta, Mapping) else {}
    names: list[str] = []
    items = body.get("items")
    for item in items if isinstance(items, list) else []:
        item_meta = item.get("metadata") if isinstance(item, Mapping) else None
        name = item_meta.get("name") if isinstance(item_meta, Mapping) else None
        if isinstance(name, str):
            names.append(name)
    rv = meta.get("resourceVersion")
    token = meta.get("continue")
    return (
        names,
        rv if isinstance(rv, str) else None,
        token if isinstance(token, str) and token else None,
    )


def vanished(
    indexed: Iterable[tuple[str, str | None]], listing: Listing
) -> frozenset[tuple[str, str | None]]:
    """The (name, resourceVersion) entries of an index that ``listing`` shows are gone."""
    listed_at = _version(listing.resource_version)
    gone: set[tuple[str, str | None]] = set()
    for name, version in indexed:
        if name in listing.names:
            continue
        seen = _version(version)
        if listed_at is None or seen is None or seen > listed_at:
            continue  # learnt after the listing (or not comparable): kept
        gone.add((name, version))
    return frozenset(gone)


def resource_version(obj: Mapping[str, Any]) -> str | None:
    meta = obj.get("metadata")
    rv = meta.get("resourceVersion") if isinstance(meta, Mapping) else None
    return rv if isinstance(rv, str) else None
