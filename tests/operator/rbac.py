"""What the chart's RBAC grants one ServiceAccount, as the emulator's Access tuples, for the
checks of what the operator and the agents really ask (tests/operator/apiserver.py records it)."""

from __future__ import annotations

from tests.chart.rendering import NAMESPACE as CHART_NAMESPACE
from tests.chart.rendering import render_objects
from tests.operator.apiserver import Access
from tests.operator.cluster import CM, NS


def granted_to(account_suffix: str) -> set[Access]:
    """The permissions of the chart's ServiceAccount whose name ends with ``account_suffix``
    (``-operator``, ``-agent``), in the test's namespace: the chart's release namespace stands
    for the test's ``NS`` and its presets ConfigMap for the test's ``CM``."""
    objects = render_objects({})
    presets_cm = next(
        o["metadata"]["name"]
        for o in objects
        if o["kind"] == "ConfigMap" and o["metadata"]["name"].endswith("-presets")
    )
    bound = {
        (b["roleRef"]["kind"], b["roleRef"]["name"], b["metadata"].get("namespace"))
        for b in objects
        if b["kind"] in {"RoleBinding", "ClusterRoleBinding"}
        and any(s["name"].endswith(account_suffix) for s in b["subjects"])
    }
    out: set[Access] = set()
    for role in objects:
        ns = role["metadata"].get("namespace")
        if (role["kind"], role["metadata"]["name"], ns) not in bound:
            continue
        scope = None if ns is None else (NS if ns == CHART_NAMESPACE else ns)
        for rule in role["rules"]:
            for group in rule["apiGroups"]:
                for resource in rule["resources"]:
                    for verb in rule["verbs"]:
                        for name in rule.get("resourceNames") or [None]:
                            name = CM if name == presets_cm else name
                            out.add(Access(group, resource, verb, scope, name))
    return out
