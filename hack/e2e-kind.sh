#!/usr/bin/env bash
# End to end on a throwaway kind cluster (needs Docker; cannot run in CI here):
#   build the CPU agent image and the operator image, load them into kind, install the chart
#   with an API key and the node's caches prepared as the chart's README tells a user, apply a
#   ModelPreset for a generated demo model (localPath) and one that downloads it (url, from an
#   HTTP server in the cluster), wait until both are Ready, and send a chat completion through
#   the preset's own Service.
#
#   hack/e2e-kind.sh            # creates cluster "corral-e2e", deletes it at the end
#   KEEP_CLUSTER=1 hack/e2e-kind.sh   # leave the cluster up to poke at it
#
# Requires: docker, kind, kubectl, helm (v3.8+ or v4), jq.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"

CLUSTER="${CLUSTER:-corral-e2e}"
NAMESPACE="${NAMESPACE:-corral-system}"
RELEASE="${RELEASE:-corral}"
PRESET="${PRESET:-demo}"
# The names `make images REGISTRY=corral.e2e` gives (the chart's default tags: appVersion).
app_version="$(sed -n 's/^appVersion: *"\{0,1\}\([^"]*\)"\{0,1\}$/\1/p' charts/corral/Chart.yaml)"
AGENT_REPOSITORY="${AGENT_REPOSITORY:-corral.e2e/corral-agent}"
OPERATOR_REPOSITORY="${OPERATOR_REPOSITORY:-corral.e2e/corral-operator}"
AGENT_IMAGE="$AGENT_REPOSITORY:$app_version-cpu"
OPERATOR_IMAGE="$OPERATOR_REPOSITORY:$app_version"
TIMEOUT="${TIMEOUT:-300s}"
KEEP_CLUSTER="${KEEP_CLUSTER:-0}"

# Everything this run creates on the host lives here, and goes in cleanup.
workdir="$(mktemp -d "${TMPDIR:-/tmp}/corral-e2e.XXXXXX")"
models_dir="$workdir/models"
kubeconfig="$workdir/kubeconfig"
export KUBECONFIG="$kubeconfig"  # never touch the user's own kubeconfig or context
cluster_created=0

log() { printf '\n==> %s\n' "$*" >&2; }

cleanup() {
  local status=$?
  set +e
  if [[ $status -ne 0 && $cluster_created -eq 1 ]]; then
    log "failed (exit $status): cluster state for the post-mortem"
    kubectl get nodes,pods,svc,modelpresets -A -o wide
    kubectl -n "$NAMESPACE" describe pods
    kubectl -n "$NAMESPACE" logs -l app.kubernetes.io/instance="$RELEASE" --all-containers \
      --prefix --tail=200
    kubectl get modelpreset "$PRESET" -o yaml
  fi
  if [[ $cluster_created -eq 1 && "$KEEP_CLUSTER" != 1 ]]; then
    log "deleting kind cluster $CLUSTER"
    kind delete cluster --name "$CLUSTER"
  elif [[ $cluster_created -eq 1 ]]; then
    log "kept cluster $CLUSTER; kubeconfig: kind export kubeconfig --name $CLUSTER"
  fi
  rm -rf "$workdir"
  exit "$status"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

for tool in docker kind kubectl helm jq; do
  command -v "$tool" >/dev/null || { echo "e2e-kind: $tool is required" >&2; exit 1; }
done
if kind get clusters 2>/dev/null | grep -qx "$CLUSTER"; then
  echo "e2e-kind: a kind cluster named $CLUSTER exists already; delete it or set CLUSTER" >&2
  exit 1
fi

log "building $AGENT_IMAGE (CPU variant) and $OPERATOR_IMAGE"
DOCKER_BUILDKIT=1 docker build -f Dockerfile.agent --build-arg VARIANT=cpu -t "$AGENT_IMAGE" .
DOCKER_BUILDKIT=1 docker build -f Dockerfile.operator -t "$OPERATOR_IMAGE" .

log "generating demo models into $models_dir"
mkdir -p "$models_dir"
# Written as the invoking user (no world-writable folder): the files are readable by everyone,
# which is all the agent (uid 10001) needs of its models dir.
docker run --rm --user "$(id -u):$(id -g)" -v "$models_dir:/out" "$AGENT_IMAGE" demo-models /out
# The smallest model: a fast first load on a CPU-only node. (A glob, not `ls | tail` in a
# substitution, which `set -e` would end before the check below could explain why.)
shopt -s nullglob
models=("$models_dir"/*.gguf)
shopt -u nullglob
[[ ${#models[@]} -gt 0 ]] || { echo "e2e-kind: no demo model was written" >&2; exit 1; }
model_file="$(basename "$(ls -1S -- "${models[@]}" | tail -n 1)")"
model_sha256="$(sha256sum "$models_dir/$model_file" | cut -d' ' -f1)"
log "demo model: $model_file (sha256 $model_sha256)"

log "creating kind cluster $CLUSTER (models mounted at /var/lib/corral/models on the node)"
cat >"$workdir/kind.yaml" <<EOF
kind: Cluster
apiVersion: kind.x-k8s.io/v1alpha4
nodes:
  - role: control-plane
    extraMounts:
      - hostPath: $models_dir
        containerPath: /var/lib/corral/models
EOF
cluster_created=1
kind create cluster --name "$CLUSTER" --config "$workdir/kind.yaml" --kubeconfig "$kubeconfig" \
  --wait 120s

log "loading images into the cluster"
kind load docker-image --name "$CLUSTER" "$AGENT_IMAGE" "$OPERATOR_IMAGE"

# As on a real node: the kubelet would create the download cache owned by root, which the
# agent (uid 10001) cannot write; the chart's README says to create it first, so do that.
log "preparing the node's download cache /var/lib/corral/cache (owned by uid 10001)"
docker exec "$CLUSTER-control-plane" install -d -o 10001 -g 10001 /var/lib/corral/cache

log "creating the API key Secret"
kubectl create namespace "$NAMESPACE"
api_key="$(head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n')"
scrape_key="$(head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n')"
kubectl -n "$NAMESPACE" create secret generic corral-api-key --from-literal=api-key="$api_key" \
  --from-literal=metrics-key="$scrape_key"

log "installing the chart (release $RELEASE in $NAMESPACE)"
helm upgrade --install "$RELEASE" charts/corral \
  --namespace "$NAMESPACE" \
  -f charts/corral/ci/cpu-only-values.yaml \
  --set-string agent.image.repository="$AGENT_REPOSITORY" \
  --set-string agent.image.pullPolicy=Never \
  --set-string operator.image.repository="$OPERATOR_REPOSITORY" \
  --set-string operator.image.pullPolicy=Never \
  --set-string agent.apiKey.existingSecret=corral-api-key \
  --wait --timeout "$TIMEOUT"

log "waiting for the CRD, the agents and the operator"
kubectl wait --for=condition=Established crd/modelpresets.corral.dev --timeout="$TIMEOUT"
kubectl -n "$NAMESPACE" rollout status daemonset/"$RELEASE-agent" --timeout="$TIMEOUT"
kubectl -n "$NAMESPACE" rollout status deployment/"$RELEASE-operator" --timeout="$TIMEOUT"

log "helm test: /health, a 401 without the key, /v1/models with it (the agent Service)"
helm test "$RELEASE" --namespace "$NAMESPACE" --logs --timeout "$TIMEOUT"

log "applying ModelPreset $PRESET (model /models/$model_file)"
kubectl apply -f - <<EOF
apiVersion: corral.dev/v1alpha1
kind: ModelPreset
metadata:
  name: $PRESET
spec:
  source:
    localPath:
      path: /models/$model_file
  args: ["--ctx-size", "512"]
  lifecycle:
    loadOnStartup: true
EOF
# Ready needs the agents to load a preset added at runtime (load-on-startup after start).
kubectl wait --for=condition=Ready "modelpreset/$PRESET" --timeout="$TIMEOUT"
# The operator reads the agents through the API key: memory figures reached the status.
kubectl get modelpreset "$PRESET" -o json | jq -e '.status.nodes[0].memory.min' >/dev/null

log "a url source: the agent downloads the model into its cache (from a server in the cluster)"
kubectl -n "$NAMESPACE" apply -f - <<EOF
apiVersion: v1
kind: Pod
metadata:
  name: e2e-models-http
  labels: {app: e2e-models-http}
spec:
  securityContext: {runAsNonRoot: true, runAsUser: 10001, seccompProfile: {type: RuntimeDefault}}
  containers:
    - name: http
      image: $AGENT_IMAGE
      imagePullPolicy: Never
      command: ["python3", "-m", "http.server", "8000", "--directory", "/models"]
      ports: [{containerPort: 8000}]
      securityContext:
        allowPrivilegeEscalation: false
        readOnlyRootFilesystem: true
        capabilities: {drop: ["ALL"]}
      volumeMounts: [{name: models, mountPath: /models, readOnly: true}]
  volumes:
    - name: models
      hostPath: {path: /var/lib/corral/models, type: Directory}
---
apiVersion: v1
kind: Service
metadata:
  name: e2e-models-http
spec:
  selector: {app: e2e-models-http}
  ports: [{port: 80, targetPort: 8000}]
EOF
kubectl -n "$NAMESPACE" wait --for=condition=Ready pod/e2e-models-http --timeout="$TIMEOUT"
kubectl apply -f - <<EOF
apiVersion: corral.dev/v1alpha1
kind: ModelPreset
metadata:
  name: $PRESET-url
spec:
  source:
    url:
      url: http://e2e-models-http.$NAMESPACE.svc/$model_file
      sha256: "$model_sha256"
  args: ["--ctx-size", "512"]
  lifecycle:
    loadOnStartup: true
EOF
kubectl wait --for=condition=Ready "modelpreset/$PRESET-url" --timeout="$TIMEOUT"
docker exec "$CLUSTER-control-plane" find /var/lib/corral/cache -type f -name '*.gguf' \
  | grep -q . || { echo "e2e-kind: the download is not in the cache volume" >&2; exit 1; }
kubectl get modelpresets

log "finding the preset's Service (it selects pods labelled preset.corral.dev/$PRESET=true)"
service=""
for _ in $(seq 60); do
  service="$(kubectl -n "$NAMESPACE" get services -o json \
    | jq -r --arg key "preset.corral.dev/$PRESET" \
        '.items[] | select((.spec.selector // {})[$key] == "true") | .metadata.name' \
    | head -n 1)"
  [[ -n "$service" ]] && break
  sleep 2
done
[[ -n "$service" ]] || { echo "e2e-kind: no Service selects preset.corral.dev/$PRESET" >&2; exit 1; }
port="$(kubectl -n "$NAMESPACE" get service "$service" -o jsonpath='{.spec.ports[0].port}')"
log "Service $service, port $port"

log "chat completion through https://$service.$NAMESPACE.svc:$port (from a pod in the cluster)"
# The client runs the agent image (already loaded: no pull, and it has curl), restricted like
# every pod of the chart. jq builds the JSON, so no quoting can go wrong.
# HTTPS (the chart's agent.tls): the client trusts the release's CA, from its Secret.
url="https://$service.$NAMESPACE.svc:$port/v1/chat/completions"
body="$(jq -cn --arg model "$PRESET" \
  '{model: $model, max_tokens: 8, messages: [{role: "user", content: "Say hello."}]}')"
overrides="$(jq -cn --arg image "$AGENT_IMAGE" --arg url "$url" --arg body "$body" \
  --arg key "$api_key" --arg ca_secret "$RELEASE-agent-tls" '{
  spec: {
    securityContext: {runAsNonRoot: true, runAsUser: 10001, seccompProfile: {type: "RuntimeDefault"}},
    containers: [{
      name: "e2e-client", image: $image, imagePullPolicy: "Never",
      command: ["curl", "-fsS", "--cacert", "/etc/corral/agent-ca/ca.crt",
                "--retry", "10", "--retry-delay", "3", "--retry-all-errors",
                "-H", "Content-Type: application/json", "-H", ("Authorization: Bearer " + $key),
                "-d", $body, $url],
      securityContext: {allowPrivilegeEscalation: false, readOnlyRootFilesystem: true,
                        capabilities: {drop: ["ALL"]}},
      volumeMounts: [{name: "agent-ca", mountPath: "/etc/corral/agent-ca", readOnly: true}]
    }],
    volumes: [{name: "agent-ca", secret: {secretName: $ca_secret,
                                          items: [{key: "ca.crt", path: "ca.crt"}]}}]
  }
}')"
response="$(kubectl -n "$NAMESPACE" run e2e-client --rm -i --quiet --restart=Never \
  --image="$AGENT_IMAGE" --overrides="$overrides" --pod-running-timeout=120s)"
echo "$response" | jq .
echo "$response" | jq -e '.object == "chat.completion" and (.choices | length) >= 1' >/dev/null

log "e2e passed"
