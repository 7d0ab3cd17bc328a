#!/usr/bin/env bash
# The project's test command (README, CI): installs what it needs, then runs every test tier.
# Extra arguments go to pytest, e.g. `hack/test.sh tests/unit -k scheduler`.
set -euo pipefail
cd "$(dirname "$0")/.."
# Compiled modules and pytest's rewritten test files are cached in __pycache__ (ignored by
# git): with PYTHONDONTWRITEBYTECODE set, every run recompiles them (~4 s of the unit tier).
unset PYTHONDONTWRITEBYTECODE
hack/setup.sh
# shellcheck disable=SC1091
. .venv/bin/activate
exec python -m pytest "$@"
