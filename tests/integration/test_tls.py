"""HTTPS with llama-server's own flags: ``--ssl-cert-file`` and ``--ssl-key-file``.

The certificate is generated per test run with ``openssl`` and checked by ``curl --cacert``,
as a user would; a request over plain HTTP to the TLS port gets nowhere.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO

import pytest

from tests.integration.harness import REPO, free_port, stop_process

pytestmark = pytest.mark.skipif(
    not (shutil.which("openssl") and shutil.which("curl")), reason="needs openssl and curl"
)


@pytest.fixture(scope="module")
def certificate(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    folder = tmp_path_factory.mktemp("tls")
    key, cert = folder / "key.pem", folder / "cert.pem"
    request = [
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-days",
        "1",
        "-subj",
        "/CN=localhost",
    ]
    san = "subjectAltName=DNS:localhost,IP:127.0.0.1"
    subprocess.run(
        ["openssl", *request, "-addext", san, "-keyout", str(key), "-out", str(cert)],
        check=True,
        capture_output=True,
    )
    return key, cert


def agent(*args: str, log: IO[bytes] | int = subprocess.PIPE) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "node_agent.cli", "agent", *args],
        stdout=log,
        stderr=subprocess.STDOUT,
        cwd=REPO,
    )


def curl(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["curl", "-sS", "--max-time", "30", *args], capture_output=True, text=True, check=False
    )


@pytest.fixture
def tls_agent(certificate: tuple[Path, Path], demo_dir: Path, tmp_path: Path) -> Iterator[int]:
    key, cert = certificate
    port = free_port()
    tls = ["--ssl-key-file", str(key), "--ssl-cert-file", str(cert)]
    log_path = tmp_path / "agent.log"
    with log_path.open("wb") as log:
        proc = agent("--port", str(port), "--models-dir", str(demo_dir), "-c", "512", *tls, log=log)
        try:
            deadline = time.monotonic() + 30
            while curl("--cacert", str(cert), f"https://localhost:{port}/health").returncode:
                assert proc.poll() is None, log_path.read_text(errors="replace")
                assert time.monotonic() < deadline, "the TLS agent did not become healthy"
                time.sleep(0.1)
            yield port
        finally:
            stop_process(proc)


def test_curl_with_the_ca_certificate_gets_answers(
    tls_agent: int, certificate: tuple[Path, Path]
) -> None:
    _, cert = certificate
    base = f"https://localhost:{tls_agent}"
    health = curl("--cacert", str(cert), f"{base}/health")
    assert json.loads(health.stdout) == {"status": "ok"}
    body = {"model": "demo-tiny", "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]}
    chat = curl(
        "--cacert", str(cert), "-H", "Content-Type: application/json", "-d", json.dumps(body),
        f"{base}/v1/chat/completions",
    )  # fmt: skip
    assert json.loads(chat.stdout)["object"] == "chat.completion", chat.stdout
    # without the CA the certificate is not trusted; plain HTTP gets no HTTP answer
    assert curl(f"{base}/health").returncode == 60  # curl: peer certificate cannot be verified
    plain = curl(f"http://localhost:{tls_agent}/health")
    assert plain.returncode != 0 or "status" not in plain.stdout


def test_half_a_pair_or_a_bad_file_is_refused(
    certificate: tuple[Path, Path], tmp_path: Path
) -> None:
    _, cert = certificate
    half = agent("--port", str(free_port()), "--ssl-cert-file", str(cert))
    out, _ = half.communicate(timeout=30)
    assert half.returncode == 2
    assert b"--ssl-cert-file needs --ssl-key-file too" in out
    bogus = tmp_path / "not-a-key.pem"
    bogus.write_text("hello")
    bad = agent(
        "--port", str(free_port()), "--ssl-cert-file", str(cert), "--ssl-key-file", str(bogus)
    )  # fmt: skip
    out, _ = bad.communicate(timeout=30)
    assert bad.returncode == 1
    assert b"TLS: cannot use --ssl-cert-file" in out and b"Traceback" not in out
