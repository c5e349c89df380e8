"""`helm install` on the real control plane, every rendered container run as itself (issue #16).

One release per module, in a namespace that enforces the `restricted` Pod Security level. Its
Deployments are read back from the API and each container runs as a local process with exactly
its rendered command, args, env and mounts, authenticated as its own ServiceAccount by a
TokenRequest token (tests/gpuplan_testing/install_harness.py says how, and what is mapped).
The docs/examples TrainingJobs then go through the installed estimator, operator, scheduler and
extender to Succeeded, and `helm test` plans through the installed estimator; `helm upgrade`
with a CRD change and `helm uninstall` come last. Every test runs twice (#32): on a fresh install
of this chart, and on a release installed from the previous chart version (from git history)
and upgraded to this one as docs/install.md says (CRDs applied first, then `helm upgrade`).
A third run installs with `estimator.tls.enabled` (the chart-made CA, issue #33): the operator
and `helm test` then reach the estimator over https and check its certificate.
The API server is the testbed's Kubernetes (`make test`: the newest, `make testbed-compat`: the
older minor).

Values are the chart's defaults except what the testbed needs: free ports (several test sessions
share one machine), a scheduler name distinct from the testbed's own gpuplan-scheduler, the
operator scoped to the test's TrainingJob namespace (the testbed is shared), and a
non-ignorable extender so a pod cannot bind around it.
"""

from __future__ import annotations

import contextlib
import copy
import json
import pathlib
import re
import shutil
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import onnx
import pytest
import yaml
from testbed_pytest import Kubectl, Testbed, namespace_name, wait_for

from gpuplan_testing import chart_history
from gpuplan_testing import install_harness as ih
from gpuplan_testing.helm_render import built_kube_version

pytestmark = pytest.mark.slow

ROOT = pathlib.Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "gpuplan"
EXAMPLES = sorted((ROOT / "docs" / "examples").glob("trainingjob-*.yaml"))
RESNET50 = pathlib.Path(onnx.__file__).parent / "backend/test/data/light/light_resnet50.onnx"
INSTANCE = "app.kubernetes.io/instance"
CRD_MANAGER = "gpuplan-install-test"
READY_TIMEOUT_S = 120
EXAMPLE_TIMEOUT_S = 150
OUTCOME_TIMEOUT_S = 60  # the operator retries a 503 outcome with 1, 2, 4 ... s waits
HELM_TEST_TIMEOUT_S = 120
# Objects a namespace holds without any release: its default account, the root CA, events, and
# the Lease kube-scheduler takes at run time for leader election (not a Helm object).
NAMESPACE_DEFAULTS = {("serviceaccount", "default"), ("configmap", "kube-root-ca.crt")}
RUNTIME_KINDS = {"events", "events.events.k8s.io", "leases.coordination.k8s.io"}


@dataclass
class Release:
    """The installed release and the local processes standing in for its pods."""

    name: str
    namespace: str
    tj_namespace: str
    scheduler_name: str
    values: dict[str, Any]
    workdir: pathlib.Path
    cluster: ih.Cluster
    revision: int
    """The Helm revision the tests start from: 1 installed, 2 upgraded from the previous chart."""
    containers: list[ih.LocalContainer] = field(default_factory=list)
    pods_seen: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    admission_events: list[str] = field(default_factory=list)

    def container(self, deployment_suffix: str, name: str) -> ih.LocalContainer:
        """The running container `name` of the Deployment whose name ends with the suffix."""
        found = [c for c in self.containers
                 if c.deployment.endswith(deployment_suffix) and c.name == name]
        assert len(found) == 1, f"no single {deployment_suffix}/{name} in " \
                                f"{[c.label for c in self.containers]}"
        return found[0]


