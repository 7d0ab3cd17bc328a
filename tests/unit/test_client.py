"""The ``corral`` client's pure parts: the --url it accepts and the "no such model" text."""

from __future__ import annotations

import pytest

from node_agent.client_format import KNOWN_NAMES_SHOWN, unknown_model
from node_agent.client_transport import BadUrl, agent_url


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
