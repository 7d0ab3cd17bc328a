"""Where ``--peers-from-service`` finds the apiserver and the Service's namespace
(api/peer_discovery.py): in-cluster from the pod's env and service-account files, or
``--kube-api`` as given; every missing piece is a clear error before the agent starts."""

from __future__ import annotations

from pathlib import Path

import pytest

from node_agent.api.peer_discovery import KubeApi, kube_api, service_namespace
from node_agent.errors import ConfigError

IN_CLUSTER = {"KUBERNETES_SERVICE_HOST": "10.96.0.1", "KUBERNETES_SERVICE_PORT": "443"}


def test_kube_api_as_given_is_asked_without_credentials(tmp_path: Path) -> None:
    api = kube_api("http://127.0.0.1:8001", IN_CLUSTER, tmp_path)
    assert (api.server, api.headers(), api.ssl_context) == ("http://127.0.0.1:8001", {}, None)


def test_outside_a_pod_the_error_says_what_to_give(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"not in a Kubernetes pod .* give --kube-api URL"):
        kube_api(None, {}, tmp_path)


def test_a_pod_without_its_token_says_how_to_mount_it(tmp_path: Path) -> None:
    (tmp_path / "ca.crt").write_text("x")
    with pytest.raises(ConfigError, match=r"token missing\): mount the token"):
        kube_api(None, IN_CLUSTER, tmp_path)


def test_a_ca_that_is_not_a_certificate_is_an_error(tmp_path: Path) -> None:
    (tmp_path / "token").write_text("t")
    (tmp_path / "ca.crt").write_text("not a certificate")
    with pytest.raises(ConfigError, match=r"the cluster CA .*ca\.crt: no CA certificates read"):
        kube_api(None, IN_CLUSTER, tmp_path)


def test_the_token_is_read_at_each_request(tmp_path: Path) -> None:
    # Projected tokens rotate: the kubelet rewrites the file.
    token = tmp_path / "token"
    api = KubeApi("https://10.96.0.1:443", token_file=token)
    token.write_text("first\n")
    assert api.headers() == {"Authorization": "Bearer first"}
    token.write_text("second\n")
    assert api.headers() == {"Authorization": "Bearer second"}


def test_the_namespace_as_given_else_the_pods_own(tmp_path: Path) -> None:
    assert service_namespace("ml", {"POD_NAMESPACE": "x"}, tmp_path) == "ml"
    assert service_namespace(None, {"POD_NAMESPACE": "corral"}, tmp_path) == "corral"
    with pytest.raises(ConfigError, match="give it as NAMESPACE/NAME"):
        service_namespace(None, {}, tmp_path)
    (tmp_path / "namespace").write_text("from-account\n")
    assert service_namespace(None, {}, tmp_path) == "from-account"