def helm(testbed: Testbed, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    """The testbed's helm against its kubeconfig."""
    if testbed.helm_path is None:
        pytest.skip("helm not built (make testbed-build)")
    proc = subprocess.run([str(testbed.helm_path), f"--kubeconfig={testbed.kubeconfig}", *args],
                          capture_output=True, text=True, timeout=120)
    if check and proc.returncode != 0:
        raise AssertionError(f"helm {' '.join(args)} exited {proc.returncode}:\n{proc.stderr}")
    return proc


def values_for_testbed(tj_namespace: str, scheduler_name: str,
                       chart: pathlib.Path = CHART) -> dict[str, Any]:
    """What the testbed needs on top of the chart's defaults (see the module docstring)."""
    defaults = yaml.safe_load((chart / "values.yaml").read_text())
    return ih.merge(ih.free_port_values(defaults), {
        "operator": {"namespaces": [tj_namespace]},
        "scheduler": {"name": scheduler_name, "extender": {"ignorable": False}},
    })


def create_namespace(kubectl: Kubectl, name: str, labels: dict[str, str]) -> None:
    """A namespace with `labels`, created by the admin."""
    body = {"apiVersion": "v1", "kind": "Namespace",
            "metadata": {"name": name, "labels": {"gpuplan.io/test": "true", **labels}}}
    kubectl("create", "-f", "-", input=json.dumps(body))


def deployments(release: Release) -> list[dict[str, Any]]:
    """The release's Deployments as the API holds them."""
    return list(release.cluster.json("get", "deployments", "-n", release.namespace)["items"])


def admission_refusals(kubectl: Kubectl, namespace: str) -> list[str]:
    """FailedCreate events of ReplicaSets (Pod Security and other admission refusals)."""
    events = kubectl.json("get", "events", "-n", namespace)["items"]
    return [f"{e['involvedObject']['name']}: {e['message']}" for e in events
            if e.get("reason") == "FailedCreate"]


def wait_for_pods(release: Release, kubectl: Kubectl) -> None:
    """Give every Deployment time to get its pods (or be refused); record what happened."""
    def settled() -> bool:
        refused = admission_refusals(kubectl, release.namespace)
        pods = {d["metadata"]["name"]: ih.deployment_pods(release.cluster, release.namespace, d)
                for d in deployments(release)}
        release.pods_seen, release.admission_events = pods, refused
        wanted = {d["metadata"]["name"]: d["spec"].get("replicas", 1)
                  for d in deployments(release)}
        return bool(refused) or all(len(pods[n]) >= wanted[n] for n in wanted)

    # Recorded either way; test_pods_pass_restricted_pod_security reports it.
    with contextlib.suppress(AssertionError):
        wait_for(settled, 30, "the Deployments' pods")


def install_previous_then_upgrade(rel: Release, testbed: Testbed, kubectl: Kubectl) -> None:
    """The previous chart version installed with its own defaults (plus the testbed's needs, and
    the kube-scheduler tag its table may lack for this Kubernetes), then docs/install.md's
    upgrade to this chart: apply crds/, `helm upgrade` with this chart's values file."""
    previous = chart_history.unpack_previous(rel.workdir / "previous")
    values = values_for_testbed(rel.tj_namespace, rel.scheduler_name, previous.path)
    minor = ".".join(built_kube_version().split(".")[:2])
    current_tags = yaml.safe_load((CHART / "values.yaml").read_text())[
        "scheduler"]["image"]["tagsByMinor"]
    values.setdefault("scheduler", {}).setdefault("image", {})["tag"] = current_tags[minor]
    (rel.workdir / "previous-values.yaml").write_text(yaml.safe_dump(values))
    helm(testbed, "install", rel.name, str(previous.path), "-n", rel.namespace,
         "-f", str(rel.workdir / "previous-values.yaml"))
    kubectl("apply", "--server-side", "--force-conflicts", f"--field-manager={CRD_MANAGER}",
            "-f", str(CHART / "crds"))
    helm(testbed, "upgrade", rel.name, str(CHART), "-n", rel.namespace,
         "-f", str(rel.workdir / "values.yaml"))
    history = json.loads(helm(testbed, "history", rel.name, "-n", rel.namespace,
                              "-o", "json").stdout)
    charts = [(h["revision"], h["chart"], h["status"]) for h in history]
    current = chart_history.chart_version("")
    assert charts == [(1, f"gpuplan-{previous.version}", "superseded"),
                      (2, f"gpuplan-{current}", "deployed")], (previous.commit, charts)
    for dep in deployments(rel):
        kubectl("rollout", "status", "-n", rel.namespace, f"deployment/{dep['metadata']['name']}",
                f"--timeout={READY_TIMEOUT_S}s")


@pytest.fixture(scope="module", params=["fresh", "upgraded", "fresh-tls"])
def release(request: pytest.FixtureRequest, testbed: Testbed, kubectl: Kubectl,
            tmp_path_factory: pytest.TempPathFactory) -> Iterator[Release]:
    if testbed.external:
        pytest.skip("runs the release's containers as local processes: local testbed only")
    problem = ih.sandbox_problem()
    if problem:
        pytest.fail(problem, pytrace=False)
    suffix = uuid.uuid4().hex[:6]
    name, ns = f"gp-{suffix}", namespace_name(f"gpuplan-install-{suffix}")
    tj_ns = namespace_name(f"gpuplan-install-tj-{suffix}")
    scheduler_name = f"gpuplan-scheduler-{suffix}"
    values = values_for_testbed(tj_ns, scheduler_name)
    if request.param == "fresh-tls":  # the chart-made CA: operator and helm test use https
        values = ih.merge(values, {"estimator": {"tls": {"enabled": True}}})
    workdir = tmp_path_factory.mktemp("install")
    (workdir / "values.yaml").write_text(yaml.safe_dump(values))
    api = testbed.state["api_server"].removeprefix("https://")
    host, port = api.rsplit(":", 1)
    cluster = ih.Cluster(
        kubectl=kubectl, api_host=host, api_port=int(port),
        ca_pem=ih.kubeconfig_ca(testbed.kubeconfig),
        local_bins=ih.local_bins(pathlib.Path(sys.executable).parent,
                                 pathlib.Path(testbed.state["bin_dir"])))
    create_namespace(kubectl, ns, {"pod-security.kubernetes.io/enforce": "restricted",
                                   "pod-security.kubernetes.io/enforce-version": "latest"})
    # gpuplan-scheduler is opt-in per namespace (issue #32)
    create_namespace(kubectl, tj_ns, {"gpuplan.io/scheduler": "enabled"})
    rel = Release(name=name, namespace=ns, tj_namespace=tj_ns, scheduler_name=scheduler_name,
                  values=values, workdir=workdir, cluster=cluster,
                  revision=1 if request.param.startswith("fresh") else 2)
    try:
        if request.param.startswith("fresh"):
            helm(testbed, "install", name, str(CHART), "-n", ns,
                 "-f", str(workdir / "values.yaml"))
        else:
            install_previous_then_upgrade(rel, testbed, kubectl)
        wait_for_pods(rel, kubectl)
        rel.containers = ih.plan_containers(cluster, ns, workdir / "pods")
        with ih.running(rel.containers):
            yield rel
    finally:
        helm(testbed, "uninstall", name, "-n", ns, "--wait", check=False)
        # The CRD change undone: this manager's apply of the chart's CRDs drops the marker.
        kubectl("apply", "--server-side", "--force-conflicts", f"--field-manager={CRD_MANAGER}",
                "-f", str(CHART / "crds"),
                check=False)
        kubectl("delete", "namespace", ns, tj_ns, "--wait=false", "--ignore-not-found",
                check=False)


def test_pods_pass_restricted_pod_security(release: Release) -> None:
    """Every Deployment gets its pods in a namespace enforcing `restricted`, and kwok runs
    them on a node (they are Running there; the containers themselves run locally)."""
    assert not release.admission_events, "\n".join(release.admission_events)
    for dep in deployments(release):
        pods = release.pods_seen.get(dep["metadata"]["name"], [])
        assert len(pods) == dep["spec"].get("replicas", 1), (dep["metadata"]["name"], pods)
    for pods in release.pods_seen.values():
        for pod in pods:
            assert pod["spec"].get("nodeName"), f"{pod['metadata']['name']} never landed"


def test_every_container_comes_up_as_its_service_account(release: Release) -> None:
    """Each rendered container, run with its own ServiceAccount's token, passes its probes, and
    the API server refused none of its requests (a missing RBAC rule fails here)."""
    names = {c.label for c in release.containers}
    assert len(names) >= 3, names  # estimator, operator, scheduler (+ extender)
    ready_after = ih.wait_ready(release.containers, READY_TIMEOUT_S)
    for c in release.containers:
        assert c.service_account, c.label
        refused = ih.forbidden_lines(c.log_text())
        assert not refused, f"{c.label} as {c.service_account} was refused:\n" + \
                            "\n".join(refused[:10])
    print("ready after (s):", {k: round(v, 1) for k, v in ready_after.items()})


def example_prerequisites(kubectl: Kubectl, namespace: str) -> None:
    """The ConfigMaps the examples name: ResNet-50 from the onnx wheel (as the example's comment
    says), GPT-2 and Llama configs from transformers' defaults."""
    from transformers import GPT2Config, LlamaConfig

    kubectl("create", "configmap", "resnet50-onnx", "-n", namespace,
            f"--from-file=model.onnx={RESNET50}")
    # A Llama of 2 layers: the same meta-device export as 7B's 32, inside the 60 s request
    # deadline on the 2-core testbed (7B's took longer).
    llama = LlamaConfig(num_hidden_layers=2)
    for cm, config in (("llama-config", llama), ("gpt2-config", GPT2Config())):
        body = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": cm},
                "data": {"config.json": config.to_json_string()}}
        kubectl("create", "-n", namespace, "-f", "-", input=json.dumps(body))


