"""``make images``: what it builds and pushes, with a recording stand-in for docker."""

from __future__ import annotations

import os
import shlex
import subprocess
from pathlib import Path

from tests import readme

REPO = Path(__file__).resolve().parents[2]


def make_images(tmp_path: Path, **variables: str) -> tuple[subprocess.CompletedProcess[str], str]:
    log = tmp_path / "calls"
    fake = tmp_path / "docker"
    fake.write_text(f'#!/bin/sh\necho "$*" >> {log}\n')
    fake.chmod(0o755)
    args = [f"{k}={v}" for k, v in {"CONTAINER": str(fake), **variables}.items()]
    run = subprocess.run(
        ["make", "--no-print-directory", "images", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        env={k: v for k, v in os.environ.items() if k not in {"REGISTRY", "TAG", "PUSH"}},
    )
    return run, log.read_text() if log.exists() else ""


def test_builds_and_pushes_both_images(tmp_path: Path) -> None:
    run, calls = make_images(tmp_path, REGISTRY="registry.example.com/team/", TAG="9.9", PUSH="1")
    assert run.returncode == 0, run.stderr
    assert calls.splitlines() == [
        "build -f Dockerfile.agent --build-arg VARIANT=cuda"
        " -t registry.example.com/team/corral-agent:9.9-cuda .",
        "build -f Dockerfile.agent --build-arg VARIANT=cpu"
        " -t registry.example.com/team/corral-agent:9.9-cpu .",
        "build -f Dockerfile.operator -t registry.example.com/team/corral-operator:9.9 .",
        "push registry.example.com/team/corral-agent:9.9-cuda",
        "push registry.example.com/team/corral-agent:9.9-cpu",
        "push registry.example.com/team/corral-operator:9.9",
    ]
    assert "agent.image.repository=registry.example.com/team/corral-agent" in run.stdout


def test_the_readmes_images_line_builds_and_pushes_what_its_helm_line_names(
    tmp_path: Path,
) -> None:
    line = readme.shown("make images ")
    variables = dict(word.split("=", 1) for word in shlex.split(line)[2:])
    run, calls = make_images(tmp_path, **variables)
    assert run.returncode == 0, run.stderr
    helm = readme.shown("helm install corral ")
    for image in ("corral-agent", "corral-operator"):
        repository = f"{variables['REGISTRY']}/{image}"
        assert f"push {repository}:{variables['TAG']}" in calls
        assert f"image.repository={repository} " in helm + " "


def test_tag_defaults_to_the_charts_app_version_and_push_is_opt_in(tmp_path: Path) -> None:
    run, calls = make_images(tmp_path, REGISTRY="r.example")
    assert run.returncode == 0, run.stderr
    assert "-t r.example/corral-operator:0.1.0 ." in calls
    assert "push" not in calls


def test_registry_is_required(tmp_path: Path) -> None:
    run, calls = make_images(tmp_path)
    assert run.returncode != 0 and calls == ""
    assert "set REGISTRY" in run.stderr


def test_the_agent_image_pins_the_llama_cpp_build_corral_follows() -> None:
    # Floating `server` / `server-cuda` tags would give the children another llama.cpp than
    # the one whose options the agent, the CRD's allow-list and the tests know.
    from node_agent.llama_server.plan import LLAMA_CPP_BUILD

    dockerfile = (REPO / "Dockerfile.agent").read_text()
    assert f"ARG LLAMA_CPP_CPU_TAG=server-b{LLAMA_CPP_BUILD}\n" in dockerfile
    assert f"ARG LLAMA_CPP_CUDA_TAG=server-cuda-b{LLAMA_CPP_BUILD}\n" in dockerfile
