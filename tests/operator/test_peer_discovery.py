"""Peers from the agents' headless Service (``--peers-from-service``), with real agents on
loopback and the apiserver emulated (kmock, held to the apiserver's rules): the agents list and
watch the Service's EndpointSlices, a request is forwarded once its peer's endpoint appears,
and no more once that endpoint is removed.

All agents listen on 127.0.0.1, each on its own port, so each has its own EndpointSlice (as
the EndpointSlice controller does for pods whose named port resolves to different numbers);
they know themselves by ``POD_NAME`` (the slices' ``targetRef``), since they share one IP.
The emulator honours ``labelSelector`` as the apiserver does, and records the agents' requests
for the check against the agent Role the chart renders. In-process tests cover the rest of the
protocol: a watch refused or ended with 410 Gone lists again, and the in-cluster way in (the
service account's CA and token, the emulator behind TLS that checks the token).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import shutil
import ssl
import subprocess
import time
import warnings
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import attrs
import kmock as kmocklib
import pytest
from aiohttp import ClientSession, web

from node_agent.api.peer_discovery import KubeApi, PeerDiscovery, kube_api
from node_agent.core.endpoint_slices import Me, SliceView
from tests.integration.harness import AgentProcess, chat, free_port, http
from tests.operator.apiserver import Access, StrictEmulator, access_of
from tests.operator.cluster import API_KEY, NS, send
from tests.operator.rbac import granted_to

SERVICE = "corral-agent-headless"
SLICES = f"/apis/discovery.k8s.io/v1/namespaces/{NS}/endpointslices"
AUTH = {"Authorization": f"Bearer {API_KEY}"}
TINY = "demo-tiny"
PODS = ("agent-a", "agent-b")

pytestmark = [pytest.mark.timeout(180)]


def _labels_match(obj: Any, selector: str) -> bool:
    labels = (obj.get("metadata") or {}).get("labels") or {}
    pairs = [term.split("=", 1) for term in selector.split(",") if term]
    return all(labels.get(key) == value for key, value in pairs)


@attrs.define(kw_only=True)
class SliceEmulator(StrictEmulator):
    """The strict emulator, with what the apiserver does for a labelSelector (kmock lists and
    watches everything), recording every read of EndpointSlices."""

    slice_access: list[Access] = attrs.field(factory=list, init=False)
    selectors: list[str | None] = attrs.field(factory=list, init=False)

    async def _handle(self, request: kmocklib.Request) -> Any:
        # The test only writes slices; every read is an agent's.
        reads = (kmocklib.action.LIST, kmocklib.action.WATCH, kmocklib.action.FETCH)
        resource = request.resource
        if resource is not None and resource.plural == "endpointslices" and request.action in reads:
            self.slice_access.append(access_of(request))
            self.selectors.append(request.params.get("labelSelector"))
        return await super()._handle(request)

    async def _serve_list(self, request: kmocklib.Request) -> Any:
        body = await super()._serve_list(request)
        selector = request.params.get("labelSelector")
        if selector:
            body["items"] = [o for o in body["items"] if _labels_match(o, selector)]
        return body

    async def _serve_watch(self, request: kmocklib.Request) -> Any:
        selector = request.params.get("labelSelector") or ""
        async for event in super()._serve_watch(request):
            if not isinstance(event, dict) or _labels_match(event.get("object") or {}, selector):
                yield event


@attrs.define(kw_only=True)
class ExpiringEmulator(SliceEmulator):
    """As the apiserver once a resourceVersion is older than it keeps: the first watch is
    refused with 410 Gone, the second ends with a 410 ERROR event; later ones run."""

    watches: int = attrs.field(default=0, init=False)

    async def _serve_watch(self, request: kmocklib.Request) -> Any:
        self.watches += 1
        if self.watches == 1:
            raise kmocklib.KubernetesError(status=410, reason="Expired", message="too old")
        if self.watches == 2:
            yield b""
            yield {"type": "ERROR", "object": {"kind": "Status", "code": 410, "reason": "Expired"}}
            return
        async for event in super()._serve_watch(request):
            yield event


MANAGED = {"endpointslice.kubernetes.io/managed-by": "endpointslice-controller.k8s.io"}


def endpoint_slice(
    pod: str, port: int, *, service: str = SERVICE, serving: bool = True, managed: bool = True
) -> Any:
    return {
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "metadata": {
            "name": f"{service}-{pod}",
            "namespace": NS,
            "labels": {"kubernetes.io/service-name": service, **(MANAGED if managed else {})},
        },
        "addressType": "IPv4",
        "endpoints": [
            {
                "addresses": ["127.0.0.1"],
                # publishNotReadyAddresses (the chart's headless Service): ready stays true.
                "conditions": {"ready": True, "serving": serving, "terminating": False},
                "targetRef": {"kind": "Pod", "name": pod, "namespace": NS},
            }
        ],
        "ports": [{"name": "http", "port": port, "protocol": "TCP"}],
    }


@pytest.fixture
async def agents(kmock: Any, demo_dir: Path) -> AsyncIterator[dict[str, AgentProcess]]:
    with warnings.catch_warnings():
        # kmock 0.8 reads its bundle with importlib.resources.read_binary (deprecated).
        warnings.simplefilter("ignore", DeprecationWarning)
        kmock.resources.load_bundled()
    started: dict[str, AgentProcess] = {}
    args = [
        "--models-dir", str(demo_dir), "--models-max", "1",
        "--peers-from-service", f"{NS}/{SERVICE}", "--kube-api", str(kmock.url),
        "--log-level", "debug",
    ]  # fmt: skip
    try:
        for pod in PODS:
            # Started off the loop: the emulator answers the agents while they start.
            started[pod] = await asyncio.to_thread(
                AgentProcess, args, {"POD_NAME": pod, "LLAMA_API_KEY": API_KEY}
            )
        yield started
    finally:
        for agent in started.values():
            await asyncio.to_thread(agent.stop)


async def post(agent: AgentProcess, query: str = "") -> tuple[int, Any]:
    return await asyncio.to_thread(
        http, "POST", f"{agent.url}/v1/chat/completions{query}", chat(TINY), headers=AUTH
    )


async def until(check: Callable[[], Awaitable[bool]], what: str, within: float = 60) -> None:
    deadline = time.monotonic() + within
    while True:
        if await check():
            return
        assert time.monotonic() < deadline, what
        await asyncio.sleep(0.2)


def loads(agent: AgentProcess) -> float:
    status, text = http("GET", agent.url + "/metrics", headers=AUTH)
    assert status == 200, text
    return sum(
        float(line.rpartition(" ")[2])
        for line in text.splitlines()
        if line.startswith("corral_model_loads_total{") and 'result="loaded"' in line
    )


@pytest.mark.kmock(cls=SliceEmulator)
async def test_a_request_follows_its_peer_in_and_out_of_the_endpoint_slices(
    kmock: Any, agents: dict[str, AgentProcess]
) -> None:
    a, b = agents["agent-a"], agents["agent-b"]
    # Only A's own endpoint, and another Service's slice naming B: A has no peer yet.
    await send(kmock, "POST", SLICES, endpoint_slice("agent-a", a.port))
    await send(kmock, "POST", SLICES, endpoint_slice("agent-b", b.port, service="other"))
    assert (await post(b))[0] == 200  # B loads the model
    status, body = await post(a, "?autoload=false")
    assert status != 200, body  # not here, and no peer has it

    # B's endpoint appears, not serving yet (starting): not a peer. A pod C that serves comes
    # after it: once A has added C, it has seen B's endpoint too (a watch is in order).
    await send(kmock, "POST", SLICES, endpoint_slice("agent-b", b.port, serving=False))
    c_port = free_port()  # nothing listens there: C never answers A's polls
    await send(kmock, "POST", SLICES, endpoint_slice("agent-c", c_port))

    async def sees_c() -> bool:
        return f"added ['http://127.0.0.1:{c_port}']" in await asyncio.to_thread(a.log)

    await until(sees_c, f"A never added C:\n{a.log()[-3000:]}")
    status, body = await post(a, "?autoload=false")
    assert status != 200, body
    # B serves: A forwards.
    slice_b = f"{SLICES}/{SERVICE}-agent-b"
    await send(kmock, "PATCH", slice_b, endpoint_slice("agent-b", b.port))

    async def forwarded() -> bool:
        return (await post(a, "?autoload=false"))[0] == 200

    await until(forwarded, f"A never forwarded to B:\n{a.log()[-3000:]}")
    assert await asyncio.to_thread(loads, a) == 0  # served by B, never loaded on A

    # B's endpoint is removed: A stops sending there (and, without autoload, cannot serve it).
    await send(kmock, "DELETE", slice_b)

    async def not_forwarded() -> bool:
        return (await post(a, "?autoload=false"))[0] != 200

    await until(not_forwarded, f"A still forwards to B:\n{a.log()[-3000:]}")
    log = await asyncio.to_thread(a.log)
    assert f"added ['http://127.0.0.1:{b.port}']" in log
    assert f"gone ['http://127.0.0.1:{b.port}']" in log
    # Every request named the Service's label and the controller's; none was refused.
    assert kmock.selectors and set(kmock.selectors) == {
        f"kubernetes.io/service-name={SERVICE},"
        "endpointslice.kubernetes.io/managed-by=endpointslice-controller.k8s.io"
    }
    assert kmock.refused == []
    # What the agents asked is exactly what the chart's agent Role grants: no more, no less.
    assert set(kmock.slice_access) == granted_to("-agent")


@pytest.mark.kmock(cls=ExpiringEmulator)
async def test_a_watch_that_cannot_resume_lists_again(kmock: Any) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        kmock.resources.load_bundled()
    await send(kmock, "POST", SLICES, endpoint_slice("agent-a", 1001))
    seen: list[tuple[str, ...]] = []
    discovery = PeerDiscovery(
        KubeApi(str(kmock.url).rstrip("/")), NS, SERVICE, SliceView(Me(pod_name="me")), seen.append
    )
    task = asyncio.create_task(discovery.run())
    try:

        async def watching() -> bool:
            return kmock.watches >= 3

        await until(watching, "the discovery never watched a third time")
        await send(kmock, "POST", SLICES, endpoint_slice("agent-b", 1002))

        async def both() -> bool:
            return bool(seen) and len(seen[-1]) == 2

        await until(both, f"B never became a peer: {seen}")
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
    lists = [a for a in kmock.slice_access if a.verb == "list"]
    assert len(lists) == 3  # the first, then one after each 410
    assert seen == [("http://127.0.0.1:1001",), ("http://127.0.0.1:1001", "http://127.0.0.1:1002")]


@pytest.mark.kmock(cls=SliceEmulator)
async def test_a_hand_made_slice_is_no_peer(kmock: Any) -> None:
    """A slice with the Service's label that the EndpointSlice controller does not manage
    (anyone allowed to create one could point the agents and their API key anywhere)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        kmock.resources.load_bundled()
    await send(kmock, "POST", SLICES, endpoint_slice("agent-x", 6666, managed=False))
    await send(kmock, "POST", SLICES, endpoint_slice("agent-a", 1001))
    seen: list[tuple[str, ...]] = []
    view = SliceView(Me(pod_name="me"))
    task = asyncio.create_task(
        PeerDiscovery(KubeApi(str(kmock.url).rstrip("/")), NS, SERVICE, view, seen.append).run()
    )
    try:

        async def listed() -> bool:
            return bool(seen)

        await until(listed, "the discovery never listed")
        await send(kmock, "POST", SLICES, endpoint_slice("agent-y", 6667, managed=False))
        await send(kmock, "POST", SLICES, endpoint_slice("agent-b", 1002))

        async def b_too() -> bool:
            return len(seen[-1]) == 2

        await until(b_too, f"B never became a peer: {seen}")
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
    assert seen == [("http://127.0.0.1:1001",), ("http://127.0.0.1:1001", "http://127.0.0.1:1002")]