def runnable_example(path: pathlib.Path) -> dict[str, Any]:
    """The example as written, except a model URL (models.example.com is a placeholder, and
    the testbed has no network) becomes the same model's config from a ConfigMap; the graph
    built from it has no KV-cache dims, so the URL graph's `training.dims` go too."""
    doc: dict[str, Any] = yaml.safe_load(path.read_text())
    if "url" in doc["spec"]["model"].get("onnx", {}):
        doc["spec"]["model"] = {"hfConfig": {"configMapKeyRef": {"name": "gpt2-config",
                                                                 "key": "config.json"}}}
        doc["spec"]["training"].pop("dims", None)
    return doc


def condition(tj: dict[str, Any], kind: str) -> dict[str, Any] | None:
    """The TrainingJob's condition `kind` when True."""
    for c in tj.get("status", {}).get("conditions", []):
        if c["type"] == kind and c["status"] == "True":
            return dict(c)
    return None


def test_examples_run_through_the_installed_parts(release: Release, kubectl: Kubectl) -> None:
    """Each docs/examples TrainingJob: planned by the installed estimator, launched by the
    installed operator, placed by the installed scheduler through the installed extender on a
    node of the planned GPU type, Succeeded; the drift metric is on the operator's /metrics."""
    ih.wait_ready(release.containers, READY_TIMEOUT_S)
    ns = release.tj_namespace
    example_prerequisites(kubectl, ns)
    docs = {p.name: runnable_example(p) for p in EXAMPLES}
    assert len(docs) >= 4, docs.keys()
    for doc in docs.values():
        kubectl("apply", "-n", ns, "-f", "-", input=json.dumps(doc))
    names = [d["metadata"]["name"] for d in docs.values()]

    def outcome() -> dict[str, Any] | None:
        """All examples Succeeded, or one Failed, or the API refused a container: else None."""
        tjs = {t["metadata"]["name"]: t
               for t in kubectl.json("get", "trainingjobs", "-n", ns)["items"]}
        failed = {n: condition(tjs[n], "Failed") for n in names
                  if n in tjs and condition(tjs[n], "Failed")}
        refused = {c.label: ih.forbidden_lines(c.log_text())[:5] for c in release.containers
                   if ih.forbidden_lines(c.log_text())}
        done = all(n in tjs and condition(tjs[n], "Succeeded") for n in names)
        return ({"tjs": tjs, "failed": failed, "refused": refused}
                if done or failed or refused else None)

    try:
        result = wait_for(outcome, EXAMPLE_TIMEOUT_S, "every example TrainingJob to succeed",
                          interval=1.0)
    except AssertionError as exc:
        state = {t["metadata"]["name"]: t.get("status", {}).get("conditions")
                 for t in kubectl.json("get", "trainingjobs", "-n", ns)["items"]}
        logs = "\n".join(f"--- {c.label}\n{c.log_tail(15)}" for c in release.containers)
        raise AssertionError(f"{exc}\nconditions: {ih.dump(state)}\n{logs}") from None
    assert not result["refused"], f"the API server refused: {ih.dump(result['refused'])}"
    assert not result["failed"], f"failed: {ih.dump(result['failed'])}"
    tjs = result["tjs"]
    nodes = {n["metadata"]["name"]: n["metadata"]["labels"]
             for n in kubectl.json("get", "nodes")["items"]}
    events = kubectl.json("get", "events", "-n", ns)["items"]
    for name in names:
        plan = tjs[name]["status"]["plan"]
        pods = kubectl.json("get", "pods", "-n", ns, "-l", f"gpuplan.io/trainingjob={name}")
        assert pods["items"], f"{name}: no pods"
        for pod in pods["items"]:
            pod_name = pod["metadata"]["name"]
            assert pod["spec"]["schedulerName"] == release.scheduler_name, pod_name
            product = nodes[pod["spec"]["nodeName"]].get("nvidia.com/gpu.product")
            assert product == plan["gpuType"], (pod_name, product, plan["gpuType"])
            scheduled = [e for e in events if e["reason"] == "Scheduled"
                         and e["involvedObject"]["name"] == pod_name]
            assert scheduled, f"{pod_name}: no Scheduled event"
            by = {e.get("reportingComponent") or e.get("source", {}).get("component")
                  for e in scheduled}
            assert by == {release.scheduler_name}, (pod_name, by)
        assert pods["items"][0]["status"]["phase"] == "Succeeded", name
    operator = release.container("-operator", "operator")
    metrics_port = release.values["operator"]["metricsPort"]
    text = ih.scrape(f"http://127.0.0.1:{operator.local_port(metrics_port)}/metrics")
    for name in names:
        gpu = tjs[name]["status"]["plan"]["gpuType"]
        labels = f'gpu_type="{gpu}",trainingjob_namespace="{release.tj_namespace}"'
        assert f"gpuplan_drift_ratio_count{{{labels}}}" in text, gpu
    assert 'gpuplan_estimator_requests_total{outcome="ok"}' in text
    # The installed estimator planned them, and took each outcome from the operator (its
    # ServiceAccount token, reviewed by the API server, on POST /v1/outcomes).
    # The estimator serves /metrics on a port of its own, never on its API port (#33).
    estimator_metrics_port = release.values["estimator"]["metricsPort"]
    wanted = (("/v1/plans", "200"), ("/v1/outcomes", "201"))

    def served_all() -> str | None:
        text = ih.scrape(f"http://127.0.0.1:{estimator_metrics_port}/metrics")
        return text if all(served_count(text, e, c) >= len(names) for e, c in wanted) else None

    # The operator posts an outcome after it has recorded the job's drift, so on a loaded
    # machine the estimator's count can trail the Succeeded condition by a moment.
    with contextlib.suppress(AssertionError):  # the assertions below name what is missing
        wait_for(served_all, OUTCOME_TIMEOUT_S, "the estimator to count every plan and outcome")
    served = ih.scrape(f"http://127.0.0.1:{estimator_metrics_port}/metrics")
    for endpoint, code in wanted:
        assert served_count(served, endpoint, code) >= len(names), served_failure(
            served, endpoint, release, kubectl.json("get", "events", "-n", ns)["items"])
    extender_port = release.values["scheduler"]["extender"]["port"]
    ext = ih.scrape(f"http://127.0.0.1:{extender_port}/metrics")
    filtered = [line for line in ext.splitlines()
                if line.startswith("gpuplan_extender_requests_total")
                and 'verb="filter"' in line and 'result="ok"' in line]
    assert filtered and float(filtered[0].split()[-1]) >= len(names), filtered
    for c in release.containers:
        assert not ih.forbidden_lines(c.log_text()), c.label


