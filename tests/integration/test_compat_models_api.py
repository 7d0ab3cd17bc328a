"""Side by side with llama.cpp b11434's router: the models API (``POST``/``DELETE /models``,
``downloading``, the download events) and ``dedup-cache-models`` (issue 14, acceptance 1).

Both routers download from one local Hugging Face hub (``hf_server``, ``MODEL_ENDPOINT``), each
into its own ``HF_HOME``; both run b11434 as the binary (Corral's children too). The same
scripted requests go to each: status, error body, JSON shape and the SSE events' shapes must
agree. The differences kept on purpose are asserted as differences, each in its own test (and
listed in docs/downloads.md).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from node_agent.sources.download import cache_dir, destination
from tests.integration.harness import AgentProcess, chat, wait_until
from tests.integration.hf_server import HubServer, start_hub
from tests.integration.model_events import EventLog
from tests.integration.test_compat import Answer, LlamaRouter, assert_same, call, shape

REPO = "corral-test/tiny"
MODEL = f"{REPO}:Q8_0"
OTHER = f"{REPO}:F16"
DEDUP_REPO = "corral-test/dedup"
DEDUP = f"{DEDUP_REPO}:Q4_0"
FLAGS = ("--models-max", "2", "-c", "512")


@dataclass
class Side:
    port: int
    events: EventLog
    preset: Path
    hf_home: Path


@dataclass
class Pair:
    peer: Side
    corral: Side
    hub: HubServer

    def both(self, method: str, path: str, body: Any = None) -> tuple[Answer, Answer]:
        return call(self.peer.port, method, path, body), call(self.corral.port, method, path, body)

    def same(self, method: str, path: str, body: Any = None) -> Answer:
        peer, corral = self.both(method, path, body)
        # assert_same compares GET /models answers as model lists; the others by shape.
        step = f"{method} {path}" if method == "GET" else f"{method} {path}: {body}"
        assert_same(step, peer, corral)
        return corral

    def sides(self) -> tuple[Side, Side]:
        return self.peer, self.corral


def listing(port: int) -> dict[str, dict[str, Any]]:
    return {m["id"]: m for m in call(port, "GET", "/models").json()["data"]}


def wait_state(pair: Pair, model: str, state: str | None) -> None:
    """Both list ``model`` in ``state`` (None: neither lists it)."""
    for side in pair.sides():

        def settled(port: int = side.port) -> bool:
            entry = listing(port).get(model)
            return entry is None if state is None else entry and entry["status"]["value"] == state

        wait_until(settled, f"{model} {state} on port {side.port}")


def download_events(side: Side, model: str) -> list[tuple[str, Any]]:
    """(event, data shape) for ``model``, repeated progress reports folded into one."""
    out: list[tuple[str, Any]] = []
    for event in side.events.of(model):
        item = (event["event"], shape(event.get("data")))
        if not out or out[-1] != item:
            out.append(item)
    return out


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory, demo_dir: Path, b11434: Path) -> Iterator[Pair]:
    hub = start_hub()
    tiny = (demo_dir / "demo-tiny.gguf").read_bytes()
    hub.add(
        REPO, {"tiny-Q8_0.gguf": tiny, "tiny-F16.gguf": (demo_dir / "demo-small.gguf").read_bytes()}
    )
    hub.add(DEDUP_REPO, {"dedup-Q4_0.gguf": tiny})
    tmp = tmp_path_factory.mktemp("compat-models-api")
    folder = tmp / "models"
    folder.mkdir()
    shutil.copyfile(demo_dir / "demo-tiny.gguf", folder / "demo-tiny.gguf")
    sides = []
    stops = []
    try:
        for who in ("llama", "corral"):
            home = tmp / who / "hf"
            preset = tmp / who / "preset.ini"
            preset.parent.mkdir()
            preset.write_text("")
            env = {"MODEL_ENDPOINT": hub.url + "/", "HF_HOME": str(home), "LLAMA_CACHE": ""}
            args = ["--models-dir", str(folder), "--models-preset", str(preset), *FLAGS]
            if who == "llama":
                with pytest.MonkeyPatch.context() as mp:
                    for k, v in env.items():
                        if v:
                            mp.setenv(k, v)
                        else:
                            mp.delenv(k, raising=False)
                    router = LlamaRouter(str(b11434), args, tmp / "llama-router.log")
                stops.append(router.stop)
                port = router.port
            else:
                agent = AgentProcess(["--llama-server", str(b11434), *args], env=env)
                stops.append(agent.stop)
                port = agent.port
            sides.append(Side(port, EventLog(port), preset, home))
        yield Pair(sides[0], sides[1], hub)
    finally:
        hub.release()
        for side in sides:
            side.events.close()
        for stop in stops:
            stop()
        hub.close()


def test_post_and_delete_models_match(pair: Pair) -> None:
    pair.same("POST", "/models", {})
    pair.same("POST", "/models", {"model": ""})
    pair.same("POST", "/models", {"model": "not-a-repo"})
    pair.hub.hold(300_000)  # the download stays on its way until released
    pair.same("POST", "/models", {"model": MODEL})
    wait_state(pair, MODEL, "downloading")
    pair.same("GET", "/models")
    pair.same("POST", "/models", {"model": MODEL})  # already exists
    pair.same("DELETE", "/models")
    pair.same("DELETE", "/models?model=nobody/nothing")
    pair.same("DELETE", "/models?model=demo-tiny")  # not from the cache
    pair.hub.release()
    for side in pair.sides():
        side.events.wait_event(MODEL, "download_finished")
    wait_state(pair, MODEL, "unloaded")
    pair.same("GET", "/models")
    peer, corral = (download_events(side, MODEL) for side in pair.sides())
    assert corral == peer
    assert [name for name, _ in corral] == [
        "model_status",
        "download_progress",
        "download_finished",
    ]
    # The downloaded model loads and answers on both (llama-server -hf finds it offline).
    pair.same("POST", "/v1/chat/completions", chat(MODEL, max_tokens=2, temperature=0))
    pair.same("DELETE", f"/models?model={MODEL}")
    wait_state(pair, MODEL, None)
    pair.same("GET", "/models")
    for side in pair.sides():
        side.events.wait_event(MODEL, "model_remove")
        assert not list((side.hf_home / "hub").rglob("*.gguf"))


def test_unload_cancels_a_download_on_both(pair: Pair) -> None:
    # Trickling, not stalled: llama.cpp looks for a cancellation only as bytes arrive.
    pair.hub.pace = 0.05
    pair.same("POST", "/models", {"model": OTHER})
    for side in pair.sides():
        side.events.wait_event(OTHER, "download_progress")
    pair.same("POST", "/models/unload", {"model": OTHER})
    for side in pair.sides():
        side.events.wait_event(OTHER, "download_failed")
    pair.hub.pace = None
    wait_state(pair, OTHER, None)
    peer, corral = (download_events(side, OTHER) for side in pair.sides())
    assert corral == peer
    assert corral[-1][0] == "download_failed"


def test_dedup_cache_models_hides_and_brings_back(pair: Pair) -> None:
    pair.same("POST", "/models", {"model": DEDUP})
    for side in pair.sides():
        side.events.wait_event(DEDUP, "download_finished")
    wait_state(pair, DEDUP, "unloaded")
    for side in pair.sides():
        side.preset.write_text(f"[mine]\nhf-repo = {DEDUP}\ndedup-cache-models = true\n")
    pair.same("GET", "/models?reload=1")
    for side in pair.sides():
        assert DEDUP not in listing(side.port) and "mine" in listing(side.port)
    # Hidden, still usable by its name.
    pair.same("POST", "/v1/chat/completions", chat(DEDUP, max_tokens=2, temperature=0))
    for side in pair.sides():
        side.preset.write_text(f"[mine]\nhf-repo = {DEDUP}\ndedup-cache-models = false\n")
    pair.same("GET", "/models?reload=1")
    for side in pair.sides():
        assert DEDUP in listing(side.port)


# -- the differences we keep (docs/downloads.md) -------------------------------------------


def test_difference_a_request_for_a_downloading_model_waits(pair: Pair) -> None:
    name = f"{REPO}:Q8_0"
    pair.hub.hold(100_000)
    for side in pair.sides():
        assert call(side.port, "POST", "/models", {"model": name}).status == 200
    wait_state(pair, name, "downloading")
    peer = call(pair.peer.port, "POST", "/v1/chat/completions", chat(name, max_tokens=2))
    assert peer.status == 400
    assert peer.json()["error"]["message"] == f"model name={name} is not running"
    answers: list[Answer] = []
    waiter = threading.Thread(
        target=lambda: answers.append(
            call(pair.corral.port, "POST", "/v1/chat/completions", chat(name, max_tokens=2))
        )
    )
    waiter.start()
    waiter.join(1.0)
    assert not answers  # Corral waits for the download
    pair.hub.release()
    waiter.join(120)
    assert answers and answers[0].status == 200
    for side in pair.sides():
        side.events.wait_event(name, "download_finished")
        assert call(side.port, "DELETE", f"/models?model={name}").status == 200


def test_difference_a_name_with_nothing_to_download_is_refused(pair: Pair) -> None:
    name = f"{REPO}:Q2_K"
    peer = call(pair.peer.port, "POST", "/models", {"model": name})
    corral = call(pair.corral.port, "POST", "/models", {"model": name})
    assert peer.status == 200  # then "download_finished" with nothing downloaded
    pair.peer.events.wait_event(name, "download_finished")
    assert corral.status == 400
    assert corral.json()["error"]["message"] == (
        f"model '{name}': no GGUF model file for tag Q2_K in {REPO} "
        "(its GGUF files: tiny-F16.gguf, tiny-Q8_0.gguf)"
    )


def test_difference_a_download_sharing_files_with_one_on_its_way_is_refused(
    pair: Pair,
) -> None:
    first, second = f"{REPO}:F16", f"{REPO}:f16"
    pair.hub.pace = 0.05  # trickling: llama.cpp cancels only as bytes arrive
    for side in pair.sides():
        assert call(side.port, "POST", "/models", {"model": first}).status == 200
    peer = call(pair.peer.port, "POST", "/models", {"model": second})
    corral = call(pair.corral.port, "POST", "/models", {"model": second})
    assert peer.status == 200  # both write the same partial file
    assert corral.status == 400
    assert "shares files with" in corral.json()["error"]["message"]
    for side in pair.sides():
        call(side.port, "POST", "/models/unload", {"model": first})
    call(pair.peer.port, "POST", "/models/unload", {"model": second})
    pair.hub.pace = None
    wait_state(pair, first, None)


def test_loading_a_preset_that_needs_a_download_answers_at_once(pair: Pair) -> None:
    """``POST /models/load`` answers ``success`` at once and the load goes on, as llama.cpp's
    router answers it (its ``models.load`` only starts the child, which downloads): the
    download's progress shows in ``GET /models`` (Corral: ``downloading``, llama.cpp's child:
    ``loading``) while the hub holds the file."""
    repo = "corral-test/held"
    content = pair.hub.repos[REPO]["tiny-Q8_0.gguf"]
    pair.hub.add(repo, {"held-Q8_0.gguf": content})
    url = f"{pair.hub.url}/{repo}/resolve/{HubServer.commit(repo)}/held-Q8_0.gguf"
    sha256 = hashlib.sha256(content).hexdigest()
    # Corral downloads a preset's model-url + model-sha256 itself; llama.cpp's child an hf-repo.
    cached = destination(url, cache_dir(os.environ), sha256)
    cached.unlink(missing_ok=True)
    pair.corral.preset.write_text(f"[held]\nmodel-url = {url}\nmodel-sha256 = {sha256}\n")
    pair.peer.preset.write_text(f"[held]\nhf-repo = {repo}:Q8_0\n")
    try:
        for side in pair.sides():
            assert call(side.port, "GET", "/models?reload=1").status == 200
        pair.hub.hold(100_000)
        answers: dict[int, Answer] = {}
        loads = [
            threading.Thread(
                target=lambda port=side.port: answers.update(
                    {port: call(port, "POST", "/models/load", {"model": "held"})}
                )
            )
            for side in pair.sides()
        ]
        for thread in loads:
            thread.start()
        for thread in loads:
            thread.join(15)  # the hub still holds the file: an answer now did not wait for it
        held = {port: answer.status for port, answer in answers.items()}
        states = {side.port: listing(side.port)["held"]["status"]["value"] for side in pair.sides()}
        pair.hub.release()
        for thread in loads:
            thread.join(120)
        print(f"answers while the download was held: {held}; states then: {states}")
        assert held == {pair.peer.port: 200, pair.corral.port: 200}, held
        for side in pair.sides():
            assert answers[side.port].json() == {"success": True}
        assert states == {pair.peer.port: "loading", pair.corral.port: "downloading"}, states
        wait_state(pair, "held", "loaded")
        for side in pair.sides():
            assert call(side.port, "POST", "/models/unload", {"model": "held"}).status == 200
        wait_state(pair, "held", "unloaded")
    finally:
        pair.hub.release()
        for side in pair.sides():
            side.preset.write_text("")
            call(side.port, "GET", "/models?reload=1")
        cached.unlink(missing_ok=True)