@contextlib.asynccontextmanager
async def scripted_apiserver(
    answers: list[Callable[[web.Request], Awaitable[web.StreamResponse]]],
) -> AsyncIterator[tuple[str, list[str]]]:
    """An apiserver that answers the n-th request with ``answers[n]`` (the last one from then
    on): yields its URL and the requests' queries."""
    asked: list[str] = []

    async def answer(request: web.Request) -> web.StreamResponse:
        asked.append(request.query_string)
        return await answers[min(len(asked), len(answers)) - 1](request)

    app = web.Application()
    app.router.add_get(SLICES, answer)
    runner = web.AppRunner(app, shutdown_timeout=0.1)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        yield f"http://127.0.0.1:{runner.addresses[0][1]}", asked
    finally:
        await runner.cleanup()


def json_answer(body: Any) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
    async def send_it(request: web.Request) -> web.StreamResponse:
        return web.json_response(body)

    return send_it


async def test_answers_of_an_unexpected_shape_never_end_the_discovery() -> None:
    """A list answer that is a list, then null, then one whose item and endpoints are of the
    wrong shape, then a watch that sends the good slice, null and a list: the discovery takes
    the good slice and goes on."""
    good = endpoint_slice("agent-a", 1001)
    odd = endpoint_slice("agent-x", 6666)
    odd["endpoints"] = {"addresses": ["192.0.2.1"]}
    added = json.dumps({"type": "ADDED", "object": good}).encode()
    lines = added + b"\nnull\n[1]\n"  # a null event: list again, and watch again

    async def watch(request: web.Request) -> web.StreamResponse:
        if request.query.get("watch") != "true":
            return web.json_response({"metadata": {"resourceVersion": "5"}, "items": [odd, None]})
        return web.Response(body=lines, content_type="application/json")

    seen: list[tuple[str, ...]] = []
    async with scripted_apiserver([json_answer([]), json_answer(None), watch]) as (url, asked):
        view = SliceView(Me(pod_name="me"))
        task = asyncio.create_task(
            PeerDiscovery(KubeApi(url), NS, SERVICE, view, seen.append).run()
        )
        try:

            async def found() -> bool:
                return ("http://127.0.0.1:1001",) in seen

            await until(found, f"the discovery never took the good slice: {seen} {asked}")

            async def went_on() -> bool:  # listed again after the null event, and watched
                return len(asked) >= 5

            await until(went_on, f"the discovery stopped: {asked}")
            assert not task.done()
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task


