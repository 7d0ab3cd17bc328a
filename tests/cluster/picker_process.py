"""The Gateway API Inference Extension's endpoint picker (hack/k8s-env.sh builds it from its
module) as a local process, with the command line of the chart's picker Deployment and nothing
but the token of the chart's picker ServiceAccount; ``pick`` asks it where a request goes, as
a gateway's ext_proc filter would (hack/epp-pick)."""

from __future__ import annotations

import contextlib
import os
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from tests.cluster.control_plane import SCRIPT, ControlPlane
from tests.cluster.release import Release
from tests.integration.harness import free_port, stop_process
from tests.kubelet import write_configmap_volume


def picker_folder() -> Path | None:
    """bin/epp, bin/epp-pick and crds/, or None when hack/k8s-env.sh has not built them."""
    proc = subprocess.run([str(SCRIPT), "picker"], capture_output=True, text=True, timeout=60)
    return Path(proc.stdout.strip()) if proc.returncode == 0 else None


@dataclass
class Picker:
    folder: Path
    proc: subprocess.Popen[bytes]
    address: str
    log_path: Path

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def pick(self, model: str) -> str:
        """The endpoint (IP:port) the picker sends a chat request for ``model`` to."""
        assert self.proc.poll() is None, f"the picker exited:\n{self.log()}"
        done = subprocess.run(
            [str(self.folder / "bin" / "epp-pick"), self.address, model],
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert done.returncode == 0, done.stderr
        return done.stdout.strip()


def _picker_args(cp: ControlPlane, release: Release, workdir: Path) -> list[str]:
    """The Deployment's args, its ConfigMap volume laid out here as a kubelet would, and its
    three ports moved to free ones (several pickers may run on one machine)."""
    name = f"{release.fullname}-picker"
    deployment = cp.get("deployment", "-n", release.namespace, name)
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    configmap = cp.get("configmap", "-n", release.namespace, name)
    config = workdir / "picker-config"
    config.mkdir()
    write_configmap_volume(config, configmap["data"], "v1")
    args = [
        str(config) + a[len("/config") :] if a.startswith("/config/") else a
        for a in container["args"]
    ]
    for flag in ("--grpc-port", "--grpc-health-port", "--metrics-port"):
        args += [flag, str(free_port())]
    return args


@contextlib.contextmanager
def picker_running(
    cp: ControlPlane, release: Release, folder: Path, workdir: Path
) -> Iterator[Picker]:
    account = f"{release.fullname}-picker"
    kubeconfig = cp.token_kubeconfig(release.namespace, account, workdir / "picker.kubeconfig")
    args = _picker_args(cp, release, workdir)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KUBERNETES_", "KUBECONFIG"))}
    log_path = workdir / "picker.log"
    with log_path.open("wb") as log_file:
        proc = subprocess.Popen(
            [str(folder / "bin" / "epp"), *args],
            stdout=log_file,
            stderr=subprocess.STDOUT,
            env={**env, "KUBECONFIG": str(kubeconfig)},
        )
    address = f"127.0.0.1:{args[args.index('--grpc-port') + 1]}"
    try:
        yield Picker(folder, proc, address, log_path)
    finally:
        stop_process(proc)
