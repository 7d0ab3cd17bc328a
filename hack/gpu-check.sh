#!/usr/bin/env bash
# On a machine with NVIDIA GPUs: check what the ledger and automatic placement rely on.
#
#   hack/gpu-check.sh                 # LLAMA_SERVER=path/to/a CUDA or Vulkan llama-server (default: corral llama-server build --cuda)
#   MODEL=some.gguf hack/gpu-check.sh # default: the real model (SmolLM2), else a demo model
#
# 1. NVML's figures per GPU agree with nvidia-smi's (total, used within 1%);
# 2. the llama-server binary sees a GPU (--list-devices names CUDA0 or Vulkan0);
# 3. a real agent (--models-memory-margin, automatic placement) starts the model on one GPU:
#    GET /models shows the placement, and NVML shows the child's memory on that GPU only;
# 4. the estimator's figure for that GPU against the buffers the child logs at -lv 4
#    (within 10%), and what NVML says the child really holds there;
# 5. with two or more GPUs, a second model's placement and that nothing was evicted.
# Exits 2 with "no NVIDIA GPU" where there is none (CI, laptops without one), 1 on a failed
# check. CI cannot run it: it is for a machine with a GPU, by hand.
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L >/dev/null 2>&1; then
  echo "gpu-check: no NVIDIA GPU (nvidia-smi is missing or lists no GPU); nothing checked" >&2
  exit 2
fi
[ -x .venv/bin/python ] || hack/setup.sh
# shellcheck disable=SC1091
. .venv/bin/activate
exec python - "$@" <<'PY'
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from node_agent.llama_server.binary import find_llama_server
from node_agent.memory.buffers import LoggedBuffers
from node_agent.memory.devices import load_nvml
from tests.integration.harness import AgentProcess, chat, http

MIB = 1 << 20
failures: list[str] = []


def check(ok: bool, what: str) -> None:
    print(("ok   " if ok else "FAIL ") + what)
    if not ok:
        failures.append(what)


nvml = load_nvml()
if nvml is None:
    print("gpu-check: no NVIDIA GPU (NVML did not initialise: pip install 'corral[nvidia]')")
    sys.exit(2)
count = nvml.nvmlDeviceGetCount()
handles = [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
smi = subprocess.run(
    ["nvidia-smi", "--query-gpu=index,memory.total,memory.used", "--format=csv,noheader,nounits"],
    capture_output=True, text=True, check=True,
).stdout.splitlines()
print(f"{count} GPU(s)")
for i, line in enumerate(smi[:count]):
    _, total_mib, used_mib = (int(x) for x in line.split(","))
    info = nvml.nvmlDeviceGetMemoryInfo(handles[i])
    print(f"     CUDA{i}: NVML total {info.total / MIB:.0f} MiB free {info.free / MIB:.0f} MiB;"
          f" nvidia-smi total {total_mib} used {used_mib}")
    same = abs(info.total / MIB - total_mib) <= total_mib * 0.01
    check(same, f"CUDA{i}: NVML total = nvidia-smi")

binary = find_llama_server(None, os.environ)
listed = subprocess.run([str(binary), "--list-devices"], capture_output=True, text=True)
devices = listed.stdout + listed.stderr
check("CUDA0" in devices or "Vulkan0" in devices, f"{binary} --list-devices sees a GPU")
print("     " + " | ".join(line.strip() for line in devices.splitlines() if line.strip()))

model = os.environ.get("MODEL")
if not model:
    from node_agent.real_model import real_model_path

    found = real_model_path()
    if found is None:
        from node_agent.demo_models import write_demo_models

        folder = Path(tempfile.mkdtemp(prefix="gpu-check-"))
        write_demo_models(folder)
        found = folder / "demo-medium.gguf"
    model = str(found)
folder = Path(tempfile.mkdtemp(prefix="gpu-check-models-"))
for name in ("one", "two"):
    (folder / f"{name}.gguf").symlink_to(Path(model).resolve())

agent = AgentProcess(["--models-dir", str(folder), "--models-max", "0",
                      "--models-memory-margin", "256", "-lv", "4"],
                     {"LLAMA_SERVER": str(binary)})
try:
    status, _ = agent.post("/v1/chat/completions", chat("one", max_tokens=8))
    check(status == 200, "a chat completion through a child on a GPU")
    entry = agent.models()["one"]
    memory = entry["corral"]["memory"]
    placement = memory["placement"] or {}
    print("     placement:", json.dumps(placement))
    gpus = placement.get("devices", [])
    check(len(gpus) >= 1 and placement.get("kind") in ("fits", "split"), "placed on a GPU")
    pid = entry["corral"]["pid"]
    held = {}
    for i, handle in enumerate(handles):
        procs = list(nvml.nvmlDeviceGetComputeRunningProcesses(handle))
        procs += list(nvml.nvmlDeviceGetGraphicsRunningProcesses(handle))  # Vulkan children
        used = sum(int(p.usedGpuMemory or 0) for p in procs if p.pid == pid)
        if used:
            held[f"CUDA{i}"] = used
    print("     NVML per-process:", {d: f"{b / MIB:.0f} MiB" for d, b in held.items()})
    check(set(held) <= set(gpus) and bool(held), "the child holds memory on its GPU(s) only")
    _, logs = http("GET", f"{agent.url}/models/logs?model=one&lines=5000")
    logged = LoggedBuffers().feed_all(str(logs).splitlines()).per_device()
    # Inside the child its GPUs are renumbered from 0 (CUDA_VISIBLE_DEVICES): map them back.
    inside = sorted(d for d in logged if d != "host")
    check(len(inside) == len(gpus), f"the child logged buffers on {len(gpus)} GPU(s)")
    for child_name, gpu in zip(inside, gpus, strict=False):
        estimate = memory["min"].get(gpu, 0)
        buffers = logged[child_name]
        ratio = estimate / buffers if buffers else float("inf")
        nvml_mib = held.get(gpu, 0) / MIB
        print(f"     {gpu}: estimate {estimate / MIB:.1f} MiB, logged buffers "
              f"{buffers / MIB:.1f} MiB ({child_name} in the child), NVML {nvml_mib:.1f} MiB")
        check(0.9 <= ratio <= 1.1, f"{gpu}: the estimator within 10% of the logged buffers")
    if count >= 2:
        status, _ = agent.post("/v1/chat/completions", chat("two", max_tokens=8))
        check(status == 200, "a second model")
        second = agent.models()["two"]["corral"]["memory"]["placement"]
        print("     second placement:", json.dumps(second))
        check("evicting model=" not in agent.log(), "no eviction for the second model")
finally:
    agent.stop()
print("gpu-check: " + ("all checks passed" if not failures else f"{len(failures)} failed"))
sys.exit(1 if failures else 0)
PY