def served_failure(metrics: str, endpoint: str, release: Release,
                   events: list[dict[str, Any]]) -> str:
    """Why the estimator served too few of `endpoint`: its counters, the outcomes the operator
    reported lost, and the estimator's errors (one string, so pytest prints all of it)."""
    counters = [line for line in metrics.splitlines()
                if line.startswith("gpuplan_estimator_http_requests_total")]
    lost = [e["message"] for e in events if e["reason"] == "OutcomeNotRecorded"]
    log = [line for c in release.containers if c.deployment.endswith("-estimator")
           for line in c.log_text().splitlines()
           if any(w in line.lower() for w in ("error", "warning", "refused"))
           or "Traceback" in line or line.startswith(" ")]
    return "\n".join([f"too few {endpoint}:", *counters, "lost outcomes:", *lost,
                      "estimator errors:", *log[-60:]])


def served_count(metrics: str, endpoint: str, code: str) -> float:
    """`gpuplan_estimator_http_requests_total` for one endpoint and status code."""
    for line in metrics.splitlines():
        if (line.startswith("gpuplan_estimator_http_requests_total{")
                and f'endpoint="{endpoint}"' in line and f'code="{code}"' in line):
            return float(line.split()[-1])
    return 0.0


def changed_crd(crd: dict[str, Any], marker: str) -> dict[str, Any]:
    """A CRD change an upgrade could bring: a new optional spec field, and an annotation."""
    out = copy.deepcopy(crd)
    out["metadata"].setdefault("annotations", {})["gpuplan.io/install-test"] = marker
    for version in out["spec"]["versions"]:
        spec = version["schema"]["openAPIV3Schema"]["properties"]["spec"]
        spec["properties"]["installTestMarker"] = {"type": "string",
                                                   "description": "install test only"}
    return out


