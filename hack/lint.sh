#!/usr/bin/env bash
# Static checks: ruff (lint + format), mypy --strict on both packages, import-linter layers.
set -euo pipefail
cd "$(dirname "$0")/.."
hack/setup.sh lint
# shellcheck disable=SC1091
. .venv/bin/activate
ruff check .
ruff format --check .
# mypy cannot follow the editable install's folder mapping: the operator's package is found
# under operator/.
MYPYPATH=operator mypy --strict -p node_agent -p preset_operator
lint-imports
