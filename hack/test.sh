#!/usr/bin/env bash
# The project's test command (README, CI): installs what it needs, then runs every test tier.
# Extra arguments go to pytest, e.g. `hack/test.sh tests/unit -k scheduler`.
set -euo pipefail
cd "$(dirname "$0")/.."
# The repository's operator/ folder would shadow the standard library's `operator` module for
# any `python -m …` started here (the current folder comes first on sys.path): never add it.
export PYTHONSAFEPATH=1
# Compiled modules and pytest's rewritten test files are cached in __pycache__ (ignored by
# git): with PYTHONDONTWRITEBYTECODE set, every run recompiles them (~4 s of the unit tier).
unset PYTHONDONTWRITEBYTECODE
hack/setup.sh
# shellcheck disable=SC1091
. .venv/bin/activate
exec python -m pytest "$@"
