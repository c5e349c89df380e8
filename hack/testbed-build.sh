#!/usr/bin/env bash
# Build the testbed's control-plane binaries from Go modules into a cache outside the repo.
# A second run finds every binary and builds nothing. See docs/testbed.md.
set -euo pipefail

# The default is the newest Kubernetes release the Go module proxy serves (v1.37.2 on 2026-11-28);
# an older minor stays buildable for the compatibility install test (`make testbed-compat`,
# GPUPLAN_K8S_VERSION=v1.34.4). Each version has its own wrapper module, testbed/k8s/<version>/.
K8S_VERSION=${GPUPLAN_K8S_VERSION:-v1.37.2}
ETCD_VERSION=v3.6.4
KWOK_VERSION=v0.7.0
HELM_VERSION=v3.21.4
KUEUE_VERSION=v0.17.0
SCHEDULER_PLUGINS_VERSION=v0.34.7  # its wrapper module pins Kubernetes to v1.34.4

repo=$(cd "$(dirname "$0")/.." && pwd)
cache=${GPUPLAN_TESTBED_CACHE:-$HOME/.cache/gpuplan/testbed}
bin=$cache/k8s-$K8S_VERSION-etcd-$ETCD_VERSION-kwok-$KWOK_VERSION-helm-$HELM_VERSION/bin
export GOTOOLCHAIN=local CGO_ENABLED=0 GOFLAGS=-trimpath
export GOMODCACHE=$cache/gomod GOCACHE=$cache/gocache

if [ "${1:-}" = "--print-bin" ]; then echo "$bin"; exit 0; fi
if [ "${1:-}" = "--print-k8s-version" ]; then echo "$K8S_VERSION"; exit 0; fi
mkdir -p "$bin"

log() { printf '[testbed-build %s] %s\n' "$(date -u +%H:%M:%S)" "$*" >&2; }
have() { for b in "$@"; do [ -x "$bin/$b" ] || return 1; done; }

