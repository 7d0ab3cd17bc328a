#!/usr/bin/env bash
# Runs the agent on the built-in demo models (tiny generated GGUFs; nothing is downloaded).
# Extra arguments go to `corral agent`, e.g. `hack/demo.sh --port 9000`.
set -euo pipefail
cd "$(dirname "$0")/.."
# The repository's operator/ folder would shadow the standard library's `operator` module for
# any `python -m …` started here (the current folder comes first on sys.path): never add it.
export PYTHONSAFEPATH=1
hack/setup.sh
# shellcheck disable=SC1091
. .venv/bin/activate
corral demo-models demo-models
echo
echo "Try:  curl -s localhost:8080/v1/chat/completions -H 'Content-Type: application/json' \\"
echo "        -d '{\"model\":\"demo-tiny\",\"max_tokens\":16,\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}'"
echo
exec corral agent --models-dir demo-models --models-max 2 -c 2048 "$@"
