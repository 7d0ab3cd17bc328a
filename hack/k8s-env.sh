#!/usr/bin/env bash
# A real Kubernetes control plane on loopback for the cluster tier (tests/cluster) and for poking
# at the chart by hand: etcd, kube-apiserver (RBAC, admission and Pod Security on),
# kube-controller-manager, kube-scheduler, and kwok simulating GPU nodes; plus the real helm and
# a kubectl of the same minor as the apiserver.
#
#   hack/k8s-env.sh build          # build the binaries once (cached outside the checkout)
#   eval "$(hack/k8s-env.sh up)"   # start it all; prints `export KUBECONFIG=…` and `export PATH=…`
#   hack/k8s-env.sh down           # stop it all (state under $CORRAL_K8S_RUN goes too)
#   hack/k8s-env.sh bin            # print the folder holding the binaries (building if needed)
#   hack/k8s-env.sh built          # the same, but fail instead of building
#   hack/k8s-env.sh picker         # the endpoint picker's folder (bin/epp, bin/epp-pick, crds/)
#   hack/k8s-env.sh restart kube-apiserver   # as an upgrade does: connections drop, watch cache anew
#   hack/k8s-env.sh compact        # etcd forgets old revisions: an older watch gets 410 Gone
#
# CORRAL_K8S_RUN: where the state goes (default /tmp/corral-k8s-$UID), so runs can sit side by
# side; CORRAL_K8S_GPU_NODES / CORRAL_K8S_GPUS_PER_NODE: the simulated GPU nodes (2 × 8).
#
# Everything is built from Go modules through the module proxy: nothing is downloaded as a
# prebuilt binary (a binary built elsewhere is not portable, and none can be fetched here).
# k8s.io/kubernetes replaces its staging modules (k8s.io/api…) with folders its module zip lacks,
# so it is built from a go.mod of our own that requires it and points each staging module at its
# matching v0.x release; etcd's server module does the same for its siblings, so it shares that
# go.mod. kwok and helm carry no replace directives and are plain `go install`s.
#
# The Gateway API Inference Extension's endpoint picker (the chart's inferencePool) is built
# the same way, into a cache of its own (its version moves apart from the control plane's),
# with hack/epp-pick (a gateway's ext_proc request, for the tests) against the same modules.
set -euo pipefail

K8S_VERSION=v1.37.2
# The etcd that kubernetes v1.37.2's go.mod requires (its client speaks to this server).
ETCD_VERSION=v3.7.0
KWOK_VERSION=v0.8.0
HELM_VERSION=v3.22.0
GIE_VERSION=v1.0.1

cache="${CORRAL_K8S_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/corral/k8s/k8s-$K8S_VERSION-etcd-$ETCD_VERSION-kwok-$KWOK_VERSION-helm-$HELM_VERSION}"
bin="$cache/bin"
run="${CORRAL_K8S_RUN:-${TMPDIR:-/tmp}/corral-k8s-$(id -u)}"
binaries=(etcd kube-apiserver kube-controller-manager kube-scheduler kubectl kwok helm)
picker_cache="${CORRAL_PICKER_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/corral/k8s/gie-$GIE_VERSION}"
picker_bin="$picker_cache/bin"
pick_source="$(cd "$(dirname "$0")" && pwd)/epp-pick/main.go"

log() { printf '>> %s\n' "$*" >&2; }

have_binaries() {
  local b
  for b in "${binaries[@]}"; do [ -x "$bin/$b" ] || return 1; done
}

