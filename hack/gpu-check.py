#!/usr/bin/env python3
"""The checks of hack/gpu-check.sh (which builds or finds ``$LLAMA_SERVER`` first), one table.

``gpu``: on a machine with NVIDIA GPUs. ``rehearse``: here, without one: the same estimator
table on the host's buffers; the checks that need a GPU are listed as not run.

1. NVML's figures agree with nvidia-smi's; the binary sees a GPU (``--list-devices``).
2. The estimator against the buffers the child logs at ``-lv 4``, on CUDA0 with ``-ngl 99``,
   for one generated model per architecture family: dense, MoE, sliding window, MLA (and the
   real SmolLM2 where installed): within 10% each.
3. The ledger evicts by real VRAM: with ``--models-memory-margin`` set so that only one model
   fits what NVML says is free, loading a second unloads the first.
4. Placement through ``CUDA_VISIBLE_DEVICES`` (a preset's ``env.``): the child holds memory on
   that GPU only, as NVML reports per process.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from node_agent.llama_server.binary import set_in_use
from node_agent.memory.devices import load_nvml
from node_agent.memory.estimator import estimate
from tests.arch_models import ARCH_MODELS, write_arch_models
from tests.buffers import MIB
from tests.integration.child_buffers import logged_buffers
from tests.integration.harness import AgentProcess, chat

FAMILIES = {"dense": "qwen3", "MoE": "qwen3moe", "sliding window": "gemma3", "MLA": "deepseek2"}
GOAL = 0.10
rows: list[tuple[str, str, str]] = []


def row(check: str, ok: bool | None, figures: str) -> None:
    rows.append((check, {True: "ok", False: "FAIL", None: "not run"}[ok], figures))


def nvml_checks(nvml: object, binary: str) -> None:
    smi = subprocess.run(
        ["nvidia-smi", "--query-gpu=memory.total", "--format=csv,noheader,nounits"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    for i, total_mib in enumerate(smi):
        info = nvml.nvmlDeviceGetMemoryInfo(nvml.nvmlDeviceGetHandleByIndex(i))  # type: ignore[attr-defined]
        same = abs(info.total / MIB - int(total_mib)) <= int(total_mib) * 0.01
        row(f"CUDA{i}: NVML total = nvidia-smi", same, f"{info.total / MIB:.0f} / {total_mib} MiB")
    listed = subprocess.run([binary, "--list-devices"], capture_output=True, text=True)
    devices = " | ".join(ln.strip() for ln in (listed.stdout + listed.stderr).splitlines()[:4])
    row("llama-server --list-devices sees a GPU", "CUDA0" in devices, devices)


def estimator_table(binary: str, models: list[tuple[str, Path]], gpu: bool) -> None:
    device, args = ("CUDA0", ["-ngl", "99"]) if gpu else ("host", ["-ngl", "0"])
    options: dict[str, str | None] = {"c": "4096", "ngl": args[1]}
    set_in_use(Path(binary))
    for label, path in models:
        logged, error = logged_buffers(binary, path, ["-c", "4096", *args])
        got = logged.per_device()
        child_device = "CUDA0" if gpu else "host"
        measured = got.get(child_device, 0)
        est = estimate(path, options, ["host", "CUDA0"] if gpu else ["host"]).devices[device].total
        if not measured:
            row(f"estimate {label} on {device}", False, error or "the child logged no buffers")
            continue
        err = est / measured - 1
        row(
            f"estimate {label} on {device}",
            abs(err) <= GOAL,
            f"{est / MIB:.1f} MiB estimated, {measured / MIB:.1f} MiB logged ({err:+.1%})",
        )


def eviction_by_vram(binary: str, nvml: object, model: Path) -> None:
    folder = Path(tempfile.mkdtemp(prefix="gpu-check-evict-"))
    for name in ("first", "second"):
        (folder / f"{name}.gguf").symlink_to(model)
    need = estimate(model, {"c": "4096", "ngl": "99"}, ["host", "CUDA0"]).devices["CUDA0"].total
    free = nvml.nvmlDeviceGetMemoryInfo(nvml.nvmlDeviceGetHandleByIndex(0)).free  # type: ignore[attr-defined]
    margin_mib = int((free - need * 1.5) / MIB)  # room for one model, not two
    agent = AgentProcess(
        [
            *("--models-dir", str(folder), "--models-max", "0", "-c", "4096", "-ngl", "99"),
            *("--models-memory-margin", str(margin_mib)),
        ],
        {"LLAMA_SERVER": binary, "CUDA_VISIBLE_DEVICES": "0"},
    )
    try:
        first = agent.post("/v1/chat/completions", chat("first", max_tokens=4))[0]
        second = agent.post("/v1/chat/completions", chat("second", max_tokens=4))[0]
        states = {n: agent.models()[n]["status"]["value"] for n in ("first", "second")}
        ok = first == second == 200 and states == {"first": "unloaded", "second": "loaded"}
        row(
            "the ledger evicts by real VRAM",
            ok,
            f"margin {margin_mib} MiB of {free / MIB:.0f} free, {need / MIB:.0f} MiB a model: "
            f"{states}",
        )
    finally:
        agent.stop()


def placement_by_env(binary: str, nvml: object, model: Path, count: int) -> None:
    gpu = count - 1  # the last GPU: not where a default placement would start
    preset = Path(tempfile.mkdtemp(prefix="gpu-check-env-")) / "presets.ini"
    preset.write_text(f"[pinned]\nmodel = {model}\nngl = 99\nenv.CUDA_VISIBLE_DEVICES = {gpu}\n")
    agent = AgentProcess(["--models-preset", str(preset)], {"LLAMA_SERVER": binary})
    try:
        status = agent.post("/v1/chat/completions", chat("pinned", max_tokens=4))[0]
        pid = agent.models()["pinned"]["corral"]["pid"]
        held = {}
        for i in range(count):
            handle = nvml.nvmlDeviceGetHandleByIndex(i)  # type: ignore[attr-defined]
            procs = nvml.nvmlDeviceGetComputeRunningProcesses(handle)  # type: ignore[attr-defined]
            used = sum(int(p.usedGpuMemory or 0) for p in procs if p.pid == pid)
            if used:
                held[f"CUDA{i}"] = f"{used / MIB:.0f} MiB"
        ok = status == 200 and list(held) == [f"CUDA{gpu}"]
        row(f"CUDA_VISIBLE_DEVICES={gpu} places the child there", ok, f"NVML: {held}")
    finally:
        agent.stop()


def main(mode: str) -> int:
    binary = os.environ["LLAMA_SERVER"]
    gpu = mode == "gpu"
    models = Path(tempfile.mkdtemp(prefix="gpu-check-models-"))
    wanted = [m for m in ARCH_MODELS if m.arch in FAMILIES.values()]
    paths = dict(zip([m.arch for m in wanted], write_arch_models(models, wanted), strict=True))
    table = [(f"{family} ({arch})", paths[arch]) for family, arch in FAMILIES.items()]
    from node_agent.real_model import real_model_path

    real = real_model_path()
    if real is not None:
        table.append(("SmolLM2-135M (Q4_1)", real))
    if os.environ.get("MODELS"):
        table += [(p.stem, p) for p in sorted(Path(os.environ["MODELS"]).glob("*.gguf"))]

    nvml = load_nvml() if gpu else None
    if gpu and nvml is None:
        row("NVML", False, "did not initialise (is the driver loaded? pip install nvidia-ml-py)")
    if nvml is not None:
        nvml_checks(nvml, binary)
    estimator_table(binary, table, gpu and nvml is not None)
    if nvml is not None:
        eviction_by_vram(binary, nvml, real or paths["qwen3"])
        placement_by_env(binary, nvml, paths["qwen3"], nvml.nvmlDeviceGetCount())
    else:
        row("the ledger evicts by real VRAM", None, "no GPU")
        row("CUDA_VISIBLE_DEVICES places the child there", None, "no GPU")

    print(f"\n{mode}: {binary}\n| check | result | figures |\n|---|---|---|")
    for check, result, figures in rows:
        print(f"| {check} | {result} | {figures} |")
    failed = sum(result == "FAIL" for _, result, _ in rows)
    print(f"gpu-check: {'all checks passed' if not failed else f'{failed} failed'}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else "gpu"))
