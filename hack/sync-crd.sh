#!/usr/bin/env bash
# Copy the CRDs from crds/ (their one source) into the chart, which can only read files
# inside itself. tests/chart/test_chart_crd.py fails whenever the copy drifts.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
dest="$root/charts/corral/files/crds"

mkdir -p "$dest"
# Remove copies whose source is gone, then copy every source byte for byte.
find "$dest" -maxdepth 1 -name '*.yaml' -type f -delete
cp -p "$root"/crds/*.yaml "$dest"/
ls -1 "$dest"
