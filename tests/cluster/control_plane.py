"""The real control plane of hack/k8s-env.sh, as the cluster tier drives it: kubectl and helm
binaries of the same build, the admin kubeconfig, and kubeconfigs that carry a ServiceAccount's
own token (so the operator and the agents run with exactly what the chart's RBAC grants)."""

from __future__ import annotations

import json
import os
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "hack" / "k8s-env.sh"


class CommandFailed(AssertionError):
    pass


@dataclass(frozen=True)
class ControlPlane:
    bin: Path
    run: Path  # hack/k8s-env.sh's state folder (certificates, logs, kubeconfig)

    @property
    def kubeconfig(self) -> Path:
        return self.run / "kubeconfig"

    @property
    def server(self) -> str:
        for line in self.kubeconfig.read_text().splitlines():
            if line.strip().startswith("server:"):
                return line.split(":", 1)[1].strip()
        raise AssertionError("no server in the kubeconfig")

    @property
    def ca(self) -> Path:
        return self.run / "pki" / "ca.crt"

    def env(self) -> dict[str, str]:
        return {
            **os.environ,
            "KUBECONFIG": str(self.kubeconfig),
            "PATH": f"{self.bin}{os.pathsep}{os.environ.get('PATH', '')}",
            # helm keeps its caches and repositories out of the user's home.
            "HELM_CACHE_HOME": str(self.run / "helm" / "cache"),
            "HELM_CONFIG_HOME": str(self.run / "helm" / "config"),
            "HELM_DATA_HOME": str(self.run / "helm" / "data"),
        }

    def _run(self, tool: str, args: tuple[str, ...], stdin: str | None, check: bool) -> str:
        proc = subprocess.run(
            [str(self.bin / tool), *args],
            input=stdin,
            capture_output=True,
            text=True,
            env=self.env(),
            timeout=300,
        )
        if check and proc.returncode != 0:
            raise CommandFailed(f"{tool} {' '.join(args)}: {proc.returncode}\n{proc.stderr}")
        return proc.stdout if proc.returncode == 0 else proc.stderr

    def kubectl(self, *args: str, stdin: str | None = None, check: bool = True) -> str:
        return self._run("kubectl", args, stdin, check)

    def kubectl_result(self, *args: str, stdin: str | None = None) -> tuple[int, str]:
        proc = subprocess.run(
            [str(self.bin / "kubectl"), *args],
            input=stdin,
            capture_output=True,
            text=True,
            env=self.env(),
            timeout=120,
        )
        return proc.returncode, proc.stdout + proc.stderr

    def helm(self, *args: str, check: bool = True) -> str:
        return self._run("helm", args, None, check)

    def get(self, *args: str) -> Any:
        return json.loads(self.kubectl("get", "-o", "json", *args))

    def apply(self, obj: dict[str, Any] | list[dict[str, Any]]) -> None:
        items = obj if isinstance(obj, list) else [obj]
        self.kubectl(
            "apply",
            "-f",
            "-",
            stdin=json.dumps({"apiVersion": "v1", "kind": "List", "items": items}),
        )

    def token_kubeconfig(
        self, namespace: str, account: str, path: Path, server: str | None = None
    ) -> Path:
        """A kubeconfig with a fresh token of the ServiceAccount (TokenRequest), nothing else:
        whatever the process does then is authorized by RBAC as that account."""
        token = self.kubectl("create", "token", account, "-n", namespace, "--duration=2h").strip()
        path.write_text(
            json.dumps(
                {
                    "apiVersion": "v1",
                    "kind": "Config",
                    "clusters": [
                        {
                            "name": "test",
                            "cluster": {
                                "server": server or self.server,
                                "certificate-authority": str(self.ca),
                            },
                        }
                    ],
                    "users": [{"name": account, "user": {"token": token}}],
                    "contexts": [
                        {
                            "name": "test",
                            "context": {"cluster": "test", "user": account, "namespace": namespace},
                        }
                    ],
                    "current-context": "test",
                }
            )
        )
        return path


def binaries() -> Path | None:
    """The folder of the built binaries, or None when they are not built. Never builds: that
    takes minutes (hack/setup.sh does it once per machine), more than a test's time limit."""
    proc = subprocess.run([str(SCRIPT), "built"], capture_output=True, text=True, timeout=60)
    if proc.returncode != 0:
        return None
    return Path(proc.stdout.strip().splitlines()[-1])


def up(run: Path) -> ControlPlane:
    env = {**os.environ, "CORRAL_K8S_RUN": str(run)}
    proc = subprocess.run([str(SCRIPT), "up"], capture_output=True, text=True, env=env, timeout=600)
    if proc.returncode != 0:
        raise CommandFailed(f"hack/k8s-env.sh up: {proc.returncode}\n{proc.stderr}")
    exports = dict(
        line.removeprefix("export ").split("=", 1)
        for line in proc.stdout.splitlines()
        if line.startswith("export ")
    )
    bin_dir = Path(exports["PATH"].split(":", 1)[0])
    return ControlPlane(bin=bin_dir, run=Path(exports["KUBECONFIG"]).parent)


def down(run: Path) -> None:
    env = {**os.environ, "CORRAL_K8S_RUN": str(run)}
    subprocess.run([str(SCRIPT), "down"], env=env, timeout=120, check=False)


def wait_until(check: Any, within: float = 60.0, every: float = 0.2) -> Any:
    """Retry a check (assertions inside) until it passes; re-raise its last failure."""
    deadline = time.monotonic() + within
    while True:
        try:
            return check()
        except (AssertionError, KeyError, IndexError, CommandFailed):
            if time.monotonic() > deadline:
                raise
            time.sleep(every)
