"""Only llama.cpp's bare "no such path" 404 from a child becomes the error naming its binary."""

from __future__ import annotations

import json

from aiohttp import web

from node_agent.api.missing_endpoint import NOT_FOUND, endpoint_missing

BUILD, BINARY = "b1-7e4c0a9", "/opt/llama-server"


def answer(status: int, body: object) -> web.Response:
    return web.Response(status=status, body=json.dumps(body, separators=(",", ":")).encode())


def test_a_bare_404_names_the_binary() -> None:
    error = endpoint_missing(answer(404, NOT_FOUND), "POST", "/v1/systemone", BUILD, BINARY)
    assert error is not None and error.status == 404
    assert error.message.startswith(
        "POST /v1/systemone is not served by llama-server b1-7e4c0a9 (/opt/llama-server)"
    )


def test_other_answers_pass_through() -> None:
    request = ("POST", "/slots/{id_slot}")
    own_404 = {"error": {"code": 404, "message": "slot not found", "type": "not_found_error"}}
    assert endpoint_missing(answer(404, own_404), *request, BUILD, BINARY) is None
    assert endpoint_missing(answer(200, NOT_FOUND), *request, BUILD, BINARY) is None
    assert endpoint_missing(web.StreamResponse(status=404), *request, BUILD, BINARY) is None
