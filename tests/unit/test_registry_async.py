"""The registry, the proxy and the HTTP app together, with fake children (milliseconds each).

What needs a real llama-server (its protocol, its exit, its faults) is in tests/integration;
these cover the async layer's own decisions: drains, stops and shutdown during a stream,
admission while closing, and that no state is reported before it is true.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import json
import logging
import time
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from node_agent.core.model_state import ModelState
from node_agent.runtime.model_downloads import DownloadSettings
from node_agent.sources.catalog import Catalog
from tests.unit.fake_child import Agent, Plan, chat, fake_agent, spec

pytestmark = pytest.mark.timeout(20)

STREAM = 1_000_000  # tokens: a stream that runs until something ends it


async def open_stream(agent: Agent, model: str) -> aiohttp.ClientResponse:
    response = await agent.client.post(
        f"{agent.url}/v1/chat/completions", json=chat(model, STREAM, stream=True)
    )
    assert response.status == 200
    assert (await response.content.readline()).startswith(b"data: ")  # tokens are flowing
    return response


async def read_to_end(response: aiohttp.ClientResponse) -> tuple[bytes, float]:
    """The rest of a stream and the monotonic time it ended (fails after 10 s)."""
    rest = b""
    async with asyncio.timeout(10):
        try:
            async for chunk in response.content.iter_any():
                rest += chunk
        except aiohttp.ClientPayloadError:
            pass  # a stream cut without its last chunk: ended too
    return rest, time.monotonic()


def last_event(rest: bytes) -> bytes:
    events = [line for line in rest.split(b"\n") if line.startswith(b"data: ")]
    assert events, rest
    return events[-1]


@pytest.mark.parametrize("how", ["unload", "reload", "shutdown"])
async def test_a_stream_cut_by_a_stop_gets_the_error_event_at_the_childs_exit(how: str) -> None:
    """Bug 1: the drain times out, the child exits, and the client hears of it at once (it
    used to stay open and silent until its own timeout)."""
    plan = Plan()
    async with fake_agent(plan, [spec("m", stop_timeout=0.2)]) as agent:
        stream = await open_stream(agent, "m")
        if how == "unload":
            async with agent.client.post(f"{agent.url}/models/unload", json={"model": "m"}) as r:
                assert r.status == 200
        elif how == "reload":
            await agent.registry.reload(agent.catalog, {"m"})
        else:
            closing = asyncio.create_task(agent.registry.close())
        rest, ended = await read_to_end(stream)
        assert "m" in plan.exited, "the child never exited"
        assert ended - plan.exited["m"] < 1.0, ended - plan.exited["m"]
        assert b"stopped mid-response" in last_event(rest), rest[-300:]
        if how == "shutdown":
            await closing


async def test_shutdown_admits_no_new_work() -> None:
    """Bug 2: a request that arrives while the agent closes is refused with 503 + Retry-After
    and spawns nothing (it used to spawn a child that nobody stopped)."""
    plan = Plan()
    async with fake_agent(plan, [spec("a", stop_timeout=0.3), spec("b")]) as agent:
        stream = await open_stream(agent, "a")
        closing = asyncio.create_task(agent.registry.close())
        await asyncio.sleep(0.05)
        async with agent.client.post(f"{agent.url}/v1/chat/completions", json=chat("b")) as late:
            status, body = late.status, await late.json()
            retry_after = late.headers.get("Retry-After")
        assert plan.spawned == ["a"], plan.spawned
        assert status == 503, body
        assert retry_after is not None
        assert "shutting down" in body["error"]["message"]
        await read_to_end(stream)
        await closing


async def test_loading_is_reported_only_once_the_child_is_spawned() -> None:
    """Bug 3: ``loading`` (state and event) only once a process exists."""
    plan = Plan(spawn_after=0.2, ready_after=0.1)
    async with fake_agent(plan, [spec("m")]) as agent:
        events = agent.registry.events()
        request = asyncio.create_task(
            agent.client.post(f"{agent.url}/v1/chat/completions", json=chat("m"))
        )

        async def first_event() -> tuple[object, list[str]]:
            event = await anext(events)
            return event.data, list(plan.spawned)  # what existed when it was published

        first = asyncio.create_task(first_event())
        seen_loading = None
        while not request.done():
            if agent.registry.state("m") is ModelState.LOADING and seen_loading is None:
                seen_loading = list(plan.spawned)
            await asyncio.sleep(0.001)
        response = await request
        assert response.status == 200
        assert seen_loading == ["m"], f"loading reported while spawned was {seen_loading}"
        data, spawned = await first
        assert data == {"status": "loading"}
        assert spawned == ["m"], "the loading event came before the spawn"
        assert plan.spawned == ["m"]
        await events.aclose()


async def test_a_waiting_request_says_why_in_the_log_and_in_its_503(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Issue 12: the line when a request starts waiting, and the queue timeout's reason."""
    plan = Plan()
    async with fake_agent(plan, [spec("a"), spec("b")], models_max=1, queue_timeout=0.3) as agent:
        stream = await open_stream(agent, "a")
        with caplog.at_level(logging.INFO, logger="corral"):
            async with agent.client.post(
                f"{agent.url}/v1/chat/completions", json=chat("b")
            ) as late:
                status, body = late.status, await late.json()
        why = "all 1 instances busy: a (1 in flight)"
        assert f"request for model=b waits: {why}" in caplog.text
        assert status == 503, body
        assert why in body["error"]["message"]
        assert "queue timeout (0.3 s)" in body["error"]["message"]
        stream.close()


