"""What a browser may do: llama.cpp's CORS rules, the Host check, cross-site simple POSTs."""

from __future__ import annotations

import pytest

from node_agent.api.browser_guard import (
    BrowserPolicy,
    allow_origin,
    allowed_hosts,
    cors_origins_default,
    cross_site_load,
    cross_site_proxy,
    cross_site_simple,
    host_allowed,
    origin_is_localhost,
    start_warnings,
)
from node_agent.api.form_fields import multipart_fields
from node_agent.config import parse_agent_args
from node_agent.startup import browser_policy


@pytest.mark.parametrize(
    ("origin", "local"),
    [
        ("http://localhost", True),
        ("http://localhost:5173", True),
        ("https://127.0.0.1:8443", True),
        ("http://[::1]:8080", True),
        ("http://localhost/", True),
        ("http://localhost.evil.com", False),
        ("http://notlocalhost", False),
        ("http://127.0.0.1.evil.com", False),
        ("http://[::1", False),  # llama.cpp's parser throws: not local
        ("http://localhost:abc", False),  # std::stoi throws
        ("http://localhost:2147483648", False),  # ... past an int
        ("http://localhost:" + "1" * 5000, False),  # ... (Python's int() would raise)
        ("http://localhost:" + "0" * 5000 + "80", True),  # stoi reads 80
        ("http://localhost:-80", True),
        ("ftp://localhost", False),
        ("localhost", False),
        ("null", False),
        ("", False),
    ],
)
def test_localhost_origins_are_the_loopback_ones_on_any_port(origin: str, local: bool) -> None:
    assert origin_is_localhost(origin) is local


def test_allow_origin_follows_llama_cpps_rules() -> None:
    anyone = BrowserPolicy()
    assert allow_origin(anyone, "http://evil.example") == "http://evil.example"
    assert allow_origin(anyone, "") == ""  # llama.cpp echoes even a missing one
    assert allow_origin(BrowserPolicy(credentials=False), "http://evil.example") == "*"
    local = BrowserPolicy(origins="localhost")
    assert allow_origin(local, "http://localhost:3000") == "http://localhost:3000"
    assert allow_origin(local, "http://localhost.evil.com") is None
    assert allow_origin(local, "") is None
    one = BrowserPolicy(origins="http://app.example")
    assert allow_origin(one, "http://evil.example") == "http://app.example"  # as llama.cpp
    listed = BrowserPolicy(origins="http://a.example, http://b.example")
    assert allow_origin(listed, "http://b.example") == "http://b.example"
    assert allow_origin(listed, "http://c.example") is None


def test_tools_make_localhost_the_default_origin() -> None:
    assert cors_origins_default(None, tools_enabled=False) == "*"
    assert cors_origins_default(None, tools_enabled=True) == "localhost"
    assert cors_origins_default("*", tools_enabled=True) == "*"  # an explicit choice stands
    options = parse_agent_args([], {})
    assert browser_policy(options, tools_enabled=True).origins == "localhost"
    assert browser_policy(options).origins == "*"


def test_the_cors_flags_and_their_env_names() -> None:
    policy = browser_policy(
        parse_agent_args(
            ["--cors-origins", "localhost", "--no-cors-credentials", "--cors-methods", "GET"],
            {"LLAMA_ARG_CORS_HEADERS": "Content-Type"},
        )
    )
    assert policy == BrowserPolicy(
        origins="localhost",
        methods="GET",
        headers="Content-Type",
        credentials=False,
        allowed_hosts=frozenset(),
    )
    assert not parse_agent_args(["--cors-origins", "x"], {}).child_options  # the router's own


def test_the_open_cors_warning_is_llama_cpps() -> None:
    assert start_warnings(BrowserPolicy(), ()) == [
        "security: no API key is set and CORS allows all origins "
        "(see https://github.com/ggml-org/llama.cpp/pull/25655)"
    ]
    assert start_warnings(BrowserPolicy(), ("key",)) == []
    assert start_warnings(BrowserPolicy(origins="localhost"), ()) == []


def test_the_host_check_is_on_for_a_loopback_bind_only() -> None:
    assert allowed_hosts(None, "127.0.0.1") == frozenset()
    assert allowed_hosts(None, "::1") == frozenset()
    assert allowed_hosts(None, "localhost") == frozenset()
    assert allowed_hosts(None, "0.0.0.0") is None
    assert allowed_hosts(None, "/run/corral.sock") is None
    assert allowed_hosts("Box.lan., other", "0.0.0.0") == frozenset({"box.lan", "other"})
    assert allowed_hosts("*", "127.0.0.1") is None


@pytest.mark.parametrize(
    ("host", "allowed"),
    [
        ("localhost:8080", True),
        ("127.0.0.1:8080", True),
        ("[::1]:8080", True),
        ("10.1.2.3", True),  # an IP literal cannot be rebound
        ("app.localhost:9", True),
        ("LOCALHOST.", True),
        ("box.lan:8080", True),
        ("evil.rebind.example:8080", False),
        ("localhost.evil.com", False),
        (None, True),  # HTTP/1.0 without Host: not a browser
    ],
)
def test_host_names_answered(host: str | None, allowed: bool) -> None:
    assert host_allowed(frozenset({"box.lan"}), host) is allowed
    assert host_allowed(None, host) is True


def post(headers: dict[str, str], path: str = "/models/unload") -> str | None:
    return cross_site_simple("POST", path, {"Host": "127.0.0.1:8080", **headers}, "http")


