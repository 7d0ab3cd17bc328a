"""Google Cloud Vertex AI's settings and request formats, as llama.cpp b11434 reads them."""

from __future__ import annotations

from pathlib import Path

import pytest

from node_agent.api.state import PROXIED_POST
from node_agent.api.vertex import Vertex, _aliases, request_format, vertex_from_env
from node_agent.child.spawn import ChildConfig, child_environment
from node_agent.config import parse_agent_args
from node_agent.errors import ConfigError
from node_agent.serve import with_vertex


def test_vertex_is_on_only_in_prediction_mode() -> None:
    assert vertex_from_env({}) is None
    assert vertex_from_env({"AIP_MODE": "TRAINING"}) is None
    assert vertex_from_env({"AIP_MODE": "PREDICTION"}) == Vertex(port=8080)
    assert vertex_from_env(
        {
            "AIP_MODE": "PREDICTION",
            "AIP_HTTP_PORT": "9000",
            "AIP_PREDICT_ROUTE": "v1/p",
            "AIP_HEALTH_ROUTE": "/hz",
        }
    ) == Vertex(port=9000, predict_route="/v1/p", health_route="/hz")
    with pytest.raises(ConfigError, match="AIP_HTTP_PORT='x' is not a port number"):
        vertex_from_env({"AIP_MODE": "PREDICTION", "AIP_HTTP_PORT": "x"})


def test_aip_http_port_replaces_the_port() -> None:
    options = parse_agent_args(["--port", "8081"], {})
    assert with_vertex(options, {}).port == 8081
    assert with_vertex(options, {"AIP_MODE": "PREDICTION", "AIP_HTTP_PORT": "7000"}).port == 7000


@pytest.mark.parametrize(
    ("path", "alias"),
    [
        ("/v1/chat/completions", "chatCompletions"),
        ("/apply-template", "applyTemplate"),
        ("/v1/responses/input_tokens", "responsesInputTokens"),
        ("/slots/{id_slot}", "slots"),
        ("/completion", "completion"),
    ],
)
def test_request_formats_are_camel_case_paths(path: str, alias: str) -> None:
    assert request_format(path) == alias


def test_the_v1_path_wins_a_shared_alias() -> None:
    aliases = _aliases(PROXIED_POST)
    assert aliases["embeddings"] == "/v1/embeddings"
    assert aliases["chatCompletions"] == "/v1/chat/completions"
    assert aliases["embedding"] == "/embedding"


def test_children_do_not_inherit_aip_mode() -> None:
    config = ChildConfig(name="m", binary=Path("/x"), args=())
    env = child_environment(config, {"AIP_MODE": "PREDICTION", "AIP_HTTP_PORT": "1", "X": "y"})
    assert "AIP_MODE" not in env and env["X"] == "y"
