"""The operator against the real apiserver: real watches (410 Gone after an apiserver restart,
re-lists), the status subresource validated against the CRD on every PATCH, and the
garbage collector removing owned Services; real agents on the DaemonSet's pods' IPs reading the
ConfigMap the operator writes, each reporting which version of a preset it serves."""

from __future__ import annotations

import json
import os
import subprocess
import time
import urllib.error

import pytest

from node_agent.memory.devices import missing_gpus, open_probes
from tests.cluster.control_plane import SCRIPT, wait_until
from tests.cluster.node_agents import NodeAgent, secret_value
from tests.cluster.world import World, preset
from tests.integration.harness import chat

# A control plane, a helm install and real processes: more than the default 120 s on a busy
# machine (the session's fixtures run in its first test).
pytestmark = pytest.mark.timeout(300)


def test_a_preset_is_served_by_the_real_agents_and_collected_with_its_service(world: World) -> None:
    cp = world.cp
    cp.apply(preset("tiny", world.models / "demo-tiny.gguf", lifecycle={"loadOnStartup": True}))

    def ready() -> None:
        cond = world.condition("tiny", "Ready")
        assert (cond["status"], cond["reason"]) == ("True", "AllNodesReady"), cond
        assert world.status("tiny")["matchedNodes"] == len(world.agents.agents)

    wait_until(ready, within=90)
    # The chart's generated key guards the agents (the operator polled with it to get here),
    # over HTTPS: the chart's certificate, checked against its CA by the Service's name, as
    # the operator did.
    agent = next(iter(world.agents.agents.values()))
    assert agent.url.startswith("https://") and agent.ca is not None
    key = secret_value(cp, world.release.namespace, f"{world.release.fullname}-api-key", "api-key")
    assert agent.http("GET", "/v1/models")[0] == 401
    code, body = agent.http("GET", "/v1/models", headers={"Authorization": f"Bearer {key}"})
    assert code == 200 and "tiny" in {m["id"] for m in body["data"]}, body
    # The ServiceMonitor's scrape key (the chart's Secret) opens /metrics and nothing else.
    scrape = secret_value(
        cp, world.release.namespace, f"{world.release.fullname}-api-key", "metrics-key"
    )
    bearer = {"Authorization": f"Bearer {scrape}"}
    assert agent.http("GET", "/metrics", headers=bearer)[0] == 200
    assert agent.http("GET", "/v1/models", headers=bearer)[0] == 401
    # The chart's agent expects its node's GPU: where it sees none, as on kwok's nodes here,
    # it is not ready, and says why.
    missing = missing_gpus(1, open_probes())
    code, body = agent.http("GET", "/health")
    if missing is None:
        assert code == 200, body
    else:
        assert (code, body["error"]["message"]) == (503, missing), body
    svc = world.service("tiny")
    assert svc is not None
    owner = svc["metadata"]["ownerReferences"][0]
    assert (owner["kind"], owner["name"]) == ("ModelPreset", "tiny")
    # The agents serve HTTPS (the chart's default): so does the preset's Service, by its name
    # and appProtocol (a mesh or a gateway reads them), on 443.
    (port,) = svc["spec"]["ports"]
    assert (port["name"], port["port"], port["appProtocol"]) == ("https", 443, "https"), port
    for pod in world.release.agent_pods():
        assert pod["metadata"]["labels"].get("preset.corral.dev/tiny") == "true"

    cp.kubectl("delete", "modelpreset", "tiny")

    def gone() -> None:
        assert world.service("tiny") is None
        assert "tiny" not in world.configmap_models()

    wait_until(gone, within=60)


def test_a_preset_deleted_while_the_watch_was_down_goes(world: World) -> None:
    """kopf drops an index entry only on a DELETED event; after an apiserver restart the resumed
    watch gets 410 Gone and kopf re-lists, which never says that an object went."""
    cp = world.cp
    cp.apply(preset("gap", world.models / "demo-tiny.gguf"))
    wait_until(lambda: _assert("gap" in world.configmap_models()), within=60)

    world.operator.pause()
    try:
        # The restart drops every connection while the operator cannot read (a paused
        # process would otherwise still find the DELETED event in its socket's buffer).
        env = {**os.environ, "CORRAL_K8S_RUN": str(cp.run)}
        subprocess.run([str(SCRIPT), "restart", "kube-apiserver"], env=env, check=True, timeout=120)
        cp.kubectl("delete", "modelpreset", "gap")
        # A later write moves the revision on, and etcd forgets the ones before it (as the
        # apiserver's own compaction does every 5 minutes): the operator's watch resumes from
        # a revision nobody can replay (410 Gone), and kopf lists again.
        cp.apply(preset("gap-witness", world.models / "demo-tiny.gguf"))
        subprocess.run([str(SCRIPT), "compact"], env=env, check=True, timeout=60)
    finally:
        world.operator.resume()
    try:
        wait_until(lambda: _assert("gap-witness" in world.configmap_models()), within=60)

        def dropped() -> None:
            assert "gap" not in world.configmap_models()
            assert world.service("gap") is None

        wait_until(dropped, within=30)
        # The first write that finds it gone (404) drops it: a CI run saw 7 in 2 s, each pass
        # making its Service again for the garbage collector to remove.
        failures = world.operator.log().count("writing the status of ModelPreset gap failed")
        assert failures <= 1, world.operator.log()[-3000:]
    finally:
        cp.kubectl("delete", "modelpreset", "gap-witness", "--ignore-not-found")