build_kubernetes() {
  # Our own module: requires kubernetes and etcd's server, replaces every staging module that
  # kubernetes' go.mod replaces with the release of the same minor (v1.37.2 -> v0.37.2).
  local src="$cache/src" staging_version="v0.${K8S_VERSION#v1.}" mod
  mkdir -p "$src"
  mod="$(go mod download -json "k8s.io/kubernetes@$K8S_VERSION" | sed -n 's/^\s*"GoMod": "\(.*\)",$/\1/p')"
  {
    echo "module corral.invalid/k8s-build"
    echo
    echo "go $(sed -n 's/^go //p' "$mod")"
    echo
    echo "require ("
    echo "	k8s.io/kubernetes $K8S_VERSION"
    echo "	go.etcd.io/etcd/server/v3 $ETCD_VERSION"
    echo ")"
    echo
    echo "replace ("
    sed -n 's#^\s*\(k8s.io/[a-z0-9-]*\) => ./staging/src/.*#\t\1 => \1 '"$staging_version"'#p' "$mod"
    echo ")"
  } >"$src/go.mod"
  # The version the binaries report (helm checks a chart's kubeVersion against it; kubectl
  # warns on skew); without these flags they say v0.0.0-master.
  local minor version_flags
  minor="$(echo "$K8S_VERSION" | cut -d. -f2)"
  version_flags="-X k8s.io/component-base/version.gitVersion=$K8S_VERSION"
  version_flags+=" -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=$minor"
  version_flags+=" -X k8s.io/component-base/version.gitTreeState=clean"
  (
    cd "$src"
    local kube=(k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-controller-manager
      k8s.io/kubernetes/cmd/kube-scheduler k8s.io/kubernetes/cmd/kubectl)
    # `go get` of the packages writes go.sum (and any requirement a package needs); each at its
    # pinned version (a bare package path would mean @upgrade, the newest release).
    go get "${kube[@]/%/@$K8S_VERSION}" "go.etcd.io/etcd/server/v3@$ETCD_VERSION"
    # -trimpath: the binaries do not embed this machine's paths; CGO off: static, no libc skew.
    CGO_ENABLED=0 go build -trimpath -ldflags "-s -w $version_flags" -o "$bin/" "${kube[@]}"
    CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o "$bin/etcd" go.etcd.io/etcd/server/v3
  )
}

# The extension's CRDs, as its module ships them (the chart does not install them: a cluster
# that routes with the extension has them from its own install).
picker_crds=(inference.networking.k8s.io_inferencepools.yaml inference.networking.x-k8s.io_inferenceobjectives.yaml)

have_picker() { # the picker, its CRDs, and epp-pick from the checkout's source
  local crd
  for crd in "${picker_crds[@]}"; do [ -f "$picker_cache/crds/$crd" ] || return 1; done
  [ -x "$picker_bin/epp" ] && [ -x "$picker_bin/epp-pick" ] &&
    cmp -s "$pick_source" "$picker_cache/src/pick/main.go"
}

build_picker() {
  local src="$picker_cache/src" module=sigs.k8s.io/gateway-api-inference-extension mod dir crd
  mkdir -p "$src/pick" "$picker_bin" "$picker_cache/crds"
  mod="$(go mod download -json "$module@$GIE_VERSION" | sed -n 's/^\s*"GoMod": "\(.*\)",$/\1/p')"
  dir="$(go mod download -json "$module@$GIE_VERSION" | sed -n 's/^\s*"Dir": "\(.*\)",$/\1/p')"
  for crd in "${picker_crds[@]}"; do cp "$dir/config/crd/bases/$crd" "$picker_cache/crds/"; done
  printf 'module corral.invalid/picker-build\n\ngo %s\n' "$(sed -n 's/^go //p' "$mod")" >"$src/go.mod"
  cp "$pick_source" "$src/pick/main.go"
  (
    cd "$src"
    go get "$module/cmd/epp@$GIE_VERSION"
    CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o "$picker_bin/" "$module/cmd/epp"
    CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o "$picker_bin/epp-pick" ./pick
  )
}

build() {
  have_binaries && have_picker && return 0
  command -v go >/dev/null || { echo "k8s-env: go is not installed" >&2; return 1; }
  if ! have_picker; then
    local start=$SECONDS
    log "building the endpoint picker $GIE_VERSION into $picker_bin (once; minutes)"
    build_picker
    have_picker
    log "built in $((SECONDS - start)) s"
  fi
  have_binaries && return 0
  mkdir -p "$bin"
  local start=$SECONDS
  log "building the control plane into $bin (once; minutes)"
  build_kubernetes
  CGO_ENABLED=0 GOBIN="$bin" go install -trimpath -ldflags "-s -w" "sigs.k8s.io/kwok/cmd/kwok@$KWOK_VERSION"
  CGO_ENABLED=0 GOBIN="$bin" go install -trimpath -ldflags "-s -w" "helm.sh/helm/v3/cmd/helm@$HELM_VERSION"
  have_binaries
  log "built in $((SECONDS - start)) s"
}

