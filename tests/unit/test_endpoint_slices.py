"""Which endpoints become peers (core.endpoint_slices), from a list then watch events: the
conditions, leaving this agent out, ports, address families, resourceVersions and relists."""

from __future__ import annotations

from typing import Any

import pytest

from node_agent.core.endpoint_slices import MANAGED_BY, MANAGED_BY_LABEL, Me, SliceView, Step

ME = Me(pod_name="agent-me", pod_ip="10.0.0.1")


def endpoint(pod: str, ip: str, **conditions: bool | None) -> dict[str, Any]:
    conds = {"ready": True, "serving": True, "terminating": False}
    conds.update(conditions)
    return {
        "addresses": [ip],
        "conditions": {k: v for k, v in conds.items() if v is not None},
        "targetRef": {"kind": "Pod", "name": pod, "namespace": "corral"},
    }


def slice_(
    name: str,
    *endpoints: dict[str, Any],
    family: str = "IPv4",
    ports: list[dict[str, Any]] | None = None,
    version: str = "1",
    managed_by: str = MANAGED_BY,
) -> dict[str, Any]:
    labels = {"kubernetes.io/service-name": "svc", MANAGED_BY_LABEL: managed_by}
    return {
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "metadata": {"name": name, "resourceVersion": version, "labels": labels},
        "addressType": family,
        "endpoints": list(endpoints),
        "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}] if ports is None else ports,
    }


def listed(*slices: dict[str, Any], version: str = "10") -> SliceView:
    view = SliceView(ME)
    view.listed({"metadata": {"resourceVersion": version}, "items": list(slices)})
    return view


def test_a_list_gives_every_serving_endpoint_but_this_agent() -> None:
    view = listed(
        slice_(
            "s1",
            endpoint("agent-me", "10.0.0.1"),
            endpoint("agent-b", "10.0.0.3"),
            endpoint("agent-a", "10.0.0.2"),
        )
    )
    assert view.peers() == ("http://10.0.0.2:8080", "http://10.0.0.3:8080")
    assert view.resource_version == "10"


@pytest.mark.parametrize(
    ("conditions", "peer"),
    [
        ({}, True),
        # publishNotReadyAddresses: ready is true for a pod that is not serving.
        ({"ready": True, "serving": False}, False),
        ({"ready": False, "serving": True, "terminating": True}, False),
        ({"ready": True, "serving": True, "terminating": True}, False),
        # serving nil defers to ready; ready nil means ready (discovery.k8s.io/v1).
        ({"serving": None, "ready": False}, False),
        ({"serving": None, "ready": None, "terminating": None}, True),
    ],
)
def test_only_serving_endpoints_that_are_not_terminating(
    conditions: dict[str, bool | None], peer: bool
) -> None:
    view = listed(slice_("s1", endpoint("agent-a", "10.0.0.2", **conditions)))
    assert view.peers() == (("http://10.0.0.2:8080",) if peer else ())


def test_this_agent_is_known_by_its_pod_name_or_its_ip() -> None:
    by_name = SliceView(Me(pod_name="agent-me"))
    by_ip = SliceView(Me(pod_ip="10.0.0.1"))
    for view in (by_name, by_ip):
        view.listed({"items": [slice_("s", endpoint("agent-me", "10.0.0.1"))]})
        assert view.peers() == ()
    untargeted = {"addresses": ["10.0.0.1"], "conditions": {"ready": True}}
    by_ip.listed({"items": [slice_("s", untargeted)]})
    assert by_ip.peers() == ()


def test_the_port_named_http_else_the_only_one() -> None:
    two = [{"name": "metrics", "port": 9100}, {"name": "http", "port": 8081}]
    assert listed(slice_("s", endpoint("a", "10.0.0.2"), ports=two)).peers() == (
        "http://10.0.0.2:8081",
    )
    one = [{"name": "other", "port": 9000}]
    assert listed(slice_("s", endpoint("a", "10.0.0.2"), ports=one)).peers() == (
        "http://10.0.0.2:9000",
    )


