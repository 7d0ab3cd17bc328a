"""corral agent's command line: llama-server router flags, Corral's flags, child options."""

from __future__ import annotations

from pathlib import Path
from re import escape as re_escape

import pytest

from node_agent.config import AgentOptions, parse_agent_args, parse_size
from node_agent.core import stream_pace
from node_agent.errors import ConfigError


def parse(*argv: str, env: dict[str, str] | None = None) -> AgentOptions:
    return parse_agent_args(list(argv), env or {})


def test_defaults_match_llama_server() -> None:
    o = parse()
    assert (o.host, o.port, o.models_max, o.models_autoload) == ("127.0.0.1", 8080, 4, True)
    assert (o.timeout, o.sleep_idle_seconds, o.api_keys) == (3600, -1, ())
    assert o.models_dir is None and o.models_preset is None and o.child_options == ()
    assert o.models_memory_margin is None and o.memory_limits == ()


def test_drop_in_command_line() -> None:
    o = parse("--models-dir", "D", "--models-max", "2", "-c", "4096", "--host=0.0.0.0")
    assert (o.models_dir, o.models_max, o.host) == ("D", 2, "0.0.0.0")
    assert o.child_options == (("ctx-size", "4096"),)
    assert parse("--models-max", "0").models_max == 0  # unlimited, as in llama.cpp


def test_router_flags_from_env_and_command_line_wins() -> None:
    env = {
        "LLAMA_ARG_PORT": "9000",
        "LLAMA_ARG_MODELS_MAX": "7",
        "LLAMA_ARG_MODELS_AUTOLOAD": "false",
        "LLAMA_ARG_MODELS_DIR": "/env/models",
        "LLAMA_ARG_MODELS_PRESET": "/env/p.ini",
        "LLAMA_API_KEY": "k1,k2",
        "LLAMA_ARG_TIMEOUT": "30",
        "LLAMA_ARG_HOST": "::",
    }
    o = parse("--port", "9100", env=env)
    assert (o.port, o.models_max, o.models_autoload) == (9100, 7, False)
    assert (o.models_dir, o.models_preset, o.host, o.timeout) == (
        "/env/models",
        "/env/p.ini",
        "::",
        30,
    )
    assert o.api_keys == ("k1", "k2")
    assert parse("--models-autoload", env=env).models_autoload is True
    assert parse("--no-models-autoload").models_autoload is False


def test_api_keys_comma_separated_and_from_file(tmp_path: Path) -> None:
    f = tmp_path / "keys"
    f.write_text("# comment\nk3\n\n  k4  \n")
    o = parse("--api-key", "k1, k2", "--api-key-file", str(f))
    assert o.api_keys == ("k1", "k2", "k3", "k4")
    with pytest.raises(ConfigError, match=r"--api-key-file '.*nope' cannot be read"):
        parse("--api-key-file", str(tmp_path / "nope"))


@pytest.mark.parametrize("raw", [",", " ", " , ,"])
def test_an_api_key_list_with_no_key_is_an_error(raw: str, tmp_path: Path) -> None:
    # It would leave every endpoint open while the user believes it guarded (issue 16, row 11).
    with pytest.raises(ConfigError, match=r"--api-key '.*' holds no key"):
        parse("--api-key", raw)
    with pytest.raises(ConfigError, match=r"\$LLAMA_API_KEY '.*' holds no key"):
        parse_agent_args([], {"LLAMA_API_KEY": raw})
    empty = tmp_path / "keys"
    empty.write_text("# keys, one a line\n\n")
    with pytest.raises(ConfigError, match=r"--api-key-file '.*keys' holds no key"):
        parse("--api-key-file", str(empty))
    assert parse_agent_args([], {"LLAMA_API_KEY": ""}).api_keys == ()  # empty = unset


def test_a_metrics_key_from_a_file_and_the_environment_needs_an_api_key(tmp_path: Path) -> None:
    f = tmp_path / "scrape"
    f.write_text("# the scraper's\nm2\n")
    env = {"CORRAL_METRICS_KEY": "m1"}
    o = parse_agent_args(["--api-key", "k", "--metrics-key-file", str(f)], env)
    assert (o.api_keys, o.metrics_keys) == (("k",), ("m1", "m2"))
    # Without an API key /metrics is open to all: a metrics key would guard nothing.
    with pytest.raises(ConfigError, match=r"metrics key .* guards /metrics only behind an API"):
        parse_agent_args([], env)
    with pytest.raises(ConfigError, match=r"--metrics-key-file '.*nope' cannot be read"):
        parse("--api-key", "k", "--metrics-key-file", str(tmp_path / "nope"))
    assert parse_agent_args([], {"CORRAL_METRICS_KEY": ""}).metrics_keys == ()  # empty = unset


