"""The generated demo models against the real llama-server: load, chat, stream, embed.

The point of these models is that llama-server serves them without errors even under
sampling that reaches deep into the distribution, so the test uses temperature 1.5.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import socket
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from node_agent import demo_models as dm
from node_agent.errors import BinaryError
from node_agent.llama_server.binary import find_llama_server
from tests.integration.harness import missing_in_ci_fails

MODELS = {m.name: m for m in dm.DEMO_MODELS}
CONCURRENCY = 4  # llama-server's default number of slots


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The default demo set, in CORRAL_TEST_MODELS when set (reused across runs)."""
    cache = os.environ.get("CORRAL_TEST_MODELS")
    dest = Path(cache) if cache else tmp_path_factory.mktemp("models")
    dm.write_demo_models(dest)
    return dest


def _binary() -> str:
    """The llama-server the agent would run (`corral llama-server build`'s, by default)."""
    try:
        return str(find_llama_server(None, os.environ))
    except BinaryError as exc:
        missing_in_ci_fails(str(exc))


@dataclass(frozen=True)
class Server:
    url: str
    load_s: float  # spawn → first /health 200


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@contextlib.asynccontextmanager
async def running_server(model: Path, log: Path, *extra: str) -> AsyncIterator[Server]:
    """A real llama-server on a free port, killed on exit; its output goes to ``log``."""
    port = free_port()
    args = ["-m", str(model), "--host", "127.0.0.1", "--port", str(port), "-c", "4096", *extra]
    started = time.monotonic()
    with log.open("wb") as out:
        proc = await asyncio.create_subprocess_exec(
            _binary(), *args, stdout=out, stderr=asyncio.subprocess.STDOUT
        )
    try:
        url = f"http://127.0.0.1:{port}"
        try:
            async with asyncio.timeout(30):
                await wait_healthy(url, proc)
        except (TimeoutError, ProcessLookupError):
            tail = (await asyncio.to_thread(log.read_text))[-3000:]
            pytest.fail(f"llama-server did not become healthy:\n{tail}")
        yield Server(url, time.monotonic() - started)
    finally:
        if proc.returncode is None:
            proc.terminate()
            try:
                await asyncio.wait_for(proc.wait(), 10)
            except TimeoutError:
                proc.kill()
                await proc.wait()


async def wait_healthy(url: str, proc: asyncio.subprocess.Process) -> None:
    async with aiohttp.ClientSession() as http:
        while proc.returncode is None:
            with contextlib.suppress(aiohttp.ClientError):
                async with http.get(url + "/health") as r:
                    if r.status == 200:
                        return
            await asyncio.sleep(0.01)
    raise ProcessLookupError(f"llama-server exited with {proc.returncode}")


async def post_json(http: aiohttp.ClientSession, url: str, body: dict[str, Any]) -> Any:
    async with http.post(url, json=body) as r:
        text = await r.text()
        assert r.status == 200, text
        return json.loads(text)


@pytest.mark.parametrize(
    ("name", "requests"), [("demo-tiny", 100), ("demo-small", 20), ("demo-medium", 8)]
)
async def test_chat_at_high_temperature_never_fails(
    model_dir: Path, tmp_path: Path, name: str, requests: int
) -> None:
    config = MODELS[name]
    async with (
        running_server(model_dir / config.file_name, tmp_path / "server.log") as server,
        aiohttp.ClientSession(server.url) as http,
    ):
        assert server.load_s < 10

        # Full distribution of the next token: byte and control tokens have probability 0.
        body = {"prompt": "Hello", "n_predict": 1, "n_probs": config.n_vocab}
        body |= {"top_k": 0, "top_p": 1.0, "min_p": 0.0, "temperature": 1.5}
        probs = (await post_json(http, "/completion", body))["completion_probabilities"][0]
        banned = [
            t["logprob"]
            for t in probs["top_logprobs"]
            if t["id"] < dm.FIRST_PIECE_ID and t["id"] != dm.EOS_ID
        ]
        assert len(banned) == dm.FIRST_PIECE_ID - 1
        assert max(banned) < -1e30  # log(0), clamped by llama-server

        gate = asyncio.Semaphore(CONCURRENCY)

        async def chat(i: int) -> Any:
            messages = [{"role": "user", "content": f"Tell me story {i}, please ✨"}]
            async with gate:
                return await post_json(
                    http,
                    "/v1/chat/completions",
                    {"messages": messages, "max_tokens": 32, "temperature": 1.5},
                )

        answers = await asyncio.gather(*(chat(i) for i in range(requests)))
        for answer in answers:
            choice = answer["choices"][0]
            assert choice["finish_reason"] in {"length", "stop"}
            assert isinstance(choice["message"]["content"], str)
            assert answer["usage"]["completion_tokens"] <= 32
        # Random weights, random text: not every answer is the same.
        assert len({a["choices"][0]["message"]["content"] for a in answers}) > requests // 2

        body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 16}
        body |= {"temperature": 1.5, "stream": True}
        async with http.post("/v1/chat/completions", json=body) as r:
            assert r.status == 200
            events = [
                line[6:] for line in (await r.text()).splitlines() if line.startswith("data: ")
            ]
        assert events[-1] == "[DONE]"
        chunks = [json.loads(e)["choices"] for e in events[:-1]]
        text = "".join(c[0]["delta"].get("content") or "" for c in chunks if c)
        assert text
        assert any(c and c[0].get("finish_reason") in {"length", "stop"} for c in chunks)


async def test_embeddings_on_the_tiny_model(model_dir: Path, tmp_path: Path) -> None:
    tiny = MODELS["demo-tiny"]
    path = model_dir / tiny.file_name
    async with (
        running_server(path, tmp_path / "server.log", "--embeddings") as server,
        aiohttp.ClientSession(server.url) as http,
    ):
        body = {"input": ["hello world", "the cat sat"], "model": "demo-tiny"}
        answer = await post_json(http, "/v1/embeddings", body)
    vectors = [d["embedding"] for d in answer["data"]]
    assert len(vectors) == 2
    assert all(len(v) == tiny.n_embd for v in vectors)
    assert vectors[0] != vectors[1]