@pytest.mark.parametrize(
    "ports",
    [[], [{"name": "a", "port": 1}, {"name": "b", "port": 2}], [{"name": "http"}]],
    ids=["none", "two-unnamed", "nil-port"],
)
def test_a_slice_without_a_usable_port_is_left_out_and_said(ports: list[dict[str, Any]]) -> None:
    view = listed(slice_("s", endpoint("a", "10.0.0.2"), ports=ports))
    assert view.peers() == ()
    assert view.skipped == ["EndpointSlice s: no port named http"]


def test_dual_stack_one_peer_per_pod_at_its_ipv4_address() -> None:
    view = listed(
        slice_("v6", endpoint("a", "fd00::2"), endpoint("b", "fd00::3"), family="IPv6"),
        slice_("v4", endpoint("a", "10.0.0.2")),
    )
    assert view.peers() == ("http://10.0.0.2:8080", "http://[fd00::3]:8080")
    fqdn = listed(slice_("f", endpoint("a", "agent.example"), family="FQDN"))
    assert fqdn.peers() == () and fqdn.skipped == ["EndpointSlice f: addressType FQDN"]


def test_https_when_this_agent_serves_tls() -> None:
    view = SliceView(ME, scheme="https")
    view.listed({"items": [slice_("s", endpoint("a", "10.0.0.2"))]})
    assert view.peers() == ("https://10.0.0.2:8080",)


def test_watch_events_add_change_and_drop_peers_and_move_the_version_on() -> None:
    view = listed(slice_("s1", endpoint("a", "10.0.0.2")))
    assert (
        view.event(
            {"type": "ADDED", "object": slice_("s2", endpoint("b", "10.0.0.3"), version="11")}
        )
        is Step.WATCH
    )
    assert view.peers() == ("http://10.0.0.2:8080", "http://10.0.0.3:8080")
    assert view.resource_version == "11"
    # A pod goes: its slice is MODIFIED without it.
    assert view.event({"type": "MODIFIED", "object": slice_("s1", version="12")}) is Step.WATCH
    assert view.peers() == ("http://10.0.0.3:8080",)
    # A pod stops serving (its readiness probe fails): dropped, then back.
    notready = slice_("s2", endpoint("b", "10.0.0.3", serving=False), version="13")
    assert view.event({"type": "MODIFIED", "object": notready}) is Step.WATCH
    assert view.peers() == ()
    view.event(
        {"type": "MODIFIED", "object": slice_("s2", endpoint("b", "10.0.0.3"), version="14")}
    )
    assert view.peers() == ("http://10.0.0.3:8080",)
    assert view.event({"type": "DELETED", "object": slice_("s2", version="15")}) is Step.WATCH
    assert view.peers() == () and view.resource_version == "15"


def test_a_bookmark_only_moves_the_version() -> None:
    view = listed(slice_("s1", endpoint("a", "10.0.0.2")))
    bookmark = {
        "type": "BOOKMARK",
        "object": {"kind": "EndpointSlice", "metadata": {"resourceVersion": "99"}},
    }
    assert view.event(bookmark) is Step.WATCH
    assert view.resource_version == "99" and view.peers() == ("http://10.0.0.2:8080",)


def test_410_gone_and_other_errors_relist_and_forget_the_version() -> None:
    view = listed(slice_("s1", endpoint("a", "10.0.0.2")))
    gone = {"type": "ERROR", "object": {"kind": "Status", "code": 410, "reason": "Expired"}}
    assert view.event(gone) is Step.RELIST
    assert view.resource_version is None
    assert view.peers() == ("http://10.0.0.2:8080",)  # kept until the list answers
    for odd in ({"type": "WHAT", "object": {}}, {"type": "ADDED"}):
        assert listed().event(odd) is Step.RELIST