def release_objects(kubectl: Kubectl, release: Release, *, namespaced: bool
                    ) -> list[str]:
    """`kind/name` of every object labelled with the release (namespaced: in its namespace)."""
    kinds = kubectl("api-resources", "--verbs=list", f"--namespaced={str(namespaced).lower()}",
                    "-o", "name").stdout.split()
    kinds = [k for k in kinds if k not in RUNTIME_KINDS]
    scope = ["-n", release.namespace] if namespaced else []
    out = kubectl("get", ",".join(kinds), *scope, "-l", f"{INSTANCE}={release.name}",
                  "-o", "name", "--ignore-not-found").stdout
    return out.split()


def test_the_api_server_is_the_testbeds_kubernetes(kubectl: Kubectl) -> None:
    """The install runs on the Kubernetes version the testbed was built for (#32)."""
    server = kubectl.json("version", "-o", "json")["serverVersion"]
    assert server["gitVersion"] == f"v{built_kube_version()}", server


def test_helm_test_plans_through_the_installed_estimator(
        release: Release, testbed: Testbed, kubectl: Kubectl, tmp_path: pathlib.Path) -> None:
    """`helm test`: its hook pod, run as the kubelet would run it (a local process, its exit
    code written back as the pod's phase), plans a tiny model through the installed estimator."""
    ih.wait_ready(release.containers, READY_TIMEOUT_S)
    args = [str(testbed.helm_path), f"--kubeconfig={testbed.kubeconfig}", "test", release.name,
            "-n", release.namespace, f"--timeout={HELM_TEST_TIMEOUT_S}s"]
    pod_name = f"{release.name}-gpuplan-test-plan"
    with subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True) as helm_test, contextlib.ExitStack() as cleanup:
        # A failed hook pod stays (hook-succeeded deletes only a passing one) and would outlive
        # `helm uninstall`.
        cleanup.callback(kubectl, "delete", "pod", pod_name, "-n", release.namespace,
                         "--ignore-not-found", "--wait=false", check=False)
        cleanup.callback(helm_test.kill)
        pod = wait_for(lambda: next(iter(kubectl.json(
            "get", "pods", "-n", release.namespace, "--field-selector",
            f"metadata.name={pod_name}")["items"]), None), 30, "the helm test pod")
        [container] = ih.pod_containers(release.cluster, release.namespace, pod,
                                        tmp_path / "test-pod")
        ih.start(container)
        assert container.proc is not None
        exit_code = container.proc.wait(HELM_TEST_TIMEOUT_S)
        ih.report_exit(release.cluster, release.namespace, pod, exit_code)
        output, _ = helm_test.communicate(timeout=HELM_TEST_TIMEOUT_S)
    assert exit_code == 0, container.log_text()
    assert "planned " in container.log_text() and " x NVIDIA-A100-SXM4-80GB" in \
        container.log_text(), container.log_text()
    assert helm_test.returncode == 0, output
    assert re.search(r"^Phase:\s+Succeeded$", output, flags=re.MULTILINE), output