# --- running it --------------------------------------------------------------------------------

free_port() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

alive() { [ -f "$run/$1.pid" ] && kill -0 "$(cat "$run/$1.pid")" 2>/dev/null; }

start() { # name, command...: in its own session (so `down` can end its whole group), log to run/
  local name=$1
  shift
  printf '%q ' "$@" >"$run/$name.cmd" # for `restart`
  setsid "$@" >>"$run/$name.log" 2>&1 </dev/null &
  echo $! >"$run/$name.pid"
}

stop() { # name: TERM its process group, KILL what is left after 5 s
  local pid
  [ -f "$run/$1.pid" ] || return 0
  pid=$(cat "$run/$1.pid")
  kill -TERM -- "-$pid" 2>/dev/null || true
  for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  kill -KILL -- "-$pid" 2>/dev/null || true
  rm -f "$run/$1.pid"
}

certificates() {
  local pki="$run/pki"
  mkdir -p "$pki"
  (
    cd "$pki"
    openssl req -x509 -newkey rsa:2048 -nodes -keyout ca.key -out ca.crt -days 3650 \
      -subj "/CN=corral-test-ca" 2>/dev/null
    sign() { # name, subject, extensions
      openssl req -newkey rsa:2048 -nodes -keyout "$1.key" -out "$1.csr" -subj "$2" 2>/dev/null
      printf '%s\n' "$3" >"$1.ext"
      openssl x509 -req -in "$1.csr" -CA ca.crt -CAkey ca.key -CAcreateserial -days 3650 \
        -extfile "$1.ext" -out "$1.crt" 2>/dev/null
    }
    sign apiserver "/CN=kube-apiserver" \
      "subjectAltName=IP:127.0.0.1,IP:10.96.0.1,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc"
    # system:masters: the one identity RBAC never restricts (the test's and the components').
    sign admin "/O=system:masters/CN=corral-admin" "extendedKeyUsage=clientAuth"
    openssl genrsa -out sa.key 2048 2>/dev/null
    openssl rsa -in sa.key -pubout -out sa.pub 2>/dev/null
  )
}

write_kubeconfig() { # server
  local pki="$run/pki"
  cat >"$run/kubeconfig" <<YAML
apiVersion: v1
kind: Config
clusters:
  - name: corral-test
    cluster:
      server: $1
      certificate-authority: $pki/ca.crt
users:
  - name: corral-admin
    user:
      client-certificate: $pki/admin.crt
      client-key: $pki/admin.key
contexts:
  - name: corral-test
    context: {cluster: corral-test, user: corral-admin}
current-context: corral-test
YAML
}