async def test_a_reload_loads_presets_added_with_load_on_startup() -> None:
    """Issue 17: a preset added at runtime with load-on-startup loads, as at start-up."""
    plan = Plan()
    async with fake_agent(plan, [spec("a")]) as agent:
        catalog = Catalog({"a": spec("a"), "b": spec("b", load_on_startup=True)})
        events = agent.registry.events()
        waiting = asyncio.ensure_future(anext(events))
        await asyncio.sleep(0)  # the subscription starts before the reload
        await agent.registry.reload(catalog, set())
        async with asyncio.timeout(5):
            while True:
                event = await waiting
                if event.model == "b" and (event.data or {}).get("status") == "loaded":
                    break
                waiting = asyncio.ensure_future(anext(events))
        assert plan.spawned == ["b"]
        assert agent.registry.state("b") is ModelState.LOADED
        await events.aclose()


async def test_a_drain_ends_as_soon_as_the_last_request_does() -> None:
    """No stream is cut when it ends within the stop timeout: the child is asked to exit
    right after it, not at the deadline."""
    plan = Plan()
    async with fake_agent(plan, [spec("m", stop_timeout=5.0)]) as agent:
        response = await agent.client.post(
            f"{agent.url}/v1/chat/completions", json=chat("m", 40, stream=True)
        )
        assert (await response.content.readline()).startswith(b"data: ")
        started = time.monotonic()
        agent.registry.unload("m")
        rest, _ = await read_to_end(response)
        assert last_event(rest) == b"data: [DONE]"
        async with asyncio.timeout(5):
            await agent.registry.close()  # nothing left to stop once the run has ended
        assert plan.exited["m"] - started < 2.0  # not the 5 s stop timeout


async def test_a_crash_during_the_drain_ends_the_stream_and_the_stop() -> None:
    plan = Plan()
    async with fake_agent(plan, [spec("m", stop_timeout=30.0)]) as agent:
        stream = await open_stream(agent, "m")
        agent.registry.unload("m")
        plan.children[0].crash()
        rest, _ = await read_to_end(stream)
        assert b"stopped mid-response" in last_event(rest)
        async with asyncio.timeout(5):
            await agent.registry.close()  # the stop is over too, long before 30 s
        assert agent.registry.state("m") is ModelState.UNLOADED
        assert not agent.registry.scheduler.view("m").failed  # it was being stopped


