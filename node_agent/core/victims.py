"""Which idle model is worth least, and which may not go yet: cost-aware eviction, anti-thrash.

Pure (``now`` is an argument). Used by the scheduler's victim order.

* **Value of keeping a model**: the time a reload would cost, times how soon it is likely to
  be asked for again: ``load_seconds / idle_seconds``. A model that took 40 s to load and was
  used 20 s ago (1.6, by its class) outranks one that loads in 1 s and was used 4 s ago
  (1.0), where plain LRU would evict the 40 s one. Load times count by their power of two
  (4-8 s, 8-16 s…), and everything under :data:`FASTEST_LOAD_CLASS` as one class: load times
  of small models on a busy machine are noise, and must not overturn which was used last.
  Between models of one class it is plain LRU (the value falls as idle time grows; ties go
  to the least recently used). A model never measured counts as
  :data:`UNKNOWN_LOAD_SECONDS`.
* **Minimum residency** (anti-thrash, hysteresis): a model whose load evicted another, and
  that was asked for again since (:data:`HOT_USES` requests: it is hot, not a one-off), may
  not be evicted before it has been loaded for ``factor x`` its own load time. Two hot
  models fighting for one slot then swap at most once per residency instead of on every
  request, and the slot spends at most ``1 / (1 + factor)`` of its time loading. A model
  that came in without a swap, or served one request only (one client walking through
  models in turn: holding it would only delay the next load), is not protected, so plain
  eviction order is unchanged where nothing thrashes. Memory and count evictions honour
  it; the idle TTL and a manual unload do not (the user asked for those).
"""

from __future__ import annotations

import math

UNKNOWN_LOAD_SECONDS = 1.0
# Seconds: loads faster than this are all one class. On a busy machine a 1 MB model's load
# took 2.8 s and a 50 MB one's 0.5 s (measured here, 2 cores shared): below a few seconds
# a load time says more about the machine than about the model.
FASTEST_LOAD_CLASS = 4.0
# Idle times below this count as this (a model used "just now" is not infinitely valuable).
IDLE_FLOOR_SECONDS = 0.1
HOT_USES = 2  # inference requests since its load that make a swapped-in model protected
# The agent's default: a model stays at least twice its own load time (at most a third of a
# contested slot's time goes to loading).
RESIDENCY_FACTOR = 2.0


def keep_value(load_seconds: float | None, last_used: float, now: float) -> float:
    """What evicting a model would cost, per the module docstring (higher: keep it)."""
    load = UNKNOWN_LOAD_SECONDS if load_seconds is None else load_seconds
    return load_class(load) / max(now - last_used, IDLE_FLOOR_SECONDS)


def load_class(seconds: float) -> float:
    """``seconds`` rounded down to a power of two (measurement noise stays in one class)."""
    return float(2.0 ** math.floor(math.log2(max(seconds, FASTEST_LOAD_CLASS))))


def resident_until(ready_at: float | None, load_seconds: float | None, factor: float) -> float:
    """The time before which a model loaded at ``ready_at`` may not be evicted."""
    if ready_at is None or load_seconds is None or factor <= 0:
        return float("-inf")  # only a measured load protects a model
    return ready_at + factor * load_seconds