def test_cross_site_simple_posts_are_refused() -> None:
    evil = {"Origin": "http://evil.example"}
    assert post({**evil, "Content-Type": "text/plain;charset=UTF-8"}) is not None
    assert post({**evil, "Content-Type": "application/x-www-form-urlencoded"}) is not None
    assert post({**evil, "Content-Type": "multipart/form-data; boundary=x"}) is not None
    assert post(evil) is not None  # no body, no type
    assert post({"Origin": "null", "Content-Type": "text/plain"}) is not None
    assert post({"Sec-Fetch-Site": "same-site", "Content-Type": "text/plain"}) is not None
    # A same-site page on another port is another origin.
    assert post({"Origin": "http://127.0.0.1:3000", "Content-Type": "text/plain"}) is not None
    assert post({"Origin": "http://127.0.0.1", "Content-Type": "text/plain"}) is not None


def test_another_sites_page_cannot_use_the_cors_proxy() -> None:
    local = BrowserPolicy(origins="localhost")
    host = {"Host": "127.0.0.1:8080"}

    def refused(policy: BrowserPolicy, headers: dict[str, str]) -> bool:
        return cross_site_proxy(policy, {**host, **headers}, "http") is not None

    assert refused(local, {"Origin": "http://evil.example"})  # an origin CORS does not allow
    assert refused(BrowserPolicy(), {"Sec-Fetch-Site": "cross-site"})  # even with `*`
    assert refused(local, {"Origin": "http://localhost:5173", "Sec-Fetch-Site": "cross-site"})
    assert not refused(local, {})  # not a browser (curl)
    assert not refused(local, {"Origin": "http://127.0.0.1:8080", "Sec-Fetch-Site": "same-origin"})
    assert not refused(local, {"Origin": "http://localhost:5173", "Sec-Fetch-Site": "same-site"})
    assert not refused(BrowserPolicy(), {"Origin": "http://client.example"})  # `*` allows it


def test_another_sites_page_cannot_load_a_model_with_a_get() -> None:
    # Issue 26, row 20: `<img src=".../props?model=X&autoload=1">` on another site loaded X.
    local = BrowserPolicy(origins="localhost")
    listed = BrowserPolicy(origins="https://app.example, https://ops.example")
    host = {"Host": "127.0.0.1:8080"}

    def refused(policy: BrowserPolicy, headers: dict[str, str]) -> bool:
        return cross_site_load(policy, {**host, **headers}, "http") is not None

    assert refused(local, {"Sec-Fetch-Site": "cross-site"})  # an <img>: no Origin
    assert refused(local, {"Origin": "http://evil.example", "Sec-Fetch-Site": "cross-site"})
    assert refused(listed, {"Origin": "https://evil.example"})
    assert not refused(listed, {"Origin": "https://ops.example", "Sec-Fetch-Site": "cross-site"})
    assert not refused(local, {"Origin": "http://localhost:5173", "Sec-Fetch-Site": "same-site"})
    assert not refused(local, {"Sec-Fetch-Site": "same-origin"})  # the agent's own pages
    assert not refused(local, {"Sec-Fetch-Site": "none"})  # typed in the address bar
    assert not refused(local, {})  # not a browser (curl)
    assert not refused(BrowserPolicy(), {"Sec-Fetch-Site": "cross-site"})  # `*`: any site may


def test_what_is_not_a_cross_site_simple_post() -> None:
    evil = {"Origin": "http://evil.example"}
    assert post({**evil, "Content-Type": "application/json"}) is None  # preflighted
    assert post({"Content-Type": "application/x-www-form-urlencoded"}) is None  # curl -d
    assert post({"Content-Type": "text/plain"}) is None  # no browser sends no Origin
    assert post({"Origin": "http://127.0.0.1:8080", "Content-Type": "text/plain"}) is None
    assert post({**evil, "Sec-Fetch-Site": "same-origin", "Content-Type": "text/plain"}) is None
    audio = {**evil, "Content-Type": "multipart/form-data; boundary=x"}
    assert post(audio, "/v1/audio/transcriptions") is None  # the endpoint's own format
    assert cross_site_simple("DELETE", "/models", evil, "http") is None  # needs a preflight
    assert (
        cross_site_simple(
            "POST",
            "/x",
            {"Host": "h", "Origin": "http://h:80", "Content-Type": "text/plain"},
            "http",
        )
        is None
    )


def test_multipart_text_fields_as_llama_cpp_reads_them() -> None:
    body = (
        b'--b\r\nContent-Disposition: form-data; name="model"\r\n\r\ndemo-tiny\r\n'
        b'--b\r\nContent-Disposition: form-data; name="x"\r\n\r\n1\r\n'
        b'--b\r\nContent-Disposition: form-data; name="x"\r\n\r\n2\r\n'
        b'--b\r\nContent-Disposition: form-data; name="file"; filename="a.wav"\r\n'
        b"Content-Type: audio/wav\r\n\r\nRIFF\x00\xff\r\n--b--\r\n"
    )
    assert multipart_fields("multipart/form-data; boundary=b", body) == {
        "model": "demo-tiny",
        "x": ["1", "2"],
    }
    assert multipart_fields("multipart/form-data; boundary=b", b"garbage") == {}


def test_a_refusal_echoes_a_clients_origin_short() -> None:
    # Issue 26: a client's header text is clipped where it is echoed (node_agent.clip).
    origin = "http://" + "a." * 16_000
    for why in (
        cross_site_load(BrowserPolicy(origins="localhost"), {"Origin": origin}, "http"),
        cross_site_proxy(BrowserPolicy(origins="localhost"), {"Origin": origin}, "http"),
    ):
        assert why is not None and "(32007 characters)" in why and len(why) < 1000
