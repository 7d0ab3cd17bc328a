#!/usr/bin/env bash
# Static checks: ruff (lint + format), mypy --strict on both packages, import-linter layers.
set -euo pipefail
cd "$(dirname "$0")/.."
# The repository's operator/ folder would shadow the standard library's `operator` module for
# any `python -m …` started here (the current folder comes first on sys.path): never add it.
export PYTHONSAFEPATH=1
hack/setup.sh
# shellcheck disable=SC1091
. .venv/bin/activate
ruff check .
ruff format --check .
# mypy cannot follow the editable install's folder mapping (operator/ -> preset_operator):
# point it at a link with the import name instead.
mkdir -p build/typecheck
ln -sfn ../../operator build/typecheck/preset_operator
MYPYPATH=build/typecheck mypy --strict -p node_agent -p preset_operator
lint-imports
