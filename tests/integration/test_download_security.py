"""Issue 16, rows 9 and 10, reproduced against the real agent: downloads that redirect to
another host, never end or stall, and secrets (an HF token, URL user-info, a signed query)
that must not show in ``GET /models``, error bodies, the agent's log or its metrics."""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.integration.harness import AgentProcess, chat, http
from tests.integration.hf_server import HubServer, start_hub

Start = Callable[..., AgentProcess]
FILE = "corral-test/tiny/resolve/main/tiny-Q8_0.gguf"


@pytest.fixture
def hub(demo_dir: Path) -> Iterator[HubServer]:
    server = start_hub()
    server.add("corral-test/tiny", {"tiny-Q8_0.gguf": (demo_dir / "demo-tiny.gguf").read_bytes()})
    yield server
    server.close()


@pytest.fixture
def elsewhere() -> Iterator[HubServer]:
    """Another host: where an attacker's redirect points."""
    server = start_hub()
    yield server
    server.close()


def preset(tmp_path: Path, url: str, sha256: str) -> Path:
    path = tmp_path / "presets.ini"
    path.write_text(f"[m]\nmodel-url = {url}\nmodel-sha256 = {sha256}\n")
    return path


def load_error(agent: AgentProcess) -> dict[str, object]:
    status, body = agent.post("/v1/chat/completions", chat("m"), timeout=120)
    assert status == 500, body
    error: dict[str, object] = body["error"]
    return error


def sha(demo_dir: Path) -> str:
    return hashlib.sha256((demo_dir / "demo-tiny.gguf").read_bytes()).hexdigest()


# -- row 9: downloads ------------------------------------------------------------------------


def test_row9_a_redirect_to_another_host_is_not_followed(
    start_agent: Start, tmp_path: Path, hub: HubServer, elsewhere: HubServer, demo_dir: Path
) -> None:
    # "localhost" is another host name than the 127.0.0.1 the preset names.
    hub.redirect = elsewhere.url.replace("127.0.0.1", "localhost")
    ini = preset(tmp_path, f"{hub.url}/{FILE}", sha(demo_dir))
    agent = start_agent("--models-preset", str(ini), env={"LLAMA_CACHE": str(tmp_path / "c")})

    error = load_error(agent)

    assert elsewhere.requests == []  # never contacted
    reason = str(error["corral"])
    assert "redirects to another host (localhost), which is not allowed" in reason


def test_row9_an_endless_body_stops_at_the_size_cap(
    start_agent: Start, tmp_path: Path, hub: HubServer, demo_dir: Path
) -> None:
    hub.endless = True  # no Content-Length, and it never ends
    cache = tmp_path / "c"
    ini = preset(tmp_path, f"{hub.url}/{FILE}", sha(demo_dir))
    agent = start_agent(
        "--models-preset", str(ini), "--max-download-size", "2MiB", env={"LLAMA_CACHE": str(cache)}
    )

    error = load_error(agent)

    assert "the body is larger than allowed (2097152 bytes)" in str(error["corral"])
    assert sum(p.stat().st_size for p in cache.iterdir()) == 0  # nothing kept past the cap


def test_row9_the_load_timeout_bounds_a_stalled_download(
    start_agent: Start, tmp_path: Path, hub: HubServer, demo_dir: Path
) -> None:
    hub.hold(100_000)  # the body stalls a tenth of the way in
    ini = preset(tmp_path, f"{hub.url}/{FILE}", sha(demo_dir))
    agent = start_agent(
        "--models-preset", str(ini), "--load-timeout", "3", env={"LLAMA_CACHE": str(tmp_path / "c")}
    )

    error = load_error(agent)

    assert "took longer than --load-timeout (3 s)" in str(error["corral"])
    hub.release()


def test_row9_errors_say_neither_the_remote_status_nor_the_body_hash(
    start_agent: Start, tmp_path: Path, hub: HubServer, demo_dir: Path
) -> None:
    wrong = "0" * 64
    ini = tmp_path / "presets.ini"
    ini.write_text(
        f"[m]\nmodel-url = {hub.url}/{FILE}\nmodel-sha256 = {wrong}\n\n"
        f"[gone]\nmodel-url = {hub.url}/corral-test/tiny/resolve/main/nope.gguf\n"
        f"model-sha256 = {wrong}\n"
    )
    agent = start_agent("--models-preset", str(ini), env={"LLAMA_CACHE": str(tmp_path / "c")})

    mismatch = str(load_error(agent))
    status, body = agent.post("/v1/chat/completions", chat("gone"), timeout=120)
    missing = str(body)

    assert "checksum mismatch" in mismatch
    assert sha(demo_dir) not in mismatch and wrong not in mismatch  # the expected one is ours
    assert status == 500 and "404" not in missing
    _, models = agent.get("/models")
    assert sha(demo_dir) not in str(models)


# -- row 10: secrets -------------------------------------------------------------------------

TOKEN = "hf_" + "S3cretT0ken" * 4
USER, PASSWORD = "alice", "pa55word-xyz"
SIGNATURE, CREDENTIAL = "f00dfeedsig1234567890", "AKIAEXAMPLE0123"


def test_row10_secrets_show_nowhere(
    start_agent: Start, tmp_path: Path, hub: HubServer, demo_dir: Path
) -> None:
    host = hub.url.removeprefix("http://")
    url = (
        f"http://{USER}:{PASSWORD}@{host}/corral-test/tiny/resolve/main/nope.gguf"
        f"?X-Amz-Credential={CREDENTIAL}&X-Amz-Signature={SIGNATURE}"
    )
    ini = tmp_path / "presets.ini"
    ini.write_text(
        f"[m]\nmodel-url = {url}\nmodel-sha256 = {sha(demo_dir)}\n\n[child]\nmodel-url = {url}\n"
    )
    agent = start_agent(
        "--models-preset",
        str(ini),
        "--hf-token",
        TOKEN,
        "--metrics",
        env={"LLAMA_CACHE": str(tmp_path / "c")},
    )

    shown = {
        "GET /models": str(agent.get("/models")[1]),
        "error body (agent download)": str(agent.post("/v1/chat/completions", chat("m"))[1]),
        "error body (child download)": str(
            agent.post("/v1/chat/completions", chat("child"), timeout=120)[1]
        ),
        "metrics": str(http("GET", agent.url + "/metrics")[1]),
        "GET /models after": str(agent.get("/models")[1]),
    }
    agent.stop()
    shown["agent log"] = agent.log()

    for where, text in shown.items():
        for secret in (TOKEN, PASSWORD, SIGNATURE, CREDENTIAL):
            assert secret not in text, f"{where} shows {secret!r}"
    assert re.search(r"http://\*\*\*@", shown["GET /models"])  # redacted, not dropped
    assert "--hf-token" in shown["GET /models"]
