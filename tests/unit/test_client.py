"""The ``corral`` client's pure parts: the --url it accepts, the "no such model" text, and
the tables ``models`` and ``status`` make of what an agent answers."""

from __future__ import annotations

import argparse
import io
import json
from collections.abc import Callable

import pytest

from node_agent.client import AgentClient, AgentError, cmd_models, cmd_status
from node_agent.client_format import KNOWN_NAMES_SHOWN, unknown_model
from node_agent.client_transport import BadUrl, agent_url
from tests.unit.test_preset_clashes import entry


@pytest.mark.parametrize(
    ("given", "url"),
    [
        ("localhost:8080", "http://localhost:8080"),
        ("127.0.0.1:8080/", "http://127.0.0.1:8080"),
        ("http://h:1", "http://h:1"),
        ("https://agent.example/corral", "https://agent.example/corral"),
        ("[::1]:8080", "http://[::1]:8080"),
        ("unix:///run/corral.sock", "unix:///run/corral.sock"),
    ],
)
def test_agent_url(given: str, url: str) -> None:
    assert agent_url(given) == url


@pytest.mark.parametrize(
    ("given", "says"),
    [
        ("ftp://h:1", "the agent speaks http://, https:// or unix://, not ftp://"),
        ("h:port", "Port could not be cast to integer value"),
        ("http://", "names no host"),
        ("", "names no host"),
        ("unix://", "names no socket"),
    ],
)
def test_bad_agent_url(given: str, says: str) -> None:
    with pytest.raises(BadUrl, match=says):
        agent_url(given)


def test_unknown_model_names_the_models() -> None:
    assert unknown_model("x", ["a", "b"]) == "the agent has no model named 'x'; its models: a, b"


def test_unknown_model_bounds_the_list() -> None:
    names = [f"m{i:03}" for i in range(KNOWN_NAMES_SHOWN + 5)]
    text = unknown_model("x", names)
    assert text.endswith(f"m{KNOWN_NAMES_SHOWN - 1:03} and 5 more (`corral models` lists them all)")
    assert f"m{KNOWN_NAMES_SHOWN:03}" not in text


def test_unknown_model_on_an_agent_without_models() -> None:
    assert "it has no models at all (check its --models-dir" in unknown_model("x", [])


def test_the_ledger_table_adds_up() -> None:
    """CAPACITY = OTHER + MODELS + AVAILABLE, with the ledger's own "other" (issue 29: the
    raw external use was shown, 1.6 GiB of a 24 GiB machine under a 2 GiB limit)."""
    from node_agent.client_format import ledger_table

    mib, gib = 1024**2, 1024**3
    device = {
        "name": "host",
        "total": 24 * gib,
        "limit": 2 * gib,
        "external": 1600 * mib,
        "capacity": 2 * gib,
        "other": 0,
        "held": {"m": 160 * mib},
        "available": 2 * gib - 160 * mib,
        "margin": 512 * mib,
    }
    _, row = ledger_table({"devices": [device]}).splitlines()
    assert row.split() == [
        "host",
        "2.0",
        "GiB",
        "0",
        "B",
        "160.0",
        "MiB",
        "1.8",
        "GiB",
        "512.0",
        "MiB",
    ]


class _Agent(AgentClient):
    """GET /models and /props as given; GET /api/ps answers ``ps`` (an int: that error; a
    string: that body)."""

    def __init__(self, ps: object) -> None:
        super().__init__("http://127.0.0.1:1", None)
        self._ps = ps

    def call(self, method: str, path: str, body: object = None) -> object:
        if path == "/models":
            return {
                "object": "list",
                "data": [entry("m", "models_dir"), entry("n", "models_dir", "unloaded")],
            }
        if path == "/props":
            return {"role": "router", "max_instances": 4}
        if path == "/ledger":
            raise AgentError(404, "File Not Found")
        assert path == "/api/ps", path
        if isinstance(self._ps, int):
            raise AgentError(self._ps, "no")
        if isinstance(self._ps, str):
            return json.loads(self._ps)  # as AgentClient.call reads a body
        return self._ps


@pytest.mark.parametrize("command", [cmd_models, cmd_status])
@pytest.mark.parametrize("answer", [404, 401, 403, 500, 502, "<html>a proxy's page</html>"])
def test_models_and_status_list_the_models_whatever_api_ps_answers(
    command: Callable[..., int], answer: int | str
) -> None:
    """The process's memory is an extra of the table: an agent without /api/ps (llama.cpp's
    router: 404, or 401 where only its GET /models is public, as in the pinned build), a proxy
    in front of it that passes only some routes (403, 502, a page of its own), or an /api/ps
    that failed (500) leave it '-'; they made the whole command fail (the page with a
    traceback), where it had listed the models."""
    out = io.StringIO()
    assert command(_Agent(answer), argparse.Namespace(json=False), out) == 0
    (row,) = [line for line in out.getvalue().splitlines() if line.startswith("m ")]
    assert row.split()[:4] == ["m", "loaded", "-", "-"], row


def test_models_give_a_running_models_process_memory_with_the_ledger_off() -> None:
    ps = {"models": [{"name": "m", "corral": {"memory": 6 * 1024**2}}]}
    out = io.StringIO()
    assert cmd_models(_Agent(ps), argparse.Namespace(json=False), out) == 0
    rows = {line.split()[0]: line for line in out.getvalue().splitlines()}
    assert "  process 6.0 MiB  " in rows["m"], rows["m"]
    assert "process" not in rows["n"], rows["n"]


def test_a_downloads_detail_gives_bytes_then_speed_and_time_left() -> None:
    from node_agent.client_ops import download_detail

    assert download_detail(0, 5 << 20, None) == "0 B of 5.0 MiB"
    detail = download_detail(1 << 20, 5 << 20, float(1 << 20))
    assert detail == "1.0 MiB of 5.0 MiB, 1.0 MiB/s, 4s left"
    assert download_detail(5 << 20, 5 << 20, float(1 << 20)) == "5.0 MiB of 5.0 MiB"


def test_a_downloads_rate_is_measured_over_its_last_seconds() -> None:
    from node_agent.client_ops import RATE_SECONDS, Rate

    rate = Rate()
    assert rate.add(0.0, 0) is None  # one report: no speed yet
    assert rate.add(1.0, 100) == 100.0
    assert rate.add(2.0, 200) == 100.0
    # A burst long ago no longer counts once the window has moved past it.
    later = 2.0 + RATE_SECONDS + 1
    assert rate.add(later, 1200) == pytest.approx((1200 - 200) / (later - 2.0))
    # From the newest report at least RATE_SECONDS old: the window never shrinks below it.
    assert rate.add(later + 1, 1210) == pytest.approx((1210 - 200) / (later + 1 - 2.0))


def test_llama_cpps_start_it_with_gets_the_preset_key() -> None:
    from node_agent.api.replies import child_error_with_fix, with_preset_fix

    said = "This server does not support embeddings. Start it with `--embeddings`"
    fixed = with_preset_fix(said, "demo-tiny")
    assert fixed.startswith(said)
    assert "set `embeddings = true` in the preset of model 'demo-tiny'" in fixed
    assert with_preset_fix("Infill is not supported by this model: x", "m") == (
        "Infill is not supported by this model: x"
    )
    body = b'{"error":{"code":501,"message":"' + said.encode() + b'","type":"not_supported_error"}}'
    rewritten = json.loads(child_error_with_fix(body, "demo-tiny"))["error"]
    assert rewritten["code"] == 501 and rewritten["type"] == "not_supported_error"
    assert rewritten["message"] == fixed
    assert child_error_with_fix(b"not json", "m") == b"not json"