async def test_a_watch_that_ends_at_once_is_not_asked_again_at_once() -> None:
    """200 and an empty body, every time: at most a few watches in 3 s (a pause after each,
    growing), not hundreds."""

    async def empty(request: web.Request) -> web.StreamResponse:
        if request.query.get("watch") != "true":
            return web.json_response({"metadata": {"resourceVersion": "5"}, "items": []})
        return web.Response(body=b"", content_type="application/json")

    async with scripted_apiserver([empty]) as (url, asked):
        view = SliceView(Me(pod_name="me"))
        task = asyncio.create_task(
            PeerDiscovery(KubeApi(url), NS, SERVICE, view, lambda peers: None).run()
        )
        try:
            await asyncio.sleep(3)
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
    watches = [q for q in asked if "watch=true" in q]
    assert 1 <= len(watches) <= 3, len(watches)  # pauses of 1 s then 2 s


@pytest.fixture(scope="module")
def certificate(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A self-signed certificate for 127.0.0.1, as the cluster CA and the apiserver's own."""
    if shutil.which("openssl") is None:
        pytest.skip("needs openssl")
    folder = tmp_path_factory.mktemp("apiserver-tls")
    key, cert = folder / "key.pem", folder / "cert.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
         "-subj", "/CN=kubernetes", "-addext", "subjectAltName=IP:127.0.0.1",
         "-keyout", str(key), "-out", str(cert)],
        check=True,
        capture_output=True,
    )  # fmt: skip
    return key, cert