def test_corral_flags() -> None:
    o = parse(
        "--llama-server", "/bin/ls",
        "--models-memory-margin", "1024",
        "--memory-limit", "host=8GiB",
        "--memory-limit", "cuda0=20G",
        "--models-ttl", "600",
        "--queue-timeout", "30.5",
        "--max-queue", "100",
        "--log-level", "DEBUG",
    )  # fmt: skip
    assert o.llama_server == "/bin/ls"
    assert o.models_memory_margin == 1024
    assert o.memory_limits == (("host", 8 * 2**30), ("cuda0", 20 * 10**9))
    assert (o.models_ttl, o.queue_timeout, o.max_queue, o.log_level) == (600.0, 30.5, 100, "debug")
    assert parse("--models-ttl", "0", "--max-queue", "0").models_ttl is None
    # Durations as keep_alive takes them (issue 29); -1 is never, like 0.
    assert [parse("--models-ttl", t).models_ttl for t in ("10m", "1h", "-1")] == [600, 3600, None]


def test_stream_gather_takes_a_short_duration(monkeypatch: pytest.MonkeyPatch) -> None:
    assert parse().stream_gather == (0.01 if stream_pace.SUPPORTED else 0.0)
    monkeypatch.setattr(stream_pace, "SUPPORTED", True)
    assert [parse("--stream-gather", t).stream_gather for t in ("5ms", "0.02", "0", "1s")] == [
        0.005, 0.02, 0.0, 1.0
    ]  # fmt: skip
    for bad, why in (("2s", "must be at most 1s"), ("-1", "must be >= 0"), ("soon", "10ms or")):
        with pytest.raises(ConfigError, match=f"--stream-gather .*{re_escape(why)}"):
            parse("--stream-gather", bad)
    monkeypatch.setattr(stream_pace, "SUPPORTED", False)  # (macOS, Windows)
    assert parse("--stream-gather", "0").stream_gather == 0.0
    with pytest.raises(ConfigError, match=r"--stream-gather .*works on Linux only"):
        parse("--stream-gather", "10ms")


def test_sizes() -> None:
    assert parse_size("512MiB") == 512 * 2**20
    assert parse_size("1.5 GiB") == int(1.5 * 2**30)
    assert parse_size("20G") == 20 * 10**9
    assert parse_size("4Gi") == 4 * 2**30
    for bad in ("8", "8XB", "GiB", "-1GiB"):
        with pytest.raises(ValueError):
            parse_size(bad)


def test_child_options_flags_negatives_and_order() -> None:
    o = parse(
        "--no-repack", "-ngl", "99", "--temp", "0.2", "-nocb", "--jinja", "-c", "1", "-c", "2"
    )
    assert o.child_options == (
        ("repack", False),
        ("n-gpu-layers", "99"),
        ("temperature", "0.2"),
        ("cont-batching", False),
        ("jinja", True),
        ("ctx-size", "2"),  # the last one wins, at its first position
    )


def test_child_option_values_are_checked_but_passed_on_as_written() -> None:
    o = parse("-c", "8192", "--temp", ".7", "-ngl", "all", "-fa", "true", "-ctk", "q8_0")
    assert o.child_options == (
        ("ctx-size", "8192"),
        ("temperature", ".7"),
        ("n-gpu-layers", "all"),
        ("flash-attn", "true"),
        ("cache-type-k", "q8_0"),
    )
    # Text and paths are llama-server's to judge.
    assert parse("--lora", "a.gguf,b.gguf", "-ts", "3,1").child_options == (
        ("lora", "a.gguf,b.gguf"),
        ("tensor-split", "3,1"),
    )


def test_timeout_and_sleep_also_reach_children() -> None:
    o = parse("-to", "60", "--sleep-idle-seconds", "300")
    assert (o.timeout, o.sleep_idle_seconds) == (60, 300)
    assert o.child_options == (("timeout", "60"), ("sleep-idle-seconds", "300"))


