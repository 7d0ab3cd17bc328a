"""Scale figures of the operator on the real control plane (hack/k8s-env.sh) with kwok nodes.

    .venv/bin/python hack/k8s-scale.py [--nodes 500] [--presets 40] [--rest 60]

Brings up its own control plane with ``--nodes`` simulated GPU nodes, installs the chart with its
defaults into a ``restricted`` namespace (the DaemonSet puts a pod on every node; kwok runs them
with loopback IPs), answers every pod's ``GET /models`` from one process (a fake agent per pod
IP that lists the sections of its node's file, as a real agent does once the kubelet delivered
it), and runs ``corral operator`` with the chart's command line and its ServiceAccount's token
(poll interval 10 s, the default). Then: presets applied and awaited, the operator at rest for
``--rest`` seconds, and one more preset timed to Ready. Prints a Markdown table.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import ssl
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from aiohttp import web  # noqa: E402

from tests.cluster.control_plane import ControlPlane, down, up, wait_until  # noqa: E402
from tests.cluster.node_agents import admin_get, secret_value  # noqa: E402
from tests.cluster.operator_process import operator_running  # noqa: E402
from tests.cluster.release import RESTRICTED, install, namespace, wait_agents_running  # noqa: E402
from tests.operator.agent_models import model_entry, model_list  # noqa: E402
from tests.operator.cluster import node_models  # noqa: E402

MP = "/apis/corral.dev/v1alpha1/modelpresets"


class FakeAgents:
    """One aiohttp server per pod IP, in a thread of its own, serving ``GET /models``: each
    node's answer is built once per ConfigMap version (a real agent answers from memory too;
    building 39 entries per request would make this process, not the operator, the bottleneck)."""

    def __init__(
        self, cp: ControlPlane, namespace: str, configmap: str, key: str, tls: ssl.SSLContext
    ) -> None:
        self.cp, self.key, self.tls = cp, key, tls  # tls: the chart's certificate, as agents
        self.path = f"/api/v1/namespaces/{namespace}/configmaps/{configmap}"
        self.answers: dict[str, bytes] = {}  # node → its GET /models body
        self.by_ip: dict[str, str] = {}  # pod IP → node
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)

    async def models(self, request: web.Request) -> web.Response:
        if request.headers.get("Authorization") != f"Bearer {self.key}":
            return web.Response(status=401)
        sock = request.transport.get_extra_info("sockname") if request.transport else None
        node = self.by_ip.get(sock[0] if sock else "", "")
        empty = b'{"object": "list", "data": []}'
        return web.Response(body=self.answers.get(node, empty), content_type="application/json")

    async def _serve(self, ips: dict[str, str]) -> None:
        self.by_ip = ips
        app = web.Application()
        app.router.add_get("/models", self.models)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        for ip in ips:
            await web.TCPSite(runner, ip, 8080, ssl_context=self.tls).start()

    async def _kubelet(self) -> None:
        seen: dict[str, str] | None = None
        while True:
            body = await asyncio.to_thread(admin_get, self.cp, self.path)
            data = dict((body or {}).get("data") or {})
            if data != seen:
                entries: dict[str, dict[str, object]] = {}
                answers = {}
                for node in set(self.by_ip.values()):
                    names = node_models(data, node) if data else []
                    for name in names:
                        entries.setdefault(name, model_entry(name))
                    answers[node] = json.dumps(model_list([entries[n] for n in names])).encode()
                self.answers, seen = answers, data
            await asyncio.sleep(1)

    def start(self, ips: dict[str, str]) -> None:
        self.thread.start()
        asyncio.run_coroutine_threadsafe(self._serve(ips), self.loop).result(60)
        asyncio.run_coroutine_threadsafe(self._kubelet(), self.loop)


def preset(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "corral.dev/v1alpha1",
        "kind": "ModelPreset",
        "metadata": {"name": name},
        "spec": {
            "source": {"localPath": {"path": f"/models/{name}.gguf"}},
            "args": ["--ctx-size", "4096"],
            "placement": {"nodeSelector": {"nvidia.com/gpu.present": "true"}},
        },
    }


def ready(cp: ControlPlane, name: str, nodes: int) -> None:
    st = (admin_get(cp, f"{MP}/{name}") or {}).get("status") or {}
    conds = {c["type"]: c for c in st.get("conditions", [])}
    assert st.get("matchedNodes") == nodes, st.get("matchedNodes")
    assert conds.get("Ready", {}).get("status") == "True", conds.get("Ready")


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def requests_by_resource(cp: ControlPlane) -> dict[str, float]:
    """apiserver_request_total summed by (verb, resource) — every client's requests."""
    out: dict[str, float] = {}
    for line in cp.kubectl("get", "--raw", "/metrics").splitlines():
        if not line.startswith("apiserver_request_total{"):
            continue
        labels = dict(
            part.split("=", 1) for part in line[line.index("{") + 1 : line.rindex("}")].split(",")
        )
        key = f"{labels['verb'].strip(chr(34))} {labels['resource'].strip(chr(34))}"
        sub = labels.get("subresource", '""').strip('"')
        key += f"/{sub}" if sub else ""
        out[key] = out.get(key, 0.0) + float(line.rsplit(" ", 1)[1])
    return out


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--nodes", type=int, default=500)
    p.add_argument("--presets", type=int, default=40)
    p.add_argument("--rest", type=float, default=60.0)
    args = p.parse_args()
    work = Path(tempfile.mkdtemp(prefix="corral-scale-"))
    os.environ["CORRAL_K8S_GPU_NODES"] = str(args.nodes)
    started = time.monotonic()
    try:
        cp = up(work / "k8s")
        figures = [
            (f"control plane up, {args.nodes} nodes Ready (s)", f"{time.monotonic() - started:.0f}")
        ]
        ns = "corral-system"
        namespace(cp, ns, RESTRICTED)
        t0 = time.monotonic()
        release = install(cp, "corral", ns, {}, work, wait=False)
        pods = wait_agents_running(release, args.nodes, within=900)
        figures.append(
            (f"DaemonSet pods Running on {args.nodes} nodes (s)", f"{time.monotonic() - t0:.0f}")
        )
        key = secret_value(cp, ns, f"{release.fullname}-api-key", "api-key")
        tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)  # the chart's default: HTTPS
        for name in ("tls.crt", "tls.key"):
            (work / name).write_text(secret_value(cp, ns, f"{release.fullname}-agent-tls", name))
        tls.load_cert_chain(work / "tls.crt", work / "tls.key")
        agents = FakeAgents(cp, ns, release.presets_configmap, key, tls)
        agents.start({pod["status"]["podIP"]: pod["spec"]["nodeName"] for pod in pods})
        with operator_running(cp, release, work) as op:
            pid = op.proc.pid
            t0 = time.monotonic()
            cp.apply([preset(f"p{i:02d}") for i in range(args.presets - 1)])
            for i in range(args.presets - 1):
                wait_until(lambda i=i: ready(cp, f"p{i:02d}", args.nodes), within=900, every=1)
            figures.append(
                (
                    f"{args.presets - 1} presets Ready on every node (s)",
                    f"{time.monotonic() - t0:.0f}",
                )
            )
            time.sleep(15)  # let the last writes settle
            cpu0, req0, t0 = cpu_seconds(pid), requests_by_resource(cp), time.monotonic()
            time.sleep(args.rest)
            cpu1, req1, t1 = cpu_seconds(pid), requests_by_resource(cp), time.monotonic()
            minutes = (t1 - t0) / 60
            figures.append(
                ("operator CPU at rest (% of a core)", f"{100 * (cpu1 - cpu0) / (t1 - t0):.1f}")
            )
            figures.append(("operator RSS at rest (MiB)", f"{rss_mib(pid):.0f}"))
            rates = {k: (req1.get(k, 0) - req0.get(k, 0)) / minutes for k in req1}
            total = sum(rates.values())
            figures.append(("apiserver requests/min at rest, all clients", f"{total:.0f}"))
            ours = {
                k: v
                for k, v in rates.items()
                if k.split(" ")[1].split("/")[0]
                in {"modelpresets", "configmaps", "services", "events"}
                and v > 0
            }
            for k, v in sorted(ours.items()):
                figures.append((f"  of which {k} (/min)", f"{v:.1f}"))
            t0 = time.monotonic()
            last = f"p{args.presets - 1:02d}"
            cp.apply(preset(last))
            wait_until(lambda: ready(cp, last, args.nodes), within=900, every=0.2)
            figures.append(
                (
                    f"preset #{args.presets} applied → Ready on {args.nodes} nodes (s)",
                    f"{time.monotonic() - t0:.1f}",
                )
            )
            data = (
                admin_get(cp, f"/api/v1/namespaces/{ns}/configmaps/{release.presets_configmap}")
                or {}
            ).get("data") or {}
            figures.append(
                (
                    "presets ConfigMap data (bytes)",
                    str(sum(len(k) + len(v.encode()) for k, v in data.items())),
                )
            )
            status = (admin_get(cp, f"{MP}/{last}") or {}).get("status") or {}
            figures.append(("one preset's status (bytes of JSON)", str(len(json.dumps(status)))))
            figures.append(("operator CPU total so far (s)", f"{cpu_seconds(pid):.0f}"))
    finally:
        down(work / "k8s")
        subprocess.run(["rm", "-rf", str(work)], check=False)
    print(f"| figure ({args.nodes} kwok nodes, {args.presets} presets) | value |")
    print("|---|---|")
    for name, value in figures:
        print(f"| {name} | {value} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