@contextlib.asynccontextmanager
async def https_front(kmock: Any, cert: tuple[Path, Path], token: str) -> AsyncIterator[int]:
    """The emulator behind TLS and a bearer token, as the in-cluster apiserver is reached:
    yields its port on 127.0.0.1."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(str(cert[1]), str(cert[0]))
    session = ClientSession()

    async def relay(request: web.Request) -> web.StreamResponse:
        if request.headers.get("Authorization") != f"Bearer {token}":
            return web.json_response({"kind": "Status", "code": 401}, status=401)
        url = f"{str(kmock.url).rstrip('/')}{request.path_qs}"
        async with session.get(url) as upstream:
            response = web.StreamResponse(status=upstream.status)
            response.content_type = upstream.content_type
            await response.prepare(request)
            async for chunk in upstream.content.iter_any():
                await response.write(chunk)
            return response

    app = web.Application()
    app.router.add_get("/{tail:.*}", relay)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=context)
    await site.start()
    try:
        yield runner.addresses[0][1]
    finally:
        await runner.cleanup()
        await session.close()


@pytest.mark.kmock(cls=SliceEmulator)
async def test_in_cluster_the_apiserver_is_asked_over_tls_with_the_pods_token(
    kmock: Any, certificate: tuple[Path, Path], tmp_path: Path
) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        kmock.resources.load_bundled()
    await send(kmock, "POST", SLICES, endpoint_slice("agent-a", 1001))
    account = tmp_path / "serviceaccount"
    account.mkdir()
    (account / "token").write_text("pod-token\n")
    (account / "ca.crt").write_bytes(certificate[1].read_bytes())
    async with https_front(kmock, certificate, "pod-token") as port:
        env = {"KUBERNETES_SERVICE_HOST": "127.0.0.1", "KUBERNETES_SERVICE_PORT": str(port)}
        api = kube_api(None, env, account)
        assert api.server == f"https://127.0.0.1:{port}"
        seen: list[tuple[str, ...]] = []
        view = SliceView(Me(pod_name="me"))
        task = asyncio.create_task(PeerDiscovery(api, NS, SERVICE, view, seen.append).run())
        try:

            async def found() -> bool:
                return seen == [("http://127.0.0.1:1001",)]

            await until(found, f"no peer over TLS: {seen}")
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