async def test_a_child_spawning_as_the_agent_closes_is_stopped_too() -> None:
    """The signal lands while a granted load is creating its process: the child that appears
    is stopped, and the shutdown does not wait for it forever."""
    plan = Plan(spawn_after=0.2, ready_after=5.0)
    async with fake_agent(plan, [spec("m")]) as agent:
        request = asyncio.create_task(
            agent.client.post(f"{agent.url}/v1/chat/completions", json=chat("m"))
        )
        await asyncio.sleep(0.1)  # the run is past may_spawn, inside start()
        async with asyncio.timeout(3):
            await agent.registry.close()
        assert plan.spawned == ["m"] and "m" in plan.exited
        response = await request
        assert response.status == 503


async def test_load_returns_once_spawned_and_says_when_it_could_not_be() -> None:
    plan = Plan(spawn_after=0.1, ready_after=0.5)
    async with fake_agent(plan, [spec("m")]) as agent:
        async with agent.client.post(f"{agent.url}/models/load", json={"model": "m"}) as r:
            assert (r.status, await r.json()) == (200, {"success": True})
        assert plan.spawned == ["m"]
        assert agent.registry.state("m") is ModelState.LOADING  # true when it is said
    plan = Plan(spawn_fails="cannot execute llama-server")
    async with fake_agent(plan, [spec("m")]) as agent:
        async with agent.client.post(f"{agent.url}/models/load", json={"model": "m"}) as r:
            status, body = r.status, await r.json()
        assert status == 500, body
        assert body["error"]["message"] == (
            "model name=m failed to load: cannot execute llama-server; "
            "its log: corral logs m (GET /models/logs?model=m)"
        )
        assert agent.registry.scheduler.view("m").error == "cannot execute llama-server"


async def test_the_shutdown_bound_cuts_a_stream_whose_child_would_finish_it_first() -> None:
    """llama-server finishes its generations before it obeys the exit command: once the
    drain is over, the child is killed, or the stop would last another stop timeout (30 s
    here) and the shutdown would miss its bound (1 s)."""
    plan = Plan()
    async with fake_agent(plan, [spec("m", stop_timeout=30.0)], shutdown_timeout=1.0) as agent:
        stream = await open_stream(agent, "m")
        started = time.monotonic()
        async with asyncio.timeout(5):
            closing = asyncio.create_task(agent.registry.close())
            rest, ended = await read_to_end(stream)
            await closing
        assert b"stopped mid-response" in last_event(rest)
        assert ended - started < 5


async def test_requests_waiting_for_a_slot_when_their_model_stops_are_served_after_reload() -> None:
    """Issue 27: a request that has not reached the child when its model stops waits and
    loads it again. It used to hold a lease while it waited at the proxy's slot gate, so the
    drain counted it in flight, ran to its bound, killed the child, and the request then got
    ``502 the model's server did not answer: Cannot connect to host``."""
    plan = Plan()
    one_slot = spec("m", stop_timeout=0.3, options=(("parallel", "1"),))
    async with fake_agent(plan, [one_slot]) as agent:
        stream = await open_stream(agent, "m")  # holds the child's only slot

        async def chat_once() -> tuple[int, str]:
            url = f"{agent.url}/v1/chat/completions"
            async with agent.client.post(url, json=chat("m", 4)) as response:
                return response.status, await response.text()

        waiting = [asyncio.create_task(chat_once()) for _ in range(8)]
        await asyncio.sleep(0.3)  # they are all queued for the slot
        async with agent.client.post(f"{agent.url}/models/unload", json={"model": "m"}) as r:
            assert r.status == 200
        rest, _ = await read_to_end(stream)
        assert b"stopped mid-response" in last_event(rest)  # the drain's bound cut it
        answers = await asyncio.gather(*waiting)
        assert [status for status, _ in answers] == [200] * 8, answers
        assert plan.spawned == ["m", "m"]  # loaded again for them