def test_a_relist_replaces_everything_known() -> None:
    view = listed(slice_("s1", endpoint("a", "10.0.0.2")), slice_("s2", endpoint("b", "10.0.0.3")))
    view.listed(
        {"metadata": {"resourceVersion": "20"}, "items": [slice_("s2", endpoint("b", "10.0.0.3"))]}
    )
    assert view.peers() == ("http://10.0.0.3:8080",)
    assert view.resource_version == "20"


def test_a_slice_the_endpointslice_controller_does_not_manage_is_left_out() -> None:
    # A hand-made slice with the Service's label: whoever may create one would otherwise
    # point the agents (and their API key) at an address of their choosing.
    view = listed(
        slice_("s1", endpoint("agent-a", "10.0.0.2")),
        slice_("evil", endpoint("agent-x", "192.0.2.66"), managed_by="someone"),
    )
    assert view.peers() == ("http://10.0.0.2:8080",)
    assert view.skipped == [f"EndpointSlice evil: not managed by {MANAGED_BY} (a hand-made slice)"]
    unlabelled = slice_("bare", endpoint("agent-y", "192.0.2.67"))
    del unlabelled["metadata"]["labels"]
    assert view.event({"type": "ADDED", "object": unlabelled}) is Step.WATCH
    assert view.peers() == ("http://10.0.0.2:8080",)
    # A managed slice that loses its label is dropped.
    relabelled = slice_("s1", endpoint("agent-a", "10.0.0.2"), managed_by="someone")
    view.event({"type": "MODIFIED", "object": relabelled})
    assert view.peers() == ()


@pytest.mark.parametrize(
    "endpoints",
    [
        "10.0.0.9",
        {"addresses": ["10.0.0.9"]},  # an object, not a list
        [["10.0.0.9"]],  # an endpoint that is a list
        [None],
        [{"addresses": "10.0.0.9"}],
        [{"addresses": [None]}],
        [{"addresses": ["10.0.0.9"], "conditions": ["ready"]}],
        [{"addresses": ["10.0.0.9"], "targetRef": "agent-z"}],
    ],
)
def test_a_slice_of_an_unexpected_shape_is_left_out_and_said(endpoints: Any) -> None:
    bad = slice_("bad")
    bad["endpoints"] = endpoints
    view = listed(slice_("s1", endpoint("agent-a", "10.0.0.2")), bad)
    assert view.peers() == ("http://10.0.0.2:8080",)
    assert len(view.skipped) == 1 and view.skipped[0].startswith(
        "EndpointSlice bad: endpoints of an unexpected shape"
    ), view.skipped


@pytest.mark.parametrize(
    "item", [None, ["s1"], "s1", {"metadata": ["x"], "addressType": "IPv4", "ports": {}}]
)
def test_a_list_item_of_an_unexpected_shape_is_left_out_and_said(item: Any) -> None:
    view = listed(slice_("s1", endpoint("agent-a", "10.0.0.2")), item)
    assert view.peers() == ("http://10.0.0.2:8080",)
    assert len(view.skipped) == 1, view.skipped


@pytest.mark.parametrize("body", [None, [], "items", {"items": {"a": 1}}])
def test_a_list_answer_that_is_no_list_is_an_error_and_changes_nothing(body: Any) -> None:
    view = listed(slice_("s1", endpoint("agent-a", "10.0.0.2")))
    with pytest.raises(ValueError, match="the list answer is not an EndpointSliceList"):
        view.listed(body)
    assert view.peers() == ("http://10.0.0.2:8080",)


@pytest.mark.parametrize("event", [None, [], "ADDED", {"type": "ADDED", "object": None}])
def test_a_watch_event_of_an_unexpected_shape_relists_and_is_said(event: Any) -> None:
    view = listed(slice_("s1", endpoint("agent-a", "10.0.0.2")))
    assert view.event(event) is Step.RELIST
    assert view.peers() == ("http://10.0.0.2:8080",)
    assert len(view.skipped) == 1 and "not a watch event" in view.skipped[0]
