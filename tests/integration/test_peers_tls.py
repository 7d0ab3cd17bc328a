"""Peers over HTTPS (``--peer-ca-file``, ``--peer-server-name``), as the chart runs them: every
agent serves one certificate that names its Service, signed by the release's own CA, and is
reached at its pod's address, which no certificate names.

Real agents on loopback; the CA and the certificate are made per run with ``openssl``.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.harness import AgentProcess, chat, free_port
from tests.pki import issue

pytestmark = [
    pytest.mark.timeout(120),
    pytest.mark.skipif(
        not (shutil.which("openssl") and shutil.which("curl")), reason="needs openssl and curl"
    ),
]

KEY = "cluster-key"
AUTH = {"Authorization": f"Bearer {KEY}"}
NAME = "corral-agent.test.svc"  # the Service's name, in the certificate; the address is not


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """ca.crt, and tls.crt/tls.key for NAME signed by it (the chart's Secret's three keys)."""
    return issue(tmp_path_factory.mktemp("pki"), NAME)


def curl_b(pki: Path, port: int, method: str, path: str, body: object = None) -> dict[str, object]:
    """Ask B as a client that trusts the CA and knows B by NAME (curl --resolve)."""
    args = ["--cacert", str(pki / "ca.crt"), "--resolve", f"{NAME}:{port}:127.0.0.1"]
    if body is not None:
        args += ["-H", "Content-Type: application/json", "-d", json.dumps(body)]
    done = subprocess.run(
        ["curl", "-sS", "--max-time", "30", "-X", method, *args,
         "-H", f"Authorization: Bearer {KEY}", f"https://{NAME}:{port}{path}"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    answer: dict[str, object] = json.loads(done.stdout)
    return answer


@pytest.fixture
def b(pki: Path, demo_dir: Path) -> Iterator[AgentProcess]:
    """Agent B: serves HTTPS with the release's certificate; demo-tiny loaded."""
    tls = ["--ssl-cert-file", str(pki / "tls.crt"), "--ssl-key-file", str(pki / "tls.key")]
    common = ["--models-dir", str(demo_dir), "--models-max", "1", "--api-key", KEY]
    # (--allowed-hosts: a loopback agent answers only to local names, and curl says NAME)
    agent = AgentProcess([*common, *tls, "--allowed-hosts", NAME], wait=False)
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                curl_b(pki, agent.port, "GET", "/health")
                break
            except subprocess.CalledProcessError:
                assert agent.proc.poll() is None, agent.log()
                assert time.monotonic() < deadline, f"B never answered over TLS: {agent.log()}"
                time.sleep(0.2)
        loaded = curl_b(pki, agent.port, "POST", "/models/load", {"model": "demo-tiny"})
        assert loaded == {"success": True}, loaded
        yield agent
    finally:
        agent.stop()


def a_with(demo_dir: Path, b: AgentProcess, *tls: str) -> AgentProcess:
    """Agent A: plain HTTP for its clients, B as its HTTPS peer (by address, as discovered)."""
    common = ["--models-dir", str(demo_dir), "--models-max", "1", "--api-key", KEY]
    peer = ["--peer", f"https://127.0.0.1:{b.port}", "--log-level", "debug"]
    return AgentProcess([*common, *peer, *tls])


def test_a_peer_whose_certificate_names_the_service_is_checked_by_that_name(
    pki: Path, demo_dir: Path, b: AgentProcess
) -> None:
    a = a_with(demo_dir, b, "--peer-ca-file", str(pki / "ca.crt"), "--peer-server-name", NAME)
    try:
        deadline = time.monotonic() + 30
        while True:  # until A's subscription to B has B's view
            status, body = a.post(
                "/v1/chat/completions?autoload=false", chat("demo-tiny"), headers=AUTH
            )
            if status == 200:
                break
            assert time.monotonic() < deadline, (
                f"A never forwarded: {status} {body}\n{a.log()}\nB:{b.log()}"
            )
            time.sleep(0.2)
        assert body["choices"][0]["message"]["role"] == "assistant"
        assert f"model=demo-tiny goes to https://127.0.0.1:{b.port}: " in a.log()
        assert a.children() == []
    finally:
        a.stop()


def test_a_peer_checked_by_its_address_or_without_the_ca_is_left_out(
    pki: Path, demo_dir: Path, b: AgentProcess
) -> None:
    """The same B, but A checks its certificate by the address (which it does not name), or
    against the system's CAs (which did not sign it): B is never used, and A says why."""
    for tls, why in (
        (("--peer-ca-file", str(pki / "ca.crt")), "IP address mismatch"),
        ((), "unable to get local issuer certificate"),
    ):
        a = a_with(demo_dir, b, *tls)
        try:
            deadline = time.monotonic() + 30
            while why not in a.log():
                assert time.monotonic() < deadline, f"no {why!r} in A's log:\n{a.log()}"
                time.sleep(0.2)
            assert f"peer https://127.0.0.1:{b.port} does not answer yet" in a.log()
            status, body = a.post(
                "/v1/chat/completions?autoload=false", chat("demo-tiny"), headers=AUTH
            )
            assert status == 400 and "goes to" not in a.log(), body  # not loaded here
        finally:
            a.stop()


def test_a_ca_file_that_is_not_one_is_refused_at_start(tmp_path: Path) -> None:
    bogus = tmp_path / "ca.crt"
    bogus.write_text("not a certificate\n")
    port = free_port()
    for path, message in (
        (bogus, f"--peer-ca-file {bogus}: no CA certificates read"),
        (tmp_path / "missing.crt", f"--peer-ca-file: {tmp_path / 'missing.crt'} does not exist"),
    ):
        agent = AgentProcess(
            ["--peer", f"https://127.0.0.1:{port}", "--peer-ca-file", str(path)], wait=False
        )
        try:
            assert agent.proc.wait(timeout=30) == 1
            assert message in agent.log() and "Traceback" not in agent.log(), agent.log()
        finally:
            agent.stop()
