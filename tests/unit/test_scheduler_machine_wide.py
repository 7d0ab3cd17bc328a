"""The differential machine of tests/unit/test_scheduler_machine.py with the events it does not
generate: failed spawns, sleep and wake, catalog changes (slots, pins, a model that leaves and
comes back), keep_alive, faulted releases, a memory room and ``--max-child-errors``.

One more invariant: a child whose model changed (new arguments), left the catalog (and maybe
came back) or was removed (``DELETE /models``) since its load was granted is stopping; so is
every child once the agent closes. None runs arguments older than the catalog's.
"""

from __future__ import annotations

from collections.abc import Sequence

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import invariant, precondition, rule

from node_agent.core.model_state import ModelState
from node_agent.core.scheduler import Scheduler
from node_agent.core.scheduler_events import (
    Catalog,
    ChildFault,
    Drain,
    Effect,
    Event,
    ModelConfig,
    Probe,
    Probed,
    Release,
    Request,
    Sleeping,
    Spawn,
    SpawnFailed,
    Unload,
    Woke,
)
from tests.unit import test_scheduler_machine as base

SIZES = {"a": 3, "b": 4, "c": 5}


class Room:
    """A memory of 8 units (models of 3, 4 and 5): what runs or was granted a load holds it."""

    def __init__(self) -> None:
        self.sched: Scheduler | None = None

    def _used(self) -> int:
        s = self.sched
        assert s is not None
        used = sum(SIZES.get(n, 0) for n in s._running)
        queue = s._queue.values()
        return used + sum(SIZES.get(e.model, 0) for e in queue if e.claimed and not e.spawned)

    def shortfall(self, model: str, candidates: Sequence[str]) -> bool:
        return self._used() + SIZES[model] > 8

    def pick_victim(self, model: str, candidates: Sequence[str]) -> str | None:
        return candidates[0] if candidates else None


class WideMachine(base.SchedulerMachine):
    def __init__(self) -> None:
        super().__init__()
        r1, r2 = Room(), Room()
        self.sched = Scheduler(base.MODELS_MAX, r1, max_queue=20, child_errors=2)
        self.reference = base.FullScan(base.MODELS_MAX, r2, max_queue=20, child_errors=2)
        r1.sched, r2.sched = self.sched, self.reference
        self.slots = dict(base.SLOTS)
        # Each model's version (a change, a return to the catalog, a removal make a new one)
        # and the version each granted load got: what its child runs.
        self.version = dict.fromkeys(base.MODELS, 0)
        self.spawned_version: dict[str, int] = {}
        self.listed = set(base.MODELS)
        self.probes: list[tuple[str, int]] = []  # suspect children the owner probes
        self.event: Event | None = None
        configs = {m: ModelConfig(slots=self.slots[m], stop_timeout=3.0) for m in base.MODELS}
        self.send(Catalog(configs))

    def send(self, event: Event, reference: Event | None = None) -> None:
        self.event = event
        super().send(event, reference)

    def carry_out(self, effect: Effect) -> None:
        super().carry_out(effect)
        if isinstance(effect, Spawn):
            self.spawned_version[effect.model] = self.version[effect.model]
        elif isinstance(effect, Probe):
            assert (effect.model, effect.port) not in self.probes, "one probe at a time"
            self.probes.append((effect.model, effect.port))
        elif isinstance(effect, Drain) and effect.reason == "wedged":
            # Issue 50 row 1: requests' failures alone never kill a child under the requests
            # of others; only a child that failed the agent's own probe is wedged.
            assert isinstance(self.event, Probed) and self.event.broken is not None, self.event

    @precondition(lambda self: self.probes)
    @rule(data=st.data(), broken=st.booleans())
    def probed(self, data: st.DataObject, broken: bool) -> None:
        model, port = data.draw(st.sampled_from(self.probes))
        self.probes.remove((model, port))
        self.send(Probed(model, port, "its probe failed" if broken else None))

    @precondition(lambda self: self.spawning)
    @rule(data=st.data(), count=st.booleans())
    def spawn_failed(self, data: st.DataObject, count: bool) -> None:
        name = data.draw(st.sampled_from(sorted(self.spawning)))
        self.spawning.discard(name)
        self.send(SpawnFailed(name, "boom", count=count))

    @precondition(lambda self: self.children)
    @rule(data=st.data())
    def sleep_or_wake(self, data: st.DataObject) -> None:
        name = data.draw(st.sampled_from(sorted(self.children)))
        if name not in self.sched:
            return
        state = self.sched.view(name).state
        if state is ModelState.LOADED:
            self.send(Sleeping(name))
        elif state is ModelState.SLEEPING:
            self.send(Woke(name))

    @rule(model=st.sampled_from(base.MODELS), ttl=st.sampled_from((None, 0.0, 0.5, 3.0)))
    def keep_alive(self, model: str, ttl: float | None) -> None:
        """A request that gives its keep_alive (the model's idle time after it)."""
        waiter = next(self.ids)
        self.waiting[waiter] = model
        self.send(Request(waiter, model, deadline=self.now + 5.0, keep_alive=ttl))

    @precondition(lambda self: self.leases)
    @rule(data=st.data(), fault=st.sampled_from(list(ChildFault)))
    def release_fault(self, data: st.DataObject, fault: ChildFault) -> None:
        waiter, lease = data.draw(st.sampled_from(self.leases))
        self.leases.remove((waiter, lease))
        self.send(Release(lease, fault), Release(self.reference_leases.pop(waiter), fault))

    @rule(
        slots=st.tuples(*(st.sampled_from((0, 1, 2, 3)) for _ in base.MODELS)),
        pins=st.tuples(*(st.booleans() for _ in base.MODELS)),
        drop_c=st.booleans(),
        changed=st.frozensets(st.sampled_from(base.MODELS)),
    )
    def catalog(
        self,
        slots: tuple[int, ...],
        pins: tuple[bool, ...],
        drop_c: bool,
        changed: frozenset[str],
    ) -> None:
        models = {}
        for m, s, p in zip(base.MODELS, slots, pins, strict=True):
            if m == "c" and drop_c:
                continue
            models[m] = ModelConfig(slots=s, pin=p, stop_timeout=3.0)
            self.slots[m] = s
        changed = frozenset(c for c in changed if c in models)
        for m in changed | (models.keys() - self.listed):
            self.version[m] += 1
        self.listed = set(models)
        self.send(Catalog(models, changed))

    @rule(model=st.sampled_from(base.MODELS))
    def remove(self, model: str) -> None:
        """``DELETE /models``: the registry sends it while the model has a run (a child, or
        a granted load on its way)."""
        if model in self.children or model in self.spawning:
            self.version[model] += 1
            self.send(Unload(model, "remove"))

    @invariant()
    def no_child_runs_outdated_arguments(self) -> None:
        for name in self.children:
            old = self.spawned_version[name] != self.version[name] or name not in self.listed
            if old or self.closing:
                assert self.sched.view(name).stopping, (name, self.spawned_version, self.version)

    @invariant()
    def slots_and_instances_hold(self) -> None:
        running = len(self.children) + len(self.spawning)
        assert running <= base.MODELS_MAX, (self.children, self.spawning)


WideMachine.TestCase.settings = settings(stateful_step_count=80)
test_wide_machine = WideMachine.TestCase
