"""``corral operator`` as a local process with the chart's own command line and nothing but the
token of the chart's operator ServiceAccount: every request it makes is authorized by the
chart's RBAC in the real apiserver."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from tests.cluster.control_plane import REPO, ControlPlane
from tests.cluster.node_agents import container_env, local_paths, secret_volumes
from tests.cluster.release import Release
from tests.integration.harness import free_port, http, stop_process


@dataclass
class OperatorProcess:
    proc: subprocess.Popen[bytes]
    log_path: Path
    liveness: str

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def pause(self) -> None:
        self.proc.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        self.proc.send_signal(signal.SIGCONT)


def operator_argv(
    cp: ControlPlane, release: Release, liveness: str, workdir: Path
) -> tuple[list[str], dict[str, str]]:
    deployment = cp.get("deployment", "-n", release.namespace, f"{release.fullname}-operator")
    pod_spec = deployment["spec"]["template"]["spec"]
    container = pod_spec["containers"][0]
    assert container["command"] == ["corral"], container["command"]
    # Its Secret volume (the agents' CA) as a kubelet would lay it out, here.
    mounts = secret_volumes(cp, release.namespace, pod_spec, container, workdir / "operator")
    args = [a.replace("$(POD_NAMESPACE)", release.namespace) for a in container["args"]]
    args = local_paths(args, mounts)
    args = [liveness if a.startswith("http://0.0.0.0:") else a for a in args]
    return args, container_env(cp, release.namespace, container)


@contextlib.contextmanager
def operator_running(
    cp: ControlPlane,
    release: Release,
    workdir: Path,
    extra_args: list[str] | None = None,
    env: dict[str, str] | None = None,
) -> Iterator[OperatorProcess]:
    account = f"{release.fullname}-operator"
    kubeconfig = cp.token_kubeconfig(release.namespace, account, workdir / "operator.kubeconfig")
    liveness = f"http://127.0.0.1:{free_port()}/healthz"
    args, container_vars = operator_argv(cp, release, liveness, workdir)
    full_env = {
        key: value
        for key, value in os.environ.items()
        # Nothing of the test's own identity leaks in: only the ServiceAccount's kubeconfig.
        if not key.startswith(("KUBERNETES_", "KUBECONFIG"))
    }
    full_env.update(container_vars, **(env or {}), KUBECONFIG=str(kubeconfig))
    log_path = workdir / "operator.log"
    log_file = log_path.open("wb")
    proc = subprocess.Popen(
        [sys.executable, "-m", "node_agent.cli", *args, *(extra_args or [])],
        stdout=log_file,
        stderr=subprocess.STDOUT,
        env=full_env,
        cwd=REPO,
    )
    op = OperatorProcess(proc, log_path, liveness)
    try:
        deadline = time.monotonic() + 30
        while True:
            assert proc.poll() is None, f"the operator exited:\n{op.log()}"
            with contextlib.suppress(OSError):
                if http("GET", liveness, timeout=1)[0] == 200:
                    break
            assert time.monotonic() < deadline, (
                f"the operator never answered its probe:\n{op.log()}"
            )
            time.sleep(0.1)
        yield op
    finally:
        op.resume()
        stop_process(proc)
        log_file.close()
