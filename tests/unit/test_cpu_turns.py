"""``--cpu-turns``: whether the agent makes models take turns on the CPU, and which ones
(the turns themselves: test_scheduler_turns.py)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from node_agent.config import parse_agent_args
from node_agent.errors import ConfigError
from node_agent.llama_server.devices import (
    env_threads,
    list_devices,
    no_turns_because,
    parse_devices,
)
from node_agent.runtime.registry import Registry
from node_agent.sources.catalog import Catalog
from node_agent.sources.spec import ModelSpec

# b11434's own output (common_print_available_devices), from a CPU build and a CUDA one.
CPU_ONLY = "Available devices:\n  (none)\n"
CUDA = (
    "ggml_cuda_init: found 1 CUDA devices:\n"
    "Available devices:\n"
    "  CUDA0: NVIDIA H200 (143771 MiB, 142942 MiB free)\n"
)
# A CPU build with a BLAS library (GGML_BLAS): ggml lists it as a device (an "accelerator"),
# yet it computes on the CPU's cores, beside a thread per core of the child's own.
BLAS = "Available devices:\n  BLAS: OpenBLAS (0 MiB, 0 MiB free)\n"


def test_the_devices_listed_by_llama_server_are_read() -> None:
    assert parse_devices(CPU_ONLY) == ()
    assert parse_devices(CUDA) == ("CUDA0: NVIDIA H200 (143771 MiB, 142942 MiB free)",)
    for unknown in ("", "usage: llama-server [options]\n", "Available devices:\n"):
        assert parse_devices(unknown) is None


def _binary(path: Path, script: str) -> Path:
    path.write_text(f"#!/bin/sh\n{script}\n")
    path.chmod(0o755)
    return path


def test_a_binary_that_cannot_list_its_devices_says_nothing(tmp_path: Path) -> None:
    assert list_devices(_binary(tmp_path / "cpu", f"printf '{CPU_ONLY}'")) == ()
    assert list_devices(_binary(tmp_path / "old", "echo 'error: invalid argument'; exit 1")) is None
    assert list_devices(tmp_path / "missing") is None
    assert list_devices(_binary(tmp_path / "slow", "sleep 5"), timeout=0.2) is None


def test_models_take_turns_where_the_children_compute_on_the_cpu_alone() -> None:
    assert no_turns_because(()) is None
    assert no_turns_because(parse_devices(CUDA)) == "the children may compute on CUDA0: NVIDIA H200"
    assert no_turns_because(None) == (  # the binary could not say: as llama.cpp
        "llama-server --list-devices did not say what its children compute on"
    )


def test_threads_in_the_environment() -> None:
    assert env_threads({}) is None
    assert env_threads({"LLAMA_ARG_THREADS": "-1"}) is None  # llama.cpp's default
    assert env_threads({"LLAMA_ARG_THREADS": "4"}) == 4
    assert env_threads({"LLAMA_ARG_THREADS": "many"}) == 2  # refused by the child anyway


def test_a_library_that_computes_on_the_cpu_is_the_cpu_alone() -> None:
    zendnn = "  ZenDNN: ZenDNN: AMD optimized primitives backend for GGML (0 MiB, 0 MiB free)\n"
    assert no_turns_because(parse_devices(BLAS)) is None
    assert no_turns_because(parse_devices(BLAS + zendnn)) is None
    both = parse_devices(BLAS + CUDA.splitlines()[-1])  # and a GPU
    assert no_turns_because(both) == "the children may compute on CUDA0: NVIDIA H200"


def test_cpu_turns_takes_a_duration() -> None:
    assert parse_agent_args([], {}).cpu_turns == 1.0
    turns = [parse_agent_args(["--cpu-turns", t], {}).cpu_turns for t in ("500ms", "2", "0")]
    assert turns == [0.5, 2.0, 0.0]
    for bad, why in (("-1", "must be >= 0"), ("soon", "a duration like 1s")):
        with pytest.raises(ConfigError, match=f"--cpu-turns .*{re.escape(why)}"):
            parse_agent_args(["--cpu-turns", bad], {})


def _spec(name: str, *options: tuple[str, str], env: tuple[tuple[str, str], ...] = ()) -> ModelSpec:
    return ModelSpec(name, "preset", options=(("model", f"/m/{name}.gguf"), *options), env=env)


SPECS = {
    "plain": _spec("plain"),
    "threads": _spec("threads", ("threads", "2")),
    "one": _spec("one", ("threads", "1")),
    "default": _spec("default", ("threads", "-1")),  # llama.cpp's: a thread per core
    "batch": _spec("batch", ("threads-batch", "2")),  # the prompt's only
    "cores": _spec("cores", ("cpu-range", "0-3")),
    "env": _spec("env", env=(("LLAMA_ARG_THREADS", "2"),)),
    "env-one": _spec("env-one", env=(("LLAMA_ARG_THREADS", "1"),)),
}


@pytest.mark.parametrize("turn", [1.0, 0.0])
@pytest.mark.parametrize("threads", [None, 3, 1])
def test_a_model_of_one_thread_or_cores_of_its_own_takes_no_turns(
    turn: float, threads: int | None
) -> None:
    """``threads``: every child's (the agent's choice, or LLAMA_ARG_THREADS; None: a thread
    per core). A child of several threads takes turns, whoever chose them: two at once spin
    at each other's barriers (issue 48)."""
    registry = Registry(
        Catalog(SPECS, {}),
        models_max=2,
        child_factory=lambda spec: None,
        cpu_turn=turn,
        child_threads=threads,
    )
    turns = {name: registry._config(spec).turns for name, spec in SPECS.items()}
    on, several = turn > 0, turn > 0 and threads != 1
    assert turns == {"plain": several, "threads": on, "one": False, "default": several,
                     "batch": several, "cores": False, "env": on, "env-one": False}  # fmt: skip
    assert registry.scheduler.turn == turn


def test_the_agent_gives_threads_only_to_a_model_that_chose_none() -> None:
    chose = {name: spec.chooses_threads for name, spec in SPECS.items()}
    assert chose == {"plain": False, "threads": True, "one": True, "default": True,
                     "batch": False, "cores": True, "env": True, "env-one": True}  # fmt: skip