def test_upgrade_with_a_crd_change_then_uninstall_leaves_nothing(
        release: Release, testbed: Testbed, kubectl: Kubectl, tmp_path: pathlib.Path) -> None:
    """docs/install.md's upgrade (apply crds/ first, then `helm upgrade`) takes a CRD change
    and a values change; `helm uninstall` removes every object of the release. The CRD stays
    by design (Helm never deletes crds/: TrainingJobs and their Jobs survive an uninstall)."""
    chart = tmp_path / "gpuplan"
    shutil.copytree(CHART, chart)
    marker = f"m-{uuid.uuid4().hex[:8]}"
    for path in (chart / "crds").glob("*.yaml"):
        docs = list(yaml.safe_load_all(path.read_text()))
        docs = [changed_crd(d, marker) if d and d["metadata"]["name"] == "trainingjobs.gpuplan.io"
                else d for d in docs]
        path.write_text(yaml.safe_dump_all(docs))
    before = kubectl.json("get", "crd", "trainingjobs.gpuplan.io")
    [operator] = [d for d in deployments(release) if d["metadata"]["name"].endswith("-operator")]
    operator_generation = operator["metadata"]["generation"]
    helm(testbed, "upgrade", release.name, str(chart), "-n", release.namespace, "--reuse-values",
         "--set", "operator.modelUrl.timeoutSeconds=31")
    after_helm = kubectl.json("get", "crd", "trainingjobs.gpuplan.io")
    # Helm alone never touches crds/ on upgrade: that is why the docs apply them first.
    assert "gpuplan.io/install-test" not in after_helm["metadata"].get("annotations", {})
    assert after_helm["metadata"]["generation"] == before["metadata"]["generation"]
    # docs/install.md's step, plus --force-conflicts (Helm created the CRD, so its manager owns
    # .spec.versions) and a field manager of our own: other sessions' operator tests apply the
    # repository's CRD as "kubectl", which must not drop the marker while this test reads it.
    kubectl("apply", "--server-side", "--force-conflicts", f"--field-manager={CRD_MANAGER}",
            "-f", str(chart / "crds"))
    probe = {"apiVersion": "gpuplan.io/v1alpha1", "kind": "TrainingJob",
             "metadata": {"name": "crd-change", "namespace": release.tj_namespace},
             "spec": {**runnable_example(EXAMPLES[0])["spec"], "installTestMarker": marker}}
    kept = wait_for(lambda: json.loads(kubectl(
        "create", "--dry-run=server", "-o", "json", "-f", "-", input=json.dumps(probe)).stdout
    )["spec"].get("installTestMarker"), 30, "the new CRD field to be served (not pruned)")
    assert kept == marker
    status = json.loads(helm(testbed, "status", release.name, "-n", release.namespace,
                             "-o", "json").stdout)
    assert status["version"] == release.revision + 1 and status["info"]["status"] == "deployed"
    [operator] = [d for d in deployments(release) if d["metadata"]["name"].endswith("-operator")]
    env = [e.get("value") for c in operator["spec"]["template"]["spec"]["containers"]
           for e in c.get("env", [])]
    assert operator["metadata"]["generation"] == operator_generation + 1 and "31" in env, env
    # The rollout, as the kubelet would see it: the new pods' containers come up.
    for c in release.containers:
        ih.stop(c)
    release.containers[:] = ih.plan_containers(release.cluster, release.namespace,
                                               tmp_path / "pods")
    for c in release.containers:
        ih.start(c)
    ih.wait_ready(release.containers, READY_TIMEOUT_S)

    helm(testbed, "uninstall", release.name, "-n", release.namespace, "--wait")
    for c in release.containers:  # the pods are gone, so the kubelet stops their containers
        ih.stop(c)

    def leftovers() -> list[str]:
        return (release_objects(kubectl, release, namespaced=True)
                + release_objects(kubectl, release, namespaced=False))

    wait_for(lambda: not leftovers(), 60, "no object labelled with the release")
    remaining = kubectl("get", "all,configmaps,secrets,serviceaccounts,roles,rolebindings,"
                        "networkpolicies,poddisruptionbudgets,persistentvolumeclaims",
                        "-n", release.namespace, "-o", "name").stdout.split()
    unexpected = [r for r in remaining
                  if (r.split("/")[0].split(".")[0], r.split("/")[1]) not in NAMESPACE_DEFAULTS]
    assert not unexpected, unexpected
    cluster_named = kubectl("get", "clusterroles,clusterrolebindings,"
                            "validatingadmissionpolicies,validatingadmissionpolicybindings",
                            "-o", "name").stdout.split()
    assert not [r for r in cluster_named if r.split("/")[1].startswith(release.name)]
    assert kubectl.json("get", "crd", "trainingjobs.gpuplan.io")["metadata"]["name"]
