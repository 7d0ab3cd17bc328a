"""The cluster tier: one real control plane (hack/k8s-env.sh) for the whole session."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.cluster.control_plane import ControlPlane, binaries, down, up
from tests.cluster.release import RESTRICTED, Release, install, namespace
from tests.cluster.world import World, start_world
from tests.integration.conftest import demo_dir, llama_server
from tests.integration.harness import missing_in_ci_fails

__all__ = ["demo_dir", "llama_server"]

RELEASE = "corral"
NAMESPACE = "corral-system"


@pytest.fixture(scope="session")
def control_plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    if binaries() is None:
        # hack/setup.sh builds them when Go is installed (CI always does, so there this fails).
        missing_in_ci_fails(
            "the control plane is not built: hack/setup.sh, or hack/k8s-env.sh build "
            "(Go and its module proxy; ~16 minutes once)"
        )
    # A short path: the run folder holds the apiserver's certificates and sockets.
    run = Path(tmp_path_factory.mktemp("k8s", numbered=True))
    try:
        yield up(run)
    finally:
        down(run)


@pytest.fixture(scope="session")
def release(control_plane: ControlPlane, tmp_path_factory: pytest.TempPathFactory) -> Release:
    """The chart with its defaults (the images' names aside), installed by the real helm into
    a namespace where Pod Security enforces ``restricted``; not waited for: the tests say what
    went wrong when something did."""
    namespace(control_plane, NAMESPACE, RESTRICTED)
    return install(
        control_plane, RELEASE, NAMESPACE, {}, tmp_path_factory.mktemp("helm"), wait=False
    )


@pytest.fixture(scope="session")
def world(
    release: Release,
    demo_dir: Path,
    llama_server: str,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[World]:
    """Real agents on the DaemonSet's pods and the operator with its ServiceAccount's token."""
    yield from start_world(release, demo_dir, llama_server, tmp_path_factory)
