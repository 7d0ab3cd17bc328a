"""Fuzzing what a client or a preset file can feed the agent: only the documented errors come out.

* The model a proxied POST names (``parse_json_body`` then ``body_model``, the two steps
  ``proxy_post`` takes): a name, none, or ``ApiError`` 400 with the parser's message — never
  anything else, whatever the bytes (a crash there would be a 500 for the client's mistake).
* Error bodies echo the model name back: any name, lone surrogates included, still makes a
  valid JSON answer.
* ``parse_preset_text``: any text either parses or raises ``ConfigError`` that names the file
  and line — never ``ValueError``, ``IndexError``, ``KeyError``…
"""

from __future__ import annotations

import json
from typing import Any

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from node_agent.api.app import given_api_key, key_matches
from node_agent.api.bodies import body_model, parse_json_body
from node_agent.api.replies import error_response
from node_agent.errors import ApiError, ConfigError
from node_agent.sources.options import llama_options
from node_agent.sources.preset_ini import AGENT_KEYS, PRESET_ONLY, ROUTER_KEYS, parse_preset_text

NOT_JSON = "the request body is not valid JSON: "
# As many examples as the profile says (tests/conftest.py): the paths are few, and the
# explicit examples cover the edges.
FUZZ = settings(suppress_health_check=[HealthCheck.too_slow])

# -- request bodies ----------------------------------------------------------------------------

# Small, shallow documents: the parsing paths are few, and generating deep ones (st.recursive)
# would spend the time budget on the generator rather than on the code under test.
json_scalars = st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=10)
json_values = (
    json_scalars
    | st.lists(json_scalars, max_size=3)
    | st.dictionaries(st.text(max_size=4), json_scalars, max_size=2)
)
model_values = json_scalars | st.text() | st.sampled_from(["", "demo-tiny", "../x", "a\x00b"])


@st.composite
def documents(draw: st.DrawFn) -> tuple[bytes, Any, bool]:
    """A JSON body, often an object with ``model``, encoded the ways clients encode it.

    The flag says whether the text could be encoded as it is: a lone surrogate written raw
    (not as a ``\\ud800`` escape) makes bytes that are not valid UTF-8/16/32.
    """
    if draw(st.booleans()):
        doc: Any = draw(st.dictionaries(st.text(max_size=4), json_values, max_size=2))
        doc["model"] = draw(model_values)
    else:
        doc = draw(json_values)
    text = json.dumps(doc, ensure_ascii=draw(st.booleans()))
    # With a BOM or without: json.loads detects either.
    encoding = draw(st.sampled_from(["utf-8", "utf-16", "utf-16-le", "utf-32", "utf-32-be"]))
    try:
        return text.encode(encoding), doc, True
    except UnicodeEncodeError:
        return text.encode(encoding, "surrogatepass"), doc, False


def check_model(body: bytes) -> str | None:
    """The model ``proxy_post`` reads from ``body``, asserting the contract; None when it
    names none (``proxy_post`` answers "model name is missing") or is refused."""
    try:
        model = body_model(parse_json_body(body))
    except ApiError as exc:
        assert exc.status == 400
        assert exc.message.startswith(NOT_JSON)
        assert exc.body()["error"]["type"] == "invalid_request_error"
        return None
    assert model is None or (isinstance(model, str) and model)
    return model


@FUZZ
@given(st.binary(max_size=200))
@example(b"")
@example(b"[" * 100_000)
@example(b'{"model": "\xff"}')
@example(b"\xef\xbb\xbf{}")
@example(b'{"model": "x"' + b"1" * 5000)
@example(b'{"model": 1' + b"0" * 5000 + b"}")
def test_the_posted_model_on_any_bytes(body: bytes) -> None:
    check_model(body)


@FUZZ
@given(documents())
def test_the_posted_model_on_json_documents(encoded: tuple[bytes, Any, bool]) -> None:
    body, doc, clean = encoded
    model = check_model(body)
    named = doc.get("model") if isinstance(doc, dict) else None
    if not isinstance(named, str) or not named:
        assert model is None  # absent, empty, not a string, or the body is not an object
    elif clean:
        assert model == named


@FUZZ
@given(st.text())
@example("\ud800")
@example("\x00")
def test_error_bodies_echo_any_name_as_valid_json(name: str) -> None:
    error = ApiError(400, f"model '{name}' not found")
    response = error_response(error)
    assert response.body is not None
    assert json.loads(response.body) == error.body()


@given(st.text(max_size=12), st.lists(st.text(min_size=1, max_size=12), min_size=1, max_size=3))
def test_api_key_matches_exactly(given_key: str, keys: list[str]) -> None:
    assert key_matches(given_key, tuple(keys)) == (given_key in keys)
    assert given_api_key({"Authorization": f"Bearer {given_key}"}) == given_key


# -- preset INI --------------------------------------------------------------------------------

_KEYS = sorted(
    {flag.lstrip("-") for opt in llama_options() for flag in (*opt.flags, *opt.negatives)}
    | {opt.env for opt in llama_options() if opt.env}
    | {*PRESET_ONLY, *ROUTER_KEYS, *AGENT_KEYS, "version", "no-x", "a.b_c"}
)
_VALUES = ["", "true", "false", "on", "0", "1", "-1", "1e309", "nan", "x.gguf", "a, b,", " ; c"]
# Every known key with every tricky value, precomputed: one draw picks a line, where building
# it from parts would cost the generator most of the time budget.
_SETTINGS = [f"{k}{sep}{v}" for k in _KEYS for v in _VALUES for sep in ("=", " = ")]
line = st.one_of(
    st.sampled_from(_SETTINGS),
    st.sampled_from(_SETTINGS),  # twice: most lines of a real preset are settings
    st.builds("{} = {}".format, st.text(min_size=1, max_size=8), st.text(max_size=8)),
    st.text(max_size=20),  # anything at all
    st.sampled_from(["; note", "# note", "", "   ", "[", "]", "=", "[]", "[ ]", "[*]"]),
)
section_names = st.sampled_from(["*", "m", "demo-tiny", "org/repo:Q4_K_M", "", " m "])
section = st.builds(
    lambda name, body: [f"[{name}]", *body], section_names, st.lists(line, max_size=4)
)
# INI text that is mostly well-formed, so the fuzzing reaches the interpretation of keys.
preset_texts = st.builds(
    lambda sections, newline: newline.join(x for lines in sections for x in lines),
    st.lists(section, max_size=3),
    st.sampled_from(["\n", "\r\n", "\r"]),
)


def check_preset(text: str) -> None:
    try:
        parse_preset_text(text, "fuzz.ini")
    except ConfigError as exc:
        assert str(exc).startswith("fuzz.ini:"), exc  # names the file, and the line if any
        assert exc.path == "fuzz.ini"


@FUZZ
@given(preset_texts)
def test_preset_parser_on_ini_like_text(text: str) -> None:
    check_preset(text)


@FUZZ
@given(st.text())
@example("[\x00]\nmodel=\x00")
@example("[m]\nload-on-startup = maybe")
@example("[m]\nstop-timeout = -1")
@example("[m]\npriority = 1.5")
@example("[m]\u2028key = 1")  # str.splitlines() splits on U+2028 too
def test_preset_parser_on_any_text(text: str) -> None:
    check_preset(text)
