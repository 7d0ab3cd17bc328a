#!/usr/bin/env bash
# Benchmarks (issue 6): Corral vs llama.cpp's router vs a direct child, in one run.
# Usage: hack/bench.sh [--smoke] [--only S1,S3] [--targets corral,llama.cpp,direct]
#                      [--out bench/results]
# Prints a markdown table; writes <out>/latest.md and <out>/latest.json.
set -euo pipefail
cd "$(dirname "$0")/.."
hack/setup.sh
# shellcheck disable=SC1091
. .venv/bin/activate
exec python -m bench.run "$@"