# kwok's own stage definitions (from the module the kwok binary was built from): nodes turn
# Ready and keep their capacity; pods are scheduled-then-Running with an IP from --cidr.
kwok_config() {
  local dir
  dir="$(go env GOMODCACHE)/sigs.k8s.io/kwok@$KWOK_VERSION/kustomize/stage"
  for f in "$dir"/node/fast/node-initialize.yaml "$dir"/node/heartbeat-with-lease/*.yaml \
    "$dir"/pod/fast/pod-ready.yaml "$dir"/pod/fast/pod-complete.yaml "$dir"/pod/fast/pod-delete.yaml; do
    case "$f" in *kustomization.yaml) continue ;; esac
    echo "---"
    cat "$f"
  done
}

gpu_nodes() { # count, gpus per node: kwok nodes labelled, tainted and sized like NVIDIA GPU nodes
  local i name
  for ((i = 0; i < $1; i++)); do
    name="gpu-node-$i"
    cat <<YAML
---
apiVersion: v1
kind: Node
metadata:
  name: $name
  annotations:
    kwok.x-k8s.io/node: fake
  labels:
    kubernetes.io/hostname: $name
    kubernetes.io/os: linux
    kubernetes.io/arch: amd64
    type: kwok
    # What NVIDIA's GPU feature discovery puts on a GPU node.
    nvidia.com/gpu.present: "true"
    nvidia.com/gpu.count: "$2"
    nvidia.com/gpu.product: NVIDIA-H100-80GB-HBM3
spec:
  taints:
    - key: nvidia.com/gpu
      value: present
      effect: NoSchedule
status:
  capacity: {cpu: "64", memory: 512Gi, pods: "110", nvidia.com/gpu: "$2"}
  allocatable: {cpu: "64", memory: 512Gi, pods: "110", nvidia.com/gpu: "$2"}
YAML
  done
}

cpu_node() { # one untainted node without GPUs, for what is not an agent (the operator, tests)
  cat <<YAML
---
apiVersion: v1
kind: Node
metadata:
  name: cpu-node-0
  annotations:
    kwok.x-k8s.io/node: fake
  labels:
    kubernetes.io/hostname: cpu-node-0
    kubernetes.io/os: linux
    kubernetes.io/arch: amd64
    type: kwok
status:
  capacity: {cpu: "16", memory: 64Gi, pods: "110"}
  allocatable: {cpu: "16", memory: 64Gi, pods: "110"}
YAML
}

print_env() {
  echo "export KUBECONFIG=$run/kubeconfig"
  echo "export PATH=$bin:\$PATH"
}

nodes_ready() { # kubeconfig: every node Ready (one listing, however many nodes)
  local listing
  listing=$("$bin/kubectl" --kubeconfig="$1" get nodes --no-headers) || return 1
  [ -n "$listing" ] && ! grep -qv ' Ready ' <<<"$listing"
}

wait_for() { # what, seconds, command...
  local what=$1 limit=$2 start=$SECONDS
  shift 2
  until "$@" >/dev/null 2>&1; do
    if ((SECONDS - start > limit)); then
      echo "k8s-env: $what not ready after ${limit}s (logs in $run)" >&2
      return 1
    fi
    sleep 0.2
  done
}

up() {
  build
  if alive kube-apiserver; then
    print_env
    return 0
  fi
  local start=$SECONDS
  rm -rf "$run"
  mkdir -p "$run"
  certificates
  local etcd_port etcd_peer api_port pki="$run/pki"
  etcd_port=$(free_port) etcd_peer=$(free_port) api_port=$(free_port)
  start etcd "$bin/etcd" --name=node0 --data-dir="$run/etcd" \
    --listen-client-urls="http://127.0.0.1:$etcd_port" --advertise-client-urls="http://127.0.0.1:$etcd_port" \
    --listen-peer-urls="http://127.0.0.1:$etcd_peer" --initial-advertise-peer-urls="http://127.0.0.1:$etcd_peer" \
    --initial-cluster="node0=http://127.0.0.1:$etcd_peer" \
    --unsafe-no-fsync --quota-backend-bytes=2147483648 --log-level=warn
  wait_for etcd 30 curl -sf "http://127.0.0.1:$etcd_port/health"
  # RBAC with the Node authorizer, and the default admission plugins (PodSecurity,
  # ServiceAccount, Priority, ResourceQuota, … and the CRDs' CEL validation) plus
  # NodeRestriction; the service-account issuer/keys make the chart's ServiceAccounts' tokens.
  start kube-apiserver "$bin/kube-apiserver" \
    --bind-address=127.0.0.1 --secure-port="$api_port" --cert-dir="$pki" \
    --etcd-servers="http://127.0.0.1:$etcd_port" \
    --tls-cert-file="$pki/apiserver.crt" --tls-private-key-file="$pki/apiserver.key" \
    --client-ca-file="$pki/ca.crt" \
    --service-account-issuer=https://kubernetes.default.svc.cluster.local \
    --service-account-key-file="$pki/sa.pub" --service-account-signing-key-file="$pki/sa.key" \
    --authorization-mode=Node,RBAC --enable-admission-plugins=NodeRestriction \
    --service-cluster-ip-range=10.96.0.0/16 --allow-privileged=true --profiling=false
  write_kubeconfig "https://127.0.0.1:$api_port"
  local kc="$run/kubeconfig"
  wait_for kube-apiserver 90 "$bin/kubectl" --kubeconfig="$kc" get --raw /readyz
  start kube-controller-manager "$bin/kube-controller-manager" --kubeconfig="$kc" \
    --authentication-kubeconfig="$kc" --authorization-kubeconfig="$kc" \
    --bind-address=127.0.0.1 --secure-port=0 --leader-elect=false \
    --use-service-account-credentials --service-account-private-key-file="$pki/sa.key" \
    --root-ca-file="$pki/ca.crt" --service-cluster-ip-range=10.96.0.0/16 \
    --controllers='*,-nodeipam'
  start kube-scheduler "$bin/kube-scheduler" --kubeconfig="$kc" \
    --authentication-kubeconfig="$kc" --authorization-kubeconfig="$kc" \
    --bind-address=127.0.0.1 --secure-port=0 --leader-elect=false
  kwok_config >"$run/kwok.yaml"
  # Pod IPs from a loopback range: a test can run a real agent on each pod's own IP.
  start kwok "$bin/kwok" --kubeconfig="$kc" --config="$run/kwok.yaml" \
    --manage-all-nodes=false --manage-nodes-with-annotation-selector=kwok.x-k8s.io/node=fake \
    --cidr="${CORRAL_K8S_POD_CIDR:-127.10.0.0/16}" --node-ip=127.0.0.1 \
    --node-lease-duration-seconds=40 --server-address="127.0.0.1:$(free_port)" --v=WARN
  # The default ServiceAccount of `default` appears once the controller-manager runs.
  wait_for kube-controller-manager 60 "$bin/kubectl" --kubeconfig="$kc" get serviceaccount default -n default
  { gpu_nodes "${CORRAL_K8S_GPU_NODES:-2}" "${CORRAL_K8S_GPUS_PER_NODE:-8}" && cpu_node; } |
    "$bin/kubectl" --kubeconfig="$kc" apply -f - >/dev/null
  # kwok marks ~10 nodes Ready a second on a busy 2-core machine.
  wait_for "kwok nodes" $((60 + ${CORRAL_K8S_GPU_NODES:-2} / 4)) nodes_ready "$kc"
  log "control plane up in $((SECONDS - start)) s (state and logs in $run)"
  print_env
}

down() {
  local name
  # Reverse order: what writes to the apiserver first, etcd last.
  for name in kwok kube-scheduler kube-controller-manager kube-apiserver etcd; do stop "$name"; done
  rm -rf "$run"
}

# What a control-plane upgrade does to clients: every connection drops, and the new apiserver's
# watch cache starts at the current revision (a watch resumed from before it gets 410 Gone).
restart() { # name
  [ -f "$run/$1.cmd" ] || { echo "k8s-env: $1 is not running here ($run)" >&2; return 1; }
  stop "$1"
  eval "start $1 $(cat "$run/$1.cmd")"
  if [ "$1" = kube-apiserver ]; then
    wait_for kube-apiserver 90 "$bin/kubectl" --kubeconfig="$run/kubeconfig" get --raw /readyz
  fi
}

# etcd forgets every revision before its current one (the apiserver does this every 5 minutes):
# a watch resumed from an older resourceVersion then gets 410 Gone, and its client must list.
compact() {
  local etcd rev
  etcd=$(grep -o -- '--etcd-servers=[^ ]*' "$run/kube-apiserver.cmd" | cut -d= -f2)
  # etcd's JSON gateway: the revision comes back in every response's header.
  rev=$(curl -sf -X POST "$etcd/v3/kv/range" -d '{"key": "AA=="}' |
    python3 -c 'import json, sys; print(json.load(sys.stdin)["header"]["revision"])')
  curl -sf -X POST "$etcd/v3/kv/compaction" -d "{\"revision\": \"$rev\", \"physical\": true}" >/dev/null
  log "etcd compacted at revision $rev"
}

case "${1:-}" in
  build) build ;;
  bin) build && echo "$bin" ;;
  built) have_binaries && echo "$bin" ;;
  picker) have_picker && echo "$picker_cache" ;;
  up) up ;;
  down) down ;;
  env) print_env ;;
  restart) restart "${2:?restart what (kube-apiserver, kwok, ...)}" ;;
  compact) compact ;;
  *) echo "usage: hack/k8s-env.sh build|bin|built|picker|up|down|env|restart NAME|compact" >&2; exit 2 ;;
esac