def test_ready_waits_until_every_node_serves_the_new_generation(world: World) -> None:
    """After an ``args`` change a node whose kubelet has not synced the ConfigMap yet still
    lists the preset's old child as loaded: the preset is Ready only once every node reports
    the new version's hash, and ``observedGeneration`` moves only then. It used to be Ready for
    the new generation at once (matched by model name)."""
    cp = world.cp
    cp.apply(preset("gen", world.models / "demo-tiny.gguf", lifecycle={"loadOnStartup": True}))

    def ready_at(generation: int) -> None:
        st = world.status("gen")
        cond = world.condition("gen", "Ready")
        assert (cond["status"], st.get("observedGeneration")) == ("True", generation), st

    wait_until(lambda: ready_at(1), within=90)
    late = sorted(world.agents.agents)[0]
    late_node = world.agents.agents[late].node
    world.agents.held.add(late)  # this pod's kubelet syncs late
    try:
        patch = {"spec": {"args": ["--batch-size=256"]}}
        cp.kubectl("patch", "modelpreset", "gen", "--type=merge", "-p", json.dumps(patch))

        def updating() -> dict[str, object]:
            st = world.status("gen")
            cond = world.condition("gen", "Ready")
            assert cond["observedGeneration"] == 2, cond
            assert (cond["status"], cond["reason"]) == ("False", "Updating"), cond
            assert st.get("observedGeneration") == 1, st
            states = {n["name"]: n["state"] for n in st["nodes"]}
            assert states[late_node] == "Outdated", states
            assert set(states.values()) - {"Outdated"} <= {"Loaded", "Loading", "Unloaded"}
            return st

        wait_until(updating, within=60)
        time.sleep(3)  # several operator passes (every 1 s here): it stays so
        updating()
    finally:
        world.agents.held.discard(late)
    wait_until(lambda: ready_at(2), within=90)
    cp.kubectl("delete", "modelpreset", "gen")


def _assert(condition: bool) -> None:
    assert condition


def test_agents_forward_to_each_other_over_https_checked_by_the_services_name(
    world: World,
) -> None:
    """Issue 25: peers forwarded prompts and the API key in plain HTTP. With the chart's
    defaults the agents serve its certificate (for their Service's name, signed by the
    release's generated CA) and reach each other at their pod IPs, checking it by that name
    (``--peer-ca-file``, ``--peer-server-name``): A loads a model, B forwards a request for it
    there, and loads nothing."""
    cp = world.cp
    ns, fullname = world.release.namespace, world.release.fullname
    auth = {"Authorization": f"Bearer {secret_value(cp, ns, f'{fullname}-api-key', 'api-key')}"}
    cp.apply(preset("hop", world.models / "demo-tiny.gguf"))
    a, b = sorted(world.agents.agents.values(), key=lambda agent: agent.pod)[:2]
    assert (a.url.startswith("https://"), b.url.startswith("https://")) == (True, True)
    for agent in (a, b):
        wait_until(lambda agent=agent: _assert("hop" in _models(agent, auth)), within=60)
    code, body = a.http("POST", "/models/load", {"model": "hop"}, headers=auth)
    assert code == 200, body
    wait_until(lambda: _assert(_models(a, auth)["hop"] == "loaded"), within=60)

    def forwarded() -> None:
        code, body = b.http(
            "POST", "/v1/chat/completions?autoload=false", chat("hop"), headers=auth
        )
        assert code == 200, (code, body, b.log()[-3000:])

    try:
        wait_until(forwarded, within=60)
        assert "POST /v1/chat/completions model=hop status=200" in a.log()  # served there
        assert _models(b, auth)["hop"] == "unloaded"
        # The preset's own Service (the operator's) is a name the certificate holds too.
        assert a.http("GET", "/health", as_name=f"hop.{ns}.svc")[0] in (200, 503)
        with pytest.raises(urllib.error.URLError, match="Hostname mismatch"):
            a.http("GET", "/health", as_name="hop.elsewhere.svc")
    finally:
        cp.kubectl("delete", "modelpreset", "hop")


def _models(agent: NodeAgent, auth: dict[str, str]) -> dict[str, str]:
    code, body = agent.http("GET", "/models", headers=auth)
    assert code == 200, body
    return {m["id"]: m["status"]["value"] for m in body["data"]}
