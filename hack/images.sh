#!/usr/bin/env bash
# Builds (and with PUSH=1 pushes) the chart's images from the Dockerfiles:
#   <REGISTRY>/corral-agent:<TAG>-cuda, <REGISTRY>/corral-agent:<TAG>-cpu (Dockerfile.agent)
#   <REGISTRY>/corral-operator:<TAG>                                     (Dockerfile.operator)
# Usage: make images REGISTRY=registry.example.com/team [TAG=0.1.0] [PUSH=1] [CONTAINER=podman]
# TAG defaults to the chart's appVersion, the tag the chart deploys unless told otherwise.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -z "${REGISTRY:-}" ]; then
  echo "make images: set REGISTRY to where the images go, e.g." \
    "make images REGISTRY=registry.example.com/team TAG=0.1.0" >&2
  exit 2
fi
registry=${REGISTRY%/}
tag=${TAG:-$(sed -n 's/^appVersion: *"\{0,1\}\([^"]*\)"\{0,1\}$/\1/p' charts/corral/Chart.yaml)}
tool=${CONTAINER:-docker}
images=()
for variant in cuda cpu; do
  image="$registry/corral-agent:$tag-$variant"
  "$tool" build -f Dockerfile.agent --build-arg "VARIANT=$variant" -t "$image" .
  images+=("$image")
done
image="$registry/corral-operator:$tag"
"$tool" build -f Dockerfile.operator -t "$image" .
images+=("$image")
if [ -n "${PUSH:-}" ]; then
  for image in "${images[@]}"; do
    "$tool" push "$image"
  done
fi
printf 'built%s:\n' "${PUSH:+ and pushed}"
printf '  %s\n' "${images[@]}"
echo "install with --set agent.image.repository=$registry/corral-agent" \
  "--set operator.image.repository=$registry/corral-operator"
