"""The chart's ``helm test`` script, run by ``sh`` with the real curl against a real agent
served with the chart's own generated certificate: what a ``helm test`` pod does, less the pod.

The script reaches ``https://<fullname>-agent.<namespace>.svc:<port>``; a ``curl`` first on
``PATH`` resolves that name to the agent on loopback (the cluster's DNS), and the CA's path in
the script is the one the chart mounts, mapped to a file here (the kubelet's work).
"""

from __future__ import annotations

import base64
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.chart.rendering import FULLNAME, NAMESPACE, Rendered, render_objects
from tests.integration.harness import AgentProcess, free_port

pytestmark = [
    pytest.mark.timeout(120),
    pytest.mark.skipif(shutil.which("curl") is None, reason="needs curl"),
]

KEY = "helm-test-key"
NAME = f"{FULLNAME}-agent.{NAMESPACE}.svc"
CA_MOUNT = "/etc/corral/agent-ca/ca.crt"


def rendered(port: int, model: str = "") -> Rendered:
    return Rendered(
        render_objects({"agent": {"service": {"port": port}}, "tests": {"model": model}})
    )


@pytest.fixture(scope="module")
def port() -> int:
    return free_port()


@pytest.fixture(scope="module")
def pki(port: int, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The chart's generated Secret, as the kubelet mounts it."""
    folder = tmp_path_factory.mktemp("agent-tls")
    secret = rendered(port).one("Secret", f"{FULLNAME}-agent-tls")
    for key, value in secret["data"].items():
        (folder / key).write_bytes(base64.b64decode(value))
    return folder


@pytest.fixture(scope="module")
def agent(port: int, pki: Path, demo_dir: Path) -> Iterator[AgentProcess]:
    args = [
        "--models-dir", str(demo_dir), "--api-key", KEY, "--allowed-hosts", NAME,
        "--ssl-cert-file", str(pki / "tls.crt"), "--ssl-key-file", str(pki / "tls.key"),
    ]  # fmt: skip
    process = AgentProcess(args, port=port, wait=False)
    yield process
    process.stop()


def run_script(
    port: int, ca: Path, tmp_path: Path, model: str = ""
) -> subprocess.CompletedProcess[str]:
    (container,) = rendered(port, model).one("Pod")["spec"]["containers"]
    script = container["command"][-1].replace(CA_MOUNT, str(ca))
    shim = tmp_path / "bin"
    shim.mkdir(exist_ok=True)
    real_curl = shutil.which("curl")
    (shim / "curl").write_text(
        f'#!/bin/sh\nexec {real_curl} --resolve {NAME}:{port}:127.0.0.1 "$@"\n'
    )
    (shim / "curl").chmod(0o755)
    env = {**os.environ, "PATH": f"{shim}:{os.environ['PATH']}", "LLAMA_API_KEY": KEY}
    return subprocess.run(
        ["sh", "-ec", script], capture_output=True, text=True, env=env, timeout=90, check=False
    )


def test_the_script_passes_against_the_agent_with_the_charts_certificate(
    agent: AgentProcess, pki: Path, tmp_path: Path
) -> None:
    done = run_script(agent.port, pki / "ca.crt", tmp_path)
    assert done.returncode == 0, done.stderr + agent.log()
    assert '"status":"ok"' in done.stdout.replace(" ", "") and "demo-tiny" in done.stdout


def test_with_tests_model_a_model_must_answer(
    agent: AgentProcess, pki: Path, tmp_path: Path
) -> None:
    done = run_script(agent.port, pki / "ca.crt", tmp_path, model="demo-tiny")
    assert done.returncode == 0, done.stderr + agent.log()
    assert '"object":"chat.completion"' in done.stdout.replace(" ", "")
    missing = run_script(agent.port, pki / "ca.crt", tmp_path, model="no-such-model")
    assert missing.returncode != 0 and "error: 4" in missing.stderr, missing


def test_a_certificate_from_another_ca_fails_the_script(
    agent: AgentProcess, port: int, tmp_path: Path
) -> None:
    other = tmp_path / "other"
    other.mkdir()
    # A second render generates a new CA: the agent's certificate is not signed by it.
    secret = Rendered(render_objects({"agent": {"service": {"port": port + 1}}})).one(
        "Secret", f"{FULLNAME}-agent-tls"
    )
    (other / "ca.crt").write_bytes(base64.b64decode(secret["data"]["ca.crt"]))
    done = run_script(agent.port, other / "ca.crt", tmp_path)
    assert done.returncode != 0 and "certificate" in done.stderr, done
