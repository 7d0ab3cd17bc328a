"""The README's Kubernetes lines, run as written by the real kubectl and helm, on a control plane
of their own (the chart's release "corral" of the README would clash with the session's own,
which has the same name): the namespace, the key Secret, the install that names it, a
ModelPreset and its listing. (`make images`, which needs Docker, runs in tests/unit/test_images.py
with a recording stand-in; kwok's nodes pull no image, so the README's names need not exist.)"""

from __future__ import annotations

import base64
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from tests import readme
from tests.cluster.control_plane import REPO, ControlPlane, binaries, down, up, wait_until
from tests.integration.harness import missing_in_ci_fails

LINES = (
    readme.shown("kubectl create namespace "),
    readme.shown("kubectl -n corral create secret generic corral-api-key "),
    readme.shown("helm install corral charts/corral "),
    readme.shown("kubectl apply -f examples/local-path.yaml"),
)
LISTING = readme.shown("kubectl get cmp")
pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def own_control_plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    if binaries() is None:
        missing_in_ci_fails("the control plane is not built: hack/setup.sh")
    run = Path(tmp_path_factory.mktemp("k8s-readme", numbered=True))
    try:
        yield up(run)
    finally:
        down(run)


def _sh(cp: ControlPlane, line: str) -> str:
    done = subprocess.run(
        ["bash", "-c", line], cwd=REPO, env=cp.env(), capture_output=True, text=True, timeout=180
    )
    assert done.returncode == 0, f"{line}\n{done.stdout}\n{done.stderr}"
    return done.stdout


def test_the_readmes_install_lines_install_the_chart_with_the_key_and_a_preset(
    own_control_plane: ControlPlane,
) -> None:
    cp = own_control_plane
    for line in LINES:
        _sh(cp, line)
    secret = cp.get("secret", "-n", "corral", "corral-api-key")["data"]
    assert {"api-key", "metrics-key"} <= set(secret)
    assert len(base64.b64decode(secret["api-key"])) == 32  # openssl rand -hex 16
    assert '"deployed"' in cp.helm("status", "corral", "-n", "corral", "-o", "json")
    daemonset = cp.get("daemonset", "-n", "corral")["items"][0]
    container = daemonset["spec"]["template"]["spec"]["containers"][0]
    assert container["image"].startswith("registry.example.com/team/corral-agent:")
    key_env = {e["name"]: e.get("valueFrom", {}) for e in container.get("env", [])}
    assert key_env["LLAMA_API_KEY"]["secretKeyRef"]["name"] == "corral-api-key"
    preset = yaml.safe_load((REPO / "examples" / "local-path.yaml").read_text())
    name = preset["metadata"]["name"]

    def listed() -> None:
        out = _sh(cp, LISTING)
        header = out.splitlines()[0].split()
        assert header[:2] == ["NAME", "MODEL"] and {"NODES", "READY", "AGE"} <= set(header), out
        assert any(row.split()[0] == name for row in out.splitlines()[1:]), out

    wait_until(listed, within=30)
