#!/usr/bin/env bash
# `make kind-e2e`: run the integration tests on a kind cluster instead of the local process testbed.
# For machines WITH Docker (the development VM and CI have none, so this is not run there).
# Needs: docker, kind (>= 0.30 for a 1.34 node image), kubectl, helm, and internet access for
# the kind node image, kwok's in-cluster manifest and the kube-scheduler image.
#   KIND_CLUSTER     cluster name               (default gpuplan-e2e)
#   KIND_NODE_IMAGE  node image                 (default kindest/node:v1.34.0)
#   EXTENDER_URL     gpuplan extender for the second scheduler (ignorable; default: none running)
#   KEEP_CLUSTER=1   leave the cluster running afterwards
set -euo pipefail

repo=$(cd "$(dirname "$0")/.." && pwd)
cluster=${KIND_CLUSTER:-gpuplan-e2e}
node_image=${KIND_NODE_IMAGE:-kindest/node:v1.34.0}
kwok_version=v0.7.0   # same pin as hack/testbed-build.sh; testbed/kwok-stages.yaml targets it
scheduler_image=${SCHEDULER_IMAGE:-registry.k8s.io/kube-scheduler:${node_image##*:}}
extender_url=${EXTENDER_URL:-http://gpuplan-extender.gpuplan-system.svc:8888/extender}
state=${GPUPLAN_TESTBED_STATE:-$repo/.testbed}/kind
kcfg=$state/kubeconfig
python=${PYTHON:-$repo/.venv/bin/python}

for tool in docker kind kubectl helm; do
  command -v "$tool" >/dev/null || { echo "kind-e2e: '$tool' not found on PATH" >&2; exit 2; }
done
mkdir -p "$state"
k() { kubectl --kubeconfig "$kcfg" --request-timeout=60s "$@"; }

if ! kind get clusters 2>/dev/null | grep -qx "$cluster"; then
  kind create cluster --name "$cluster" --image "$node_image" --kubeconfig "$kcfg" --wait 180s
else
  kind get kubeconfig --name "$cluster" >"$kcfg"
fi
cleanup() { [ "${KEEP_CLUSTER:-}" = 1 ] || kind delete cluster --name "$cluster"; }
trap cleanup EXIT

# kwok in-cluster, driven by our pinned stages instead of its default fast stages.
k apply -f "https://github.com/kubernetes-sigs/kwok/releases/download/$kwok_version/kwok.yaml"
k wait --for=condition=Established --timeout=60s crd/stages.kwok.x-k8s.io
k apply -f "$repo/testbed/kwok-stages.yaml"
k -n kube-system rollout status deploy/kwok-controller --timeout=180s

sed -e "s|SCHEDULER_IMAGE|$scheduler_image|" -e "s|EXTENDER_URL|$extender_url|" \
  "$repo/testbed/kind/gpuplan-scheduler.yaml" | k apply -f -
k -n kube-system rollout status deploy/gpuplan-scheduler --timeout=180s

"$python" "$repo/testbed/gpuplan_testbed.py" nodes --kubeconfig "$kcfg"

# tests/conftest.py uses GPUPLAN_KUBECONFIG instead of starting the local testbed.
GPUPLAN_KUBECONFIG=$kcfg "$repo/.venv/bin/pytest" -q -m integration "$repo/tests"
