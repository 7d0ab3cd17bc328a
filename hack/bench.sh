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
# Not `python -m bench.run`: that puts the repository first on sys.path, where operator/
# would shadow the standard library's module. Append it instead, and run the module.
export PYTHONSAFEPATH=1
exec python -c 'import runpy, sys; sys.path.append(sys.argv.pop(1))
runpy.run_module("bench.run", run_name="__main__", alter_sys=True)' "$PWD" "$@"
