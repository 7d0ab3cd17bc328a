"""Real ``corral agent`` processes standing in for the DaemonSet's pods on kwok's nodes.

kwok gives every pod an IP from a loopback range (hack/k8s-env.sh), so each agent listens on
its own pod's IP and port, with the command line of the pod's own container (the chart's), and
the operator reaches it exactly as it would in a cluster: at ``http://<podIP>:<port>``. What a
kubelet does for these pods is done here: the presets ConfigMap is copied into each pod's
volume the way the kubelet lays it out (``..data`` swap), the Secret's API key is put in its
environment, and its Secret volumes (the agents' TLS certificate) are written into folders here
that its command line's paths are mapped to. Over HTTPS (the chart's default) the test checks
each agent's certificate as its peers do: against the release's CA, by the Service's name.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import ssl
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from tests.cluster.control_plane import REPO, ControlPlane
from tests.cluster.release import Release
from tests.integration.harness import http, stop_process
from tests.kubelet import write_configmap_volume


def admin_get(cp: ControlPlane, path: str) -> dict[str, Any] | None:
    """A GET as the cluster admin (the kubelet's reads), without spawning kubectl."""
    ctx = ssl.create_default_context(cafile=str(cp.ca))
    pki = cp.run / "pki"
    ctx.load_cert_chain(str(pki / "admin.crt"), str(pki / "admin.key"))
    try:
        with urllib.request.urlopen(cp.server + path, context=ctx, timeout=10) as resp:
            body: dict[str, Any] = json.loads(resp.read())
            return body
    except urllib.error.HTTPError as err:
        if err.code == 404:
            return None
        raise


def secret_value(cp: ControlPlane, namespace: str, name: str, key: str) -> str:
    body = admin_get(cp, f"/api/v1/namespaces/{namespace}/secrets/{name}")
    assert body is not None, f"no Secret {namespace}/{name}"
    return base64.b64decode(body["data"][key]).decode()


def secret_volumes(
    cp: ControlPlane, namespace: str, pod_spec: dict[str, Any], container: dict[str, Any], at: Path
) -> dict[str, Path]:
    """A kubelet's work for a container's Secret volumes: each Secret's keys (or the volume's
    ``items``) written into a folder under ``at``; the mount path → that folder."""
    volumes = {v["name"]: v for v in pod_spec.get("volumes") or []}
    mounts: dict[str, Path] = {}
    for mount in container.get("volumeMounts") or []:
        secret = (volumes.get(mount["name"]) or {}).get("secret")
        if secret is None:
            continue
        body = admin_get(cp, f"/api/v1/namespaces/{namespace}/secrets/{secret['secretName']}")
        assert body is not None, f"no Secret {secret['secretName']} for {mount['name']}"
        data = body["data"]
        items = secret.get("items") or [{"key": key, "path": key} for key in data]
        folder = at / mount["name"]
        folder.mkdir(parents=True, exist_ok=True)
        for item in items:
            (folder / item["path"]).write_bytes(base64.b64decode(data[item["key"]]))
        mounts[mount["mountPath"]] = folder
    return mounts


def local_paths(args: list[str], mounts: dict[str, Path]) -> list[str]:
    """``args`` with every path under a mount (``/etc/corral/tls/tls.crt``) made a path here."""
    out = []
    for arg in args:
        for path, folder in mounts.items():
            if arg.startswith(path + "/"):
                arg = str(folder / arg[len(path) + 1 :])
                break
        out.append(arg)
    return out


class _NamedContext(ssl.SSLContext):
    """Checks a server's certificate by ``name``, whatever address it was reached at: what
    the agents' ``--peer-server-name`` and the operator's ``--agent-server-name`` do."""

    name = ""

    def wrap_socket(self, *args: Any, **kwargs: Any) -> ssl.SSLSocket:
        kwargs["server_hostname"] = self.name
        return super().wrap_socket(*args, **kwargs)


def checked_by_name(ca: Path, name: str) -> ssl.SSLContext:
    context = _NamedContext(ssl.PROTOCOL_TLS_CLIENT)
    context.name = name
    context.load_verify_locations(cafile=str(ca))
    return context


def container_env(cp: ControlPlane, namespace: str, container: dict[str, Any]) -> dict[str, str]:
    """The plain and Secret-backed variables of a container (what a kubelet would set)."""
    env: dict[str, str] = {}
    for var in container.get("env") or []:
        if "value" in var:
            env[var["name"]] = var["value"]
        ref = (var.get("valueFrom") or {}).get("secretKeyRef")
        if ref:
            env[var["name"]] = secret_value(cp, namespace, ref["name"], ref["key"])
    return env


@dataclass
class NodeAgent:
    pod: str
    node: str
    ip: str
    port: int
    volume: Path
    proc: subprocess.Popen[bytes]
    log_path: Path
    log_file: IO[bytes]
    ca: Path | None = None  # over HTTPS: the release's CA (its Secret's ca.crt)
    server_name: str = ""  # and the name its certificate is checked by

    @property
    def url(self) -> str:
        return f"{'https' if self.ca else 'http'}://{self.ip}:{self.port}"

    def http(
        self, method: str, path: str, body: Any = None, *, as_name: str = "", **kw: Any
    ) -> tuple[int, Any]:
        """A request checked as its peers check it (``as_name``: by another name)."""
        context = None
        if self.ca is not None:
            context = checked_by_name(self.ca, as_name or self.server_name)
        return http(method, self.url + path, body, context=context, **kw)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")


def _agent_argv(
    args: list[str], *, ip: str, models: Path, presets: Path, peers: list[str]
) -> list[str]:
    """The pod's container args, with the paths of this machine: the host is the pod's IP,
    /models and /etc/corral/presets are folders here. ``--peers-from-service`` needs the
    in-cluster API (``$KUBERNETES_SERVICE_HOST``), which a local process has not: the other
    pods are given as ``--peer`` instead, at the addresses discovery would find (their pod IPs;
    the chart's ``--peer-ca-file`` and ``--peer-server-name`` check them)."""
    out: list[str] = []
    skip = False
    mapping = {"0.0.0.0": ip, "/models": str(models), "/etc/corral/presets": str(presets)}
    for i, arg in enumerate(args):
        if skip:
            skip = False
            continue
        if arg == "--peers-from-service":
            skip = True
            out += [option for url in peers for option in ("--peer", url)]
            continue
        out.append(
            mapping.get(arg, arg)
            if i and args[i - 1] in {"--host", "--models-dir", "--models-preset"}
            else arg
        )
    return out


@dataclass
class NodeAgents:
    cp: ControlPlane
    release: Release
    workdir: Path
    llama_server: str
    agents: dict[str, NodeAgent] = field(default_factory=dict)  # by pod name
    held: set[str] = field(default_factory=set)  # pods whose volumes are not synced for now
    _stop: threading.Event = field(default_factory=threading.Event)
    _sync: threading.Thread | None = None

    def start(self, pods: list[dict[str, Any]], extra_args: list[str]) -> None:
        def url(pod: dict[str, Any]) -> str:
            container = pod["spec"]["containers"][0]
            scheme = "https" if "--ssl-cert-file" in container["args"] else "http"
            port = container["ports"][0]["containerPort"]
            return f"{scheme}://{pod['status']['podIP']}:{port}"

        for pod in pods:
            name = pod["metadata"]["name"]
            container = pod["spec"]["containers"][0]
            assert container["command"] == ["corral"], container["command"]
            ip = pod["status"]["podIP"]
            port = int(container["ports"][0]["containerPort"])
            base = self.workdir / name
            volume, models, cache = base / "presets", base / "models", base / "cache"
            for folder in (volume, models, cache):
                folder.mkdir(parents=True, exist_ok=True)
            write_configmap_volume(volume, {}, "v0")
            env = container_env(self.cp, self.release.namespace, container)
            env.update(
                NODE_NAME=pod["spec"]["nodeName"],
                POD_NAME=name,
                POD_IP=ip,
                LLAMA_CACHE=str(cache),
            )
            log_path = base / "agent.log"
            log_file = log_path.open("wb")
            mounts = secret_volumes(self.cp, self.release.namespace, pod["spec"], container, base)
            args = local_paths(container["args"], mounts)
            peers = [url(other) for other in pods if other is not pod]
            argv = _agent_argv(args, ip=ip, models=models, presets=volume, peers=peers)
            ca = None
            if "--ssl-cert-file" in args:
                ca = Path(args[args.index("--ssl-cert-file") + 1]).with_name("ca.crt")
            proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "node_agent.cli",
                    *argv,
                    "--llama-server",
                    self.llama_server,
                    *extra_args,
                ],
                stdout=log_file,
                stderr=subprocess.STDOUT,
                env={**os.environ, **env},
                cwd=REPO,
            )
            self.agents[name] = NodeAgent(
                name,
                pod["spec"]["nodeName"],
                ip,
                port,
                volume,
                proc,
                log_path,
                log_file,
                ca,
                self.release.agent_server_name,
            )
        for agent in self.agents.values():
            self._wait_healthy(agent)
        self._sync = threading.Thread(target=self._kubelet, name="kubelet", daemon=True)
        self._sync.start()

    def _wait_healthy(self, agent: NodeAgent, within: float = 30) -> None:
        deadline = time.monotonic() + within
        while time.monotonic() < deadline:
            assert agent.proc.poll() is None, f"agent {agent.pod} exited:\n{agent.log()}"
            with contextlib.suppress(OSError):
                # /livez: /health is 503 here, where kwok's GPU nodes have no GPU to see.
                if agent.http("GET", "/livez", timeout=1)[0] == 200:
                    return
            time.sleep(0.05)
        raise AssertionError(f"agent {agent.pod} never became healthy:\n{agent.log()}")

    def _kubelet(self) -> None:
        """Copy the presets ConfigMap into every pod's volume whenever it changes (except
        into the volumes of ``held`` pods: a kubelet that syncs late, as real ones do within
        their 60–90 s)."""
        ns, name = self.release.namespace, self.release.presets_configmap
        path = f"/api/v1/namespaces/{ns}/configmaps/{name}"
        written: dict[str, dict[str, str]] = {}  # pod → the data its volume shows
        version = 0
        while not self._stop.wait(0.2):
            try:
                body = admin_get(self.cp, path)
            except OSError:  # the apiserver restarting (a test does that)
                continue
            data = dict((body or {}).get("data") or {})
            for pod, agent in self.agents.items():
                if pod not in self.held and written.get(pod) != data:
                    version += 1
                    write_configmap_volume(agent.volume, data, f"v{version}")
                    written[pod] = data

    def stop(self) -> None:
        self._stop.set()
        if self._sync is not None:
            self._sync.join(5)
        for agent in self.agents.values():
            stop_process(agent.proc)
            agent.log_file.close()


@contextlib.contextmanager
def node_agents(
    cp: ControlPlane,
    release: Release,
    pods: list[dict[str, Any]],
    workdir: Path,
    llama_server: str,
    extra_args: list[str] | None = None,
) -> Iterator[NodeAgents]:
    agents = NodeAgents(cp, release, workdir, llama_server)
    try:
        agents.start(pods, extra_args or ["--memory-limit", "host=8GiB", "-c", "512"])
        yield agents
    finally:
        agents.stop()
