"""``corral operator`` flags and their environment fallbacks (the chart relies on them)."""

from __future__ import annotations

import shutil
import ssl
import subprocess
from pathlib import Path

import pytest
from preset_operator.main import parse_args

AGENT = {"app.kubernetes.io/name": "corral", "app.kubernetes.io/component": "agent"}


def test_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in (
        "CORRAL_NAMESPACE",
        "POD_NAMESPACE",
        "CORRAL_PRESETS_CONFIGMAP",
        "CORRAL_AGENT_SELECTOR",
        "CORRAL_RELIST_INTERVAL",
    ):
        monkeypatch.delenv(name, raising=False)
    cfg = parse_args([])
    assert (cfg.namespace, cfg.configmap, dict(cfg.agent_selector)) == (
        "default",
        "corral-presets",
        AGENT,
    )
    assert (cfg.agent_port, cfg.poll_interval) == (8080, 10.0)
    assert (cfg.relist_interval, cfg.events) == (60.0, True)


def test_relist_interval_and_events(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CORRAL_RELIST_INTERVAL", "2.5")
    cfg = parse_args(["--no-events"])
    assert (cfg.relist_interval, cfg.events) == (2.5, False)
    assert parse_args(["--relist-interval", "7"]).relist_interval == 7.0
    for bad in ("0", "-1", "nan", "soon"):
        monkeypatch.setenv("CORRAL_RELIST_INTERVAL", bad)
        with pytest.raises(SystemExit):
            parse_args([])


def test_environment_fallbacks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("POD_NAMESPACE", "from-pod")
    monkeypatch.delenv("CORRAL_NAMESPACE", raising=False)
    assert parse_args([]).namespace == "from-pod"
    monkeypatch.setenv("CORRAL_NAMESPACE", "corral")
    monkeypatch.setenv("CORRAL_PRESETS_CONFIGMAP", "cm")
    monkeypatch.setenv("CORRAL_AGENT_SELECTOR", "app=agent, tier=gpu")
    cfg = parse_args([])
    assert (cfg.namespace, cfg.configmap, dict(cfg.agent_selector)) == (
        "corral",
        "cm",
        {"app": "agent", "tier": "gpu"},
    )


def test_flags_win_over_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CORRAL_NAMESPACE", "env")
    cfg = parse_args(
        [
            "--namespace",
            "flag",
            "--presets-configmap",
            "p",
            "--agent-selector",
            "a=b",
            "--agent-port",
            "9000",
            "--poll-interval",
            "2.5",
        ]
    )
    assert (cfg.namespace, cfg.configmap, dict(cfg.agent_selector)) == ("flag", "p", {"a": "b"})
    assert (cfg.agent_port, cfg.poll_interval) == (9000, 2.5)


@pytest.mark.parametrize("selector", ["", "app!=x", "app in (a,b)", "=x"])
def test_selectors_must_be_equality_terms(selector: str) -> None:
    with pytest.raises(SystemExit):
        parse_args(["--agent-selector", selector])


@pytest.mark.skipif(shutil.which("openssl") is None, reason="needs openssl")
def test_agents_over_https_with_the_releases_ca(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for name in ("CORRAL_AGENT_CA_FILE", "CORRAL_AGENT_SERVER_NAME"):
        monkeypatch.delenv(name, raising=False)
    assert parse_args([]).agent_tls is None  # plain HTTP unless a CA is given
    ca = tmp_path / "ca.crt"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
         "-subj", "/CN=test-ca", "-keyout", str(tmp_path / "ca.key"), "-out", str(ca)],
        check=True, capture_output=True,
    )  # fmt: skip
    monkeypatch.setenv("CORRAL_AGENT_CA_FILE", str(ca))
    monkeypatch.setenv("CORRAL_AGENT_SERVER_NAME", "Corral-Agent.corral.svc.")
    tls = parse_args([]).agent_tls
    assert tls is not None and tls.server_name == "corral-agent.corral.svc"
    assert tls.context.verify_mode is ssl.CERT_REQUIRED and tls.context.check_hostname
    assert len(tls.context.get_ca_certs()) == 1  # this CA only, not the system's
    for argv, message in (
        (["--agent-server-name", "not a name"], "--agent-server-name expects a DNS name"),
        (["--agent-ca-file", ""], "--agent-ca-file: give a PEM file of CA certificates"),
        (["--agent-ca-file", str(tmp_path / "none.crt")], "none.crt does not exist"),
        (["--agent-ca-file", str(tmp_path / "ca.key")], "ca.key: no CA certificates read"),
    ):
        with pytest.raises(SystemExit):
            parse_args(argv)
        assert message in capsys.readouterr().err
    monkeypatch.delenv("CORRAL_AGENT_CA_FILE")
    with pytest.raises(SystemExit):
        parse_args([])
    assert "give --agent-ca-file" in capsys.readouterr().err