def test_help_and_version_are_reported_not_passed_on() -> None:
    assert parse("-h").show_help and parse("--help").show_help and parse("--version").show_version


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (
            ["--peers-from-service", "Agents"],
            "--peers-from-service expects a Service, [NAMESPACE/]NAME, got 'Agents' (lower-case",
        ),
        (["--peers-from-service", "a/b/c"], "got 'a/b/c'"),
        (["--peers-from-service", "ns/"], "got 'ns/'"),
        (
            ["--peers-from-service", "s", "--kube-api", "127.0.0.1:8001"],
            "--kube-api expects the Kubernetes API's URL, got '127.0.0.1:8001' (e.g. http://",
        ),
        (
            ["--kube-api", "http://127.0.0.1:8001"],
            "--kube-api is only used by --peers-from-service",
        ),
    ],
)
def test_a_bad_service_or_api_says_what_is_expected(argv: list[str], message: str) -> None:
    with pytest.raises(ConfigError, match=re_escape(message)):
        parse(*argv)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (
            ["--peer-ca-file", "ca.crt"],
            "--peer-ca-file checks peers asked over HTTPS, and there is none: give --peer "
            "https://HOST:PORT, or --peers-from-service with --ssl-cert-file",
        ),
        (
            ["--peer", "http://a:1", "--peer-server-name", "agents.corral.svc"],
            "--peer-server-name checks peers asked over HTTPS, and there is none",
        ),
        (  # discovered peers are HTTPS only when this agent serves HTTPS itself
            ["--peers-from-service", "s", "--peer-ca-file", "ca.crt"],
            "--peer-ca-file checks peers asked over HTTPS",
        ),
        (
            ["--peer", "https://a:1", "--peer-server-name", "not a name"],
            "--peer-server-name expects a DNS name, got 'not a name' (a DNS name, e.g. ",
        ),
        (["--peer", "https://a:1", "--peer-server-name", "a..b"], "got 'a..b'"),
        (  # ssl would read an empty path as "none given" and trust the system's CAs
            ["--peer", "https://a:1", "--peer-ca-file", ""],
            "--peer-ca-file expects a PEM file of CA certificates, got '' (the path is empty)",
        ),
    ],
)
def test_peer_tls_flags_without_https_peers_or_with_a_bad_name_are_refused(
    argv: list[str], message: str
) -> None:
    with pytest.raises(ConfigError, match=re_escape(message)):
        parse(*argv)


def test_peer_tls_flags_check_https_peers_given_or_discovered() -> None:
    given = parse("--peer", "https://a:1", "--peer-ca-file", "ca.crt", "--peer-server-name", "X.Y")
    assert (given.peer_ca_file, given.peer_server_name) == ("ca.crt", "x.y")
    upper = parse("--peer", "HTTPS://a:1", "--peer-ca-file", "ca.crt")  # as aiohttp takes it
    assert upper.peer_ca_file == "ca.crt"
    tls = ("--ssl-cert-file", "c.pem", "--ssl-key-file", "k.pem")
    found = parse("--peers-from-service", "s", *tls, "--peer-server-name", "s.ns.svc")
    assert found.peer_server_name == "s.ns.svc"


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ("10.0.0.2:8080", "--peer expects another agent's URL, http(s)://HOST:PORT, got"),
        ("http://10.0.0.2", "http(s)://HOST:PORT, got 'http://10.0.0.2'"),
        ("ftp://a:1", "got 'ftp://a:1'"),
        ("http://a:99999", "got 'http://a:99999'"),
        ("http://a:1/v1", "--peer 'http://a:1/v1': give only http(s)://HOST:PORT"),
        ("http://a:1?x=1", "no path or query"),
    ],
)
def test_a_bad_peer_url_says_what_is_expected(raw: str, message: str) -> None:
    with pytest.raises(ConfigError, match=re_escape(message)):
        parse("--peer", raw)


def test_warm_cache_size_takes_a_size_or_0_for_off() -> None:
    assert parse("--warm-cache-size", "512MiB").warm_cache_size == 512 << 20
    assert parse("--warm-cache-size", "0").warm_cache_size == 0
    assert parse().warm_cache_size == 2 << 30  # on by default, 2 GiB of disk


def test_routing_metrics_port_listens_beside_the_api_port() -> None:
    assert parse().routing_metrics_port is None
    assert parse("--host", "0.0.0.0", "--routing-metrics-port", "9400").routing_metrics_port == 9400
    assert parse("--port", "0", "--routing-metrics-port", "0").routing_metrics_port == 0


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--routing-metrics-port", "8080"], "--routing-metrics-port 8080 is --port too"),
        (
            ["--port", "9000", "--routing-metrics-port", "9000"],
            "--routing-metrics-port 9000 is --port too",
        ),
        (
            ["--host", "/tmp/agent.sock", "--routing-metrics-port", "9400"],
            "--host /tmp/agent.sock is a unix socket: give a TCP --host",
        ),
        (["--routing-metrics-port", "70000"], "--routing-metrics-port expects a port number"),
    ],
)
def test_a_routing_metrics_port_that_cannot_be_used_is_refused(
    argv: list[str], message: str
) -> None:
    with pytest.raises(ConfigError, match=re_escape(message)):
        parse(*argv)


def test_event_loop_choices(monkeypatch: pytest.MonkeyPatch) -> None:
    assert parse().event_loop == "auto"
    assert parse("--event-loop", "asyncio").event_loop == "asyncio"
    with pytest.raises(ConfigError, match=re_escape("--event-loop expects auto, uvloop or")):
        parse("--event-loop", "trio")
    import node_agent.event_loop as event_loop

    monkeypatch.setattr(event_loop, "uvloop_installed", lambda: False)
    with pytest.raises(ConfigError, match=re_escape("uvloop is not installed here")):
        parse("--event-loop", "uvloop")
    assert event_loop.loop_factory("auto") is None  # asyncio's own, silently: it is the default
