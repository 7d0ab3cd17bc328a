#!/usr/bin/env bash
# Benchmarks (issue 6): Corral vs llama.cpp's router vs a direct child, in one run.
# Usage: hack/bench.sh [--smoke] [--only S1,S3] [--targets corral,llama.cpp,direct]
#                      [--out bench/results]
# Prints a markdown table; writes <out>/latest.md and <out>/latest.json.
set -euo pipefail
cd "$(dirname "$0")/.."
# The agent runs from compiled modules, as an installed one does (pip compiles them at install
# time): with PYTHONDONTWRITEBYTECODE set in a fresh checkout, every agent start in S6 would
# compile its ~80 modules from source (0.15 s more CPU, measured on 2 cores).
unset PYTHONDONTWRITEBYTECODE
hack/setup.sh
# shellcheck disable=SC1091
. .venv/bin/activate
exec python -m bench.run "$@"