build_k8s() {
  have kube-apiserver kube-controller-manager kube-scheduler kubectl && return 0
  local module=$repo/testbed/k8s/$K8S_VERSION
  [ -f "$module/go.mod" ] || { log "no wrapper module $module/go.mod for $K8S_VERSION"; exit 1; }
  log "building Kubernetes $K8S_VERSION (cold: ~20-40 min on 2 cores)"
  local ldf="-s -w" kv minor=${K8S_VERSION#v1.}
  minor=${minor%%.*}
  for kv in gitVersion=$K8S_VERSION gitMajor=1 gitMinor=$minor gitTreeState=clean \
            buildDate=2026-01-01T00:00:00Z; do
    ldf="$ldf -X k8s.io/component-base/version.$kv -X k8s.io/client-go/pkg/version.$kv"
  done
  (cd "$module" && go build -ldflags "$ldf" -o "$bin/" \
      k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-controller-manager \
      k8s.io/kubernetes/cmd/kube-scheduler k8s.io/kubernetes/cmd/kubectl)
}

build_etcd() {
  have etcd && return 0
  log "building etcd $ETCD_VERSION"
  (cd "$repo/testbed/etcd" && go build -ldflags "-s -w" -o "$bin/etcd" go.etcd.io/etcd/server/v3)
}

build_kwok() {
  have kwok && return 0
  log "building kwok $KWOK_VERSION"
  GOBIN=$bin go install -ldflags "-s -w -X sigs.k8s.io/kwok/pkg/consts.Version=${KWOK_VERSION#v}" \
    "sigs.k8s.io/kwok/cmd/kwok@$KWOK_VERSION"
}

build_helm() {
  have helm && return 0
  log "building helm $HELM_VERSION"
  # Without these -X flags (set by helm's own Makefile) `helm template` assumes Kubernetes
  # v1.20.0 and rejects charts with `kubeVersion: >=1.30`; we pin it to the testbed's minor.
  local p=helm.sh/helm/v3 minor=${K8S_VERSION#v1.}
  minor=${minor%%.*}
  GOBIN=$bin go install -ldflags "-s -w -X $p/internal/version.version=$HELM_VERSION \
    -X $p/pkg/chartutil.k8sVersionMajor=1 -X $p/pkg/chartutil.k8sVersionMinor=$minor \
    -X $p/pkg/lint/rules.k8sVersionMajor=1 -X $p/pkg/lint/rules.k8sVersionMinor=$minor" \
    "helm.sh/helm/v3/cmd/helm@$HELM_VERSION"
}

build_kueue() {
  # Kueue's controller manager and CRDs, for the Kueue integration test (docs/kueue.md). Not in
  # the bin directory's name: adding it must not invalidate the other binaries' cache.
  have kueue && [ -d "$bin/kueue-crds" ] && return 0
  log "building Kueue $KUEUE_VERSION"
  local dir work=$cache/kueue-$KUEUE_VERSION-main
  dir=$(cd "$repo/testbed/kueue" && go mod download -json "sigs.k8s.io/kueue@$KUEUE_VERSION" \
        | sed -n 's/^\t"Dir": "\(.*\)",$/\1/p')
  mkdir -p "$work" "$bin/kueue-crds"
  # The wrapper module (testbed/kueue/go.mod, Kueue's own dependency versions) builds a copy of
  # cmd/kueue/main.go with one change: without internal cert management Kueue reads the metrics
  # server's certificate from a fixed /etc/kueue/metrics/certs, and $KUEUE_METRICS_CERT_DIR
  # names another directory, so the testbed writes nothing outside its own directories.
  cp "$repo/testbed/kueue/go.mod" "$repo/testbed/kueue/go.sum" "$work/"
  sed 's|metricsCertPath := "/etc/kueue/metrics/certs"|metricsCertPath := os.Getenv("KUEUE_METRICS_CERT_DIR")|' \
    "$dir/cmd/kueue/main.go" > "$work/main.go"
  grep -q KUEUE_METRICS_CERT_DIR "$work/main.go"  # fail loudly if a new release moved it
  (cd "$work" && go build -ldflags "-s -w -X sigs.k8s.io/kueue/pkg/version.GitVersion=$KUEUE_VERSION" \
      -o "$bin/kueue" .)
  cp "$dir"/config/components/crd/bases/*.yaml "$bin/kueue-crds/"
}

build_gangs() {
  # kube-scheduler with the scheduler-plugins Coscheduling plugin and the PodGroup CRD, for the
  # gang test (`make test-gangs`, docs/schedulers.md). Only with --gangs: not in the default
  # build, and only for the Kubernetes minor its wrapper module pins.
  have coscheduler && [ -f "$bin/scheduler-plugins-crds/podgroups.yaml" ] && return 0
  local module=$repo/testbed/scheduler-plugins dir
  [ "$K8S_VERSION" = v1.34.4 ] || { log "the gang scheduler's wrapper module pins v1.34.4"; exit 1; }
  log "building scheduler-plugins $SCHEDULER_PLUGINS_VERSION (Coscheduling)"
  dir=$(cd "$module" && go mod download -json "sigs.k8s.io/scheduler-plugins@$SCHEDULER_PLUGINS_VERSION" \
        | sed -n 's/^\t"Dir": "\(.*\)",$/\1/p')
  (cd "$module" && go build -ldflags "-s -w" -o "$bin/coscheduler" .)
  mkdir -p "$bin/scheduler-plugins-crds"
  cp "$dir/config/crd/bases/scheduling.x-k8s.io_podgroups.yaml" \
     "$bin/scheduler-plugins-crds/podgroups.yaml"
}

start=$(date +%s)
if [ "${1:-}" = "--gangs" ]; then
  build_gangs
  log "gang scheduler present in $bin ($(( $(date +%s) - start )) s)"
  exit 0
fi
build_etcd
build_k8s
build_kwok
build_helm
build_kueue
log "all binaries present in $bin ($(( $(date +%s) - start )) s)"