async def test_one_queue_timeout_bounds_a_download_and_then_a_slot(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 27: ``--queue-timeout`` counts from a request's arrival, whatever it waits for.
    A request that waited for its model's download and then for a slot was given the whole
    timeout at each (the download's wait, then the proxy's slot gate: 1.2 + 2 s here)."""
    monkeypatch.setenv("LLAMA_CACHE", str(tmp_path))
    body = b"GGUF" + bytes(1000)

    async def slow_file(request: web.Request) -> web.Response:
        await asyncio.sleep(1.2)
        return web.Response(body=body)

    files = web.Application()
    files.router.add_get("/m.gguf", slow_file)
    runner = web.AppRunner(files)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    preset = spec(
        "m",
        options=(("parallel", "1"), ("model-url", f"http://127.0.0.1:{port}/m.gguf")),
        model_sha256=hashlib.sha256(body).hexdigest(),
    )
    settings = DownloadSettings(env={"LLAMA_CACHE": str(tmp_path)})
    try:
        async with fake_agent(Plan(), [preset], queue_timeout=2.0, downloads=settings) as agent:
            first = asyncio.create_task(open_stream(agent, "m"))  # gets the slot, keeps it
            await asyncio.sleep(0.05)
            started = time.monotonic()
            url = f"{agent.url}/v1/chat/completions"
            async with agent.client.post(url, json=chat("m")) as response:
                status, text = response.status, await response.text()
            waited = time.monotonic() - started
            assert status == 503, text
            assert "within the queue timeout (2 s): all 1 slots of its server" in text
            assert waited < 2.8, waited  # 2 s in all, and a margin for a busy machine
            (await first).close()
    finally:
        await runner.cleanup()


async def test_the_devices_are_read_a_bounded_number_of_times_however_many_wait() -> None:
    """Issue 27, the thundering herd: every change woke every queued request, and each read
    the devices (/proc, NVML) on the loop, so 256 requests waiting for one load read them
    thousands of times. Now each event is handled once, and the devices are read only while
    a load waits for room."""
    from node_agent.memory.devices import CompositeProbe
    from node_agent.runtime.memory_watch import MemoryWatch
    from tests.unit.test_memory_watch import GIB, CountingProbe

    probe = CountingProbe(free=8 * GIB)
    memory = MemoryWatch(margin_mib=0, limits={}, probe=CompositeProbe([probe]))
    plan = Plan(ready_after=0.3)
    four_slots = spec("m", options=(("parallel", "4"),))
    async with fake_agent(plan, [four_slots], memory=memory) as agent:
        url = f"{agent.url}/v1/chat/completions"

        async def chat_once() -> int:
            async with agent.client.post(url, json=chat("m", 2)) as response:
                await response.read()
                return response.status

        reads = probe.reads
        statuses = await asyncio.gather(*(chat_once() for _ in range(256)))
        assert statuses == [200] * 256
        assert plan.spawned == ["m"]
        assert probe.reads - reads <= 10, probe.reads - reads  # 301 before


async def _listed(agent: Agent, model: str) -> dict[str, Any]:
    async with agent.client.get(f"{agent.url}/models") as response:
        entries = (await response.json())["data"]
    entry: dict[str, Any] = next(e for e in entries if e["id"] == model)
    return entry


async def _error_says(agent: Agent, model: str, text: str) -> str:
    """``GET /models``'s ``corral.error`` for ``model`` once it says ``text`` (fails in 5 s)."""
    error = ""
    for _ in range(100):
        error = str((await _listed(agent, model))["corral"]["error"])
        if text in error:
            return error
        await asyncio.sleep(0.05)
    raise AssertionError(f"corral.error never said {text!r}: {error!r}")


async def test_a_child_that_stalls_requests_is_killed_as_wedged_and_replaced() -> None:
    """Issue 28: its /health says ok, every request hangs: it is found within --timeout,
    killed, reported with its reason, and the next request loads a fresh child."""
    plan = Plan(stall=True)
    async with fake_agent(plan, [spec("m")], proxy_timeout=1.0) as agent:
        sse = await agent.client.get(f"{agent.url}/models/sse")
        url = f"{agent.url}/v1/chat/completions"
        started = time.monotonic()
        async with agent.client.post(url, json=chat("m")) as response:
            assert response.status == 502, await response.text()
        assert time.monotonic() - started < 5.0
        async with asyncio.timeout(5):
            async for line in sse.content:
                if b'"model_wedged"' in line:
                    assert b"no byte from it within --timeout" in line
                    break
        sse.close()
        await _error_says(agent, "m", "killed as wedged: a request it accepted got no byte")
        plan.stall = False
        async with agent.client.post(url, json=chat("m")) as response:
            assert response.status == 200
        assert plan.spawned == ["m", "m"]


async def test_a_child_failing_every_request_with_500_is_replaced() -> None:
    plan = Plan(status=500)
    async with fake_agent(plan, [spec("m")], child_errors=3) as agent:
        url = f"{agent.url}/v1/chat/completions"
        for _ in range(3):
            async with agent.client.post(url, json=chat("m")) as response:
                assert response.status == 500
        await _error_says(agent, "m", "killed as wedged: 3 requests in a row failed")
        plan.status = None
        async with agent.client.post(url, json=chat("m")) as response:
            assert response.status == 200
        assert plan.spawned == ["m", "m"]


async def test_a_slow_but_progressing_stream_is_never_cut() -> None:
    plan = Plan(token_every=0.4)  # each chunk within --timeout, the whole stream well past it
    async with fake_agent(plan, [spec("m")], proxy_timeout=1.0) as agent:
        url = f"{agent.url}/v1/chat/completions"
        async with agent.client.post(url, json=chat("m", 6, stream=True)) as response:
            body = await response.read()
        assert body.rstrip().endswith(b"data: [DONE]"), body[-200:]
        assert plan.spawned == ["m"]
        assert (await _listed(agent, "m"))["corral"]["error"] is None


async def test_a_websocket_session_is_proxied_and_leases_its_model_for_its_life() -> None:
    """Issue 29, item 8: llama.cpp's router's proxy_ws (``/v1/realtime?model=``)."""
    plan = Plan()
    async with fake_agent(plan, [spec("m")]) as agent:
        url = f"{agent.url}/v1/realtime?model=m"
        async with agent.client.ws_connect(url) as ws:
            await ws.send_str("hello")
            assert (await ws.receive_str()) == "echo: hello"
            await ws.send_bytes(b"abc")
            assert (await ws.receive_bytes()) == b"cba"
            assert agent.registry.scheduler.view("m").in_flight == 1  # leased meanwhile
            (child,) = plan.children
            assert child.sockets == 1
        for _ in range(100):  # closed on both sides together
            if child.sockets == 0 and agent.registry.scheduler.view("m").in_flight == 0:
                break
            await asyncio.sleep(0.02)
        assert (child.sockets, agent.registry.scheduler.view("m").in_flight) == (0, 0)


async def test_a_websocket_ends_on_both_sides_when_its_model_stops() -> None:
    plan = Plan()
    async with fake_agent(plan, [spec("m", stop_timeout=0.2)]) as agent:
        async with agent.client.ws_connect(f"{agent.url}/v1/realtime?model=m") as ws:
            await ws.send_str("x")
            assert (await ws.receive_str()) == "echo: x"
            async with agent.client.post(f"{agent.url}/models/unload", json={"model": "m"}) as r:
                assert r.status == 200
            async with asyncio.timeout(5):
                message = await ws.receive()
            assert message.type in (aiohttp.WSMsgType.CLOSE, aiohttp.WSMsgType.CLOSED)
        assert "m" in plan.exited


async def test_an_event_stream_client_that_went_away_is_no_error(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 29, item 7: a browser closing /models/sse logged ``ERROR … unexpected error``
    with a ClientConnectionResetError traceback when an event's write found it gone."""
    async with fake_agent(Plan(), [spec("m")]) as agent:
        sse = await agent.client.get(f"{agent.url}/models/sse")

        async def gone(self: web.StreamResponse, data: bytes) -> None:
            raise aiohttp.ClientConnectionResetError("Cannot write to closing transport")

        monkeypatch.setattr(web.StreamResponse, "write", gone)
        with caplog.at_level(logging.DEBUG):
            agent.registry.publish("m", "status_change", {"status": "loading"})
            await asyncio.sleep(0.2)
        monkeypatch.undo()
        sse.close()
        assert "unexpected error" not in caplog.text, caplog.text


async def test_the_listed_preset_hash_is_the_running_childs_until_a_changed_one_restarts() -> None:
    """Issue 25: the operator's Ready waits for each node's ``corral.preset_hash``; a reload
    that restarts a child must not report the new version while the old child still runs,
    and one that updates a model in place (its TTL) serves the new version at once."""
    plan = Plan()
    v1 = spec("m", stop_timeout=5.0, preset_hash="v1")
    async with fake_agent(plan, [v1]) as agent:
        assert (await _listed(agent, "m"))["corral"]["preset_hash"] == "v1"
        stream = await open_stream(agent, "m")  # keeps the v1 child draining
        v2 = spec("m", stop_timeout=5.0, preset_hash="v2", options=(("ctx-size", "64"),))
        reloading = asyncio.create_task(agent.registry.reload(Catalog({"m": v2}), {"m"}))
        await asyncio.sleep(0.2)
        assert (await _listed(agent, "m"))["corral"]["preset_hash"] == "v1"
        stream.close()
        await reloading
        assert (await _listed(agent, "m"))["corral"]["preset_hash"] == "v2"
        await agent.client.post(f"{agent.url}/models/load", json={"model": "m"})
        v3 = spec("m", stop_timeout=5.0, preset_hash="v3", options=(("ctx-size", "64"),), ttl=60)
        await agent.registry.reload(Catalog({"m": v3}), set())
        assert (await _listed(agent, "m"))["corral"]["preset_hash"] == "v3"
        assert plan.spawned == ["m", "m"]  # the TTL took no restart


async def request_on_its_way(agent: Agent, plan: Plan) -> asyncio.Task[aiohttp.ClientResponse]:
    """A request for "m" whose load is granted while its child is not spawned yet (the plan
    spawns 0.3 s after the grant): the window where a reload or a DELETE finds it."""
    request = asyncio.create_task(
        agent.client.post(f"{agent.url}/v1/chat/completions", json=chat("m"))
    )
    await asyncio.sleep(0.1)
    assert plan.spawned == [] and len(plan.children) == 1
    return request


async def test_a_reload_while_a_changed_models_child_is_on_its_way_restarts_it() -> None:
    """The child spawned with the old arguments ran them until next stopped, and the reload
    (``corral reload``, the operator's PUT) waited for that child to end."""
    plan = Plan(spawn_after=0.3)
    v1 = spec("m", stop_timeout=5.0, preset_hash="v1")
    async with fake_agent(plan, [v1]) as agent:
        request = await request_on_its_way(agent, plan)
        v2 = spec("m", stop_timeout=5.0, preset_hash="v2", options=(("ctx-size", "64"),))
        async with asyncio.timeout(5):
            await agent.registry.reload(Catalog({"m": v2}), {"m"})
            response = await request
        assert response.status == 200
        assert [child.spec.preset_hash for child in plan.children] == ["v1", "v2"]
        assert (await _listed(agent, "m"))["corral"]["preset_hash"] == "v2"


async def test_a_changed_models_child_that_fails_to_spawn_loads_the_new_arguments() -> None:
    """The old arguments' spawn failed after the reload (its port taken, its binary gone) and
    the request that waited for the new ones was refused with that failure."""
    plan = Plan(spawn_after=0.3)
    v1 = spec("m", stop_timeout=5.0, preset_hash="v1")
    async with fake_agent(plan, [v1]) as agent:
        request = await request_on_its_way(agent, plan)
        (old,) = plan.children
        old.plan = dataclasses.replace(plan, spawn_fails="port 1234 taken")  # this child only
        v2 = spec("m", stop_timeout=5.0, preset_hash="v2", options=(("ctx-size", "64"),))
        async with asyncio.timeout(5):
            await agent.registry.reload(Catalog({"m": v2}), {"m"})
            response = await request
        assert response.status == 200, await response.text()
        assert [child.spec.preset_hash for child in plan.children] == ["v1", "v2"]
        assert plan.spawned == ["m"]  # the second only


async def test_a_load_on_startup_model_whose_arguments_changed_is_loaded_again() -> None:
    """Found by the cluster tier (issue 25): a loadOnStartup preset whose ``args`` changed
    stopped for the new arguments and stayed unloaded until a request came."""
    plan = Plan()
    v1 = spec("m", load_on_startup=True)
    async with fake_agent(plan, [v1]) as agent:
        events = agent.registry.events()
        waiting = asyncio.ensure_future(anext(events))
        await asyncio.sleep(0)  # the subscription starts before the check

        async def loaded() -> None:
            nonlocal waiting
            async with asyncio.timeout(5):
                while ((await waiting).data or {}).get("status") != "loaded":
                    waiting = asyncio.ensure_future(anext(events))
            waiting = asyncio.ensure_future(anext(events))

        if agent.registry.state("m") is not ModelState.LOADED:
            await loaded()  # its load at start
        v2 = spec("m", load_on_startup=True, options=(("ctx-size", "64"),))
        await agent.registry.reload(Catalog({"m": v2}), {"m"})
        await loaded()
        waiting.cancel()
        await events.aclose()
        assert plan.spawned == ["m", "m"]


async def test_a_stream_cut_mid_event_ends_with_whole_events_and_the_error_event() -> None:
    """Found under load (a peer killed mid-write): half an event, then the proxy's error event
    on the same line, a line no client can parse. Every event the client gets is whole."""
    plan = Plan(cut_mid_event=True)
    async with fake_agent(plan, [spec("m")]) as agent:
        stream = await open_stream(agent, "m")
        rest, _ = await read_to_end(stream)
    events = [line[6:] for line in rest.split(b"\n") if line.startswith(b"data: ")]
    parsed = [json.loads(event) for event in events]  # each one whole
    assert "stopped mid-response" in parsed[-1]["error"]["message"], rest
    assert rest.endswith(b"\n\n") and len(parsed) == 2, rest  # the second token, the error


async def test_a_model_gone_and_back_while_its_child_is_on_its_way_ends_the_first_reload() -> None:
    """Review of 12ca46d: the reload that dropped it waited for its run; the one that brought
    it back (other arguments) cleared ``gone``, so that child ran on and the first reload hung
    until it ended; meanwhile ``GET /models`` gave the new version for the old child."""
    plan = Plan(spawn_after=0.3)
    v1 = spec("m", stop_timeout=5.0, preset_hash="v1")
    async with fake_agent(plan, [v1]) as agent:
        request = await request_on_its_way(agent, plan)
        dropped = asyncio.create_task(agent.registry.reload(Catalog({}), set()))
        await asyncio.sleep(0.01)
        v2 = spec("m", stop_timeout=5.0, preset_hash="v2", options=(("ctx-size", "64"),))
        await agent.registry.reload(Catalog({"m": v2}), set())  # back: "added" to the agent
        assert (await _listed(agent, "m"))["corral"]["preset_hash"] == "v1"  # on its way
        async with asyncio.timeout(5):
            await dropped
        assert "m" in plan.exited
        assert (await request).status == 400  # it was gone when it waited
        assert (await _listed(agent, "m"))["corral"]["preset_hash"] == "v2"


async def test_an_update_in_place_while_an_outdated_child_is_on_its_way_keeps_its_hash() -> None:
    """Review of 12ca46d: a second reload that only updates the model (its TTL) reported the
    new version for the child on its way, which runs the arguments of the first."""
    plan = Plan(spawn_after=0.3)
    v1 = spec("m", stop_timeout=5.0, preset_hash="v1")
    async with fake_agent(plan, [v1]) as agent:
        request = await request_on_its_way(agent, plan)
        v2 = spec("m", stop_timeout=5.0, preset_hash="v2", options=(("ctx-size", "64"),))
        first = asyncio.create_task(agent.registry.reload(Catalog({"m": v2}), {"m"}))
        await asyncio.sleep(0.01)
        v3 = spec("m", stop_timeout=5.0, preset_hash="v3", options=(("ctx-size", "64"),), ttl=60)
        await agent.registry.reload(Catalog({"m": v3}), set())
        assert (await _listed(agent, "m"))["corral"]["preset_hash"] == "v1"  # on its way
        async with asyncio.timeout(5):
            await first
            response = await request
        assert response.status == 200
        assert [child.spec.preset_hash for child in plan.children] == ["v1", "v3"]
        assert (await _listed(agent, "m"))["corral"]["preset_hash"] == "v3"


async def test_a_delete_while_a_models_child_is_on_its_way_returns_once_it_exits() -> None:
    """Review of 12ca46d: ``DELETE /models`` (``stop_and_wait``) of a model whose load was
    granted sent an Unload the scheduler ignored (nothing ran yet), then waited for that run:
    until the child's TTL, or for ever."""
    plan = Plan(spawn_after=0.3)
    async with fake_agent(plan, [spec("m", stop_timeout=5.0)]) as agent:
        request = await request_on_its_way(agent, plan)
        async with asyncio.timeout(5):
            await agent.registry.stop_and_wait("m")
        assert plan.spawned == ["m"] and "m" in plan.exited
        async with asyncio.timeout(5):
            response = await request  # its waiter loads it again
        assert response.status == 200
        assert plan.spawned == ["m", "m"]


async def test_a_load_on_startup_model_changed_while_its_load_was_granted_loads_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Review of 12ca46d: its start-up load waits through the restart and loads it again; the
    reload then loaded it a second time, refused ("already running") with a warning."""
    plan = Plan(spawn_after=0.3)
    v1 = spec("m", stop_timeout=5.0, load_on_startup=True, preset_hash="v1")
    async with fake_agent(plan, [v1]) as agent:
        await asyncio.sleep(0.1)  # its start-up load is granted; no process yet
        assert plan.spawned == [] and len(plan.children) == 1
        v2 = spec(
            "m", stop_timeout=5.0, load_on_startup=True, preset_hash="v2",
            options=(("ctx-size", "64"),),
        )  # fmt: skip
        with caplog.at_level(logging.INFO, logger="corral"):
            async with asyncio.timeout(5):
                await agent.registry.reload(Catalog({"m": v2}), {"m"})
            for _ in range(100):  # loaded by its start-up load, within 1 s
                if agent.registry.state("m") is ModelState.LOADED:
                    break
                await asyncio.sleep(0.01)
            await asyncio.sleep(0.5)  # a second load would have been refused by now
        assert agent.registry.state("m") is ModelState.LOADED
        assert [child.spec.preset_hash for child in plan.children] == ["v1", "v2"]
        assert "already running" not in caplog.text, caplog.text


@pytest.mark.parametrize("child", ["draining", "on its way"])
async def test_a_load_on_startup_model_gone_and_back_before_its_child_ended_is_loaded_again(
    child: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Review of 12ca46d: the reload that brought it back saw the spec kept for its stopping
    child as the model's former self (load-on-startup already), so nothing loaded it once that
    child had ended; with its child on its way, the start-up load was refused ("already
    running") for the child that was about to stop."""
    plan = Plan(spawn_after=0.3 if child == "on its way" else 0.0)
    v1 = spec("m", stop_timeout=5.0, load_on_startup=True, preset_hash="v1")
    async with fake_agent(plan, [v1]) as agent:
        stream = None
        if child == "draining":
            for _ in range(100):
                if agent.registry.state("m") is ModelState.LOADED:
                    break
                await asyncio.sleep(0.01)
            stream = await open_stream(agent, "m")  # keeps the v1 child draining
        else:
            await asyncio.sleep(0.1)  # its start-up load is granted; no process yet
            assert plan.spawned == []
        dropped = asyncio.create_task(agent.registry.reload(Catalog({}), set()))
        await asyncio.sleep(0.05)
        assert not dropped.done()
        v2 = spec("m", stop_timeout=5.0, load_on_startup=True, preset_hash="v2")
        with caplog.at_level(logging.INFO, logger="corral"):
            await agent.registry.reload(Catalog({"m": v2}), set())
            if stream is not None:
                stream.close()
            async with asyncio.timeout(5):
                await dropped
            for _ in range(200):
                if len(plan.children) == 2 and agent.registry.state("m") is ModelState.LOADED:
                    break
                await asyncio.sleep(0.01)
        assert [child.spec.preset_hash for child in plan.children] == ["v1", "v2"]
        assert agent.registry.state("m") is ModelState.LOADED
        assert "already running" not in caplog.text, caplog.text
