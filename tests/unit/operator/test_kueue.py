"""Kueue queues: quota → GPU types, the suspended Job, the Queued condition, the spec field."""

from __future__ import annotations

import asyncio
import datetime
import re
from typing import Any

import kopf
import pytest
import yaml
from aiohttp import web
from prometheus_client import CollectorRegistry

from gpuplan_operator import handlers, metrics, modelsource, reconcile
from gpuplan_operator.core import errors, gpu_pools, kueue, manifests, settings, validation
from gpuplan_testing.kueue_builders import ClusterQueueBuilder, local_queue, resource_flavor
from gpuplan_testing.operator_builders import (
    LocalServer,
    PlanningKube,
    SpecBuilder,
    make_plan,
    no_feasible_plan,
)
from gpuplan_testing.paths import REPO_ROOT

NOW = datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC)
L4, A100, H100 = "NVIDIA-L4", "NVIDIA-A100-SXM4-80GB", "NVIDIA-H100-80GB-HBM3"
POOLS = [gpu_pools.ClusterGpuPool(A100, 8, 4, 32), gpu_pools.ClusterGpuPool(H100, 8, 4, 30),
         gpu_pools.ClusterGpuPool(L4, 4, 8, 32)]
FLAVORS = [resource_flavor("a100", A100), resource_flavor("h100", H100),
           resource_flavor("l4", L4), resource_flavor("cpu")]


def quota_of(cq: dict[str, Any], flavors: list[dict[str, Any]] | None = None) -> kueue.QueueQuota:
    return kueue.queue_quota(local_queue("team", "ns", "cq"), cq,
                             FLAVORS if flavors is None else flavors)


# ---- pure: LocalQueue → ClusterQueue → flavors → GPU types


def test_only_flavors_with_gpu_quota_and_a_product_label_count() -> None:
    cq = (ClusterQueueBuilder("cq").flavor("l4", gpus=16).flavor("a100", gpus=0)
          .flavor("cpu", gpus=8).flavor("gone", gpus=8)
          .flavor("h100", gpus=64, covered=("cpu",)).reserved("l4", 12).obj())
    quota = quota_of(cq)
    assert quota.nominal_gpus_by_type() == {L4: 16}
    assert quota.left_gpus_by_type() == {L4: 4}
    assert quota.name == "LocalQueue ns/team (ClusterQueue cq)"
    assert quota.ignored == ("a100: no nvidia.com/gpu nominal quota",
                             "cpu: no nvidia.com/gpu.product in nodeLabels",
                             "gone: ResourceFlavor not found")


def test_flavors_of_one_type_add_up_and_quantities_are_parsed() -> None:
    flavors = [*FLAVORS, resource_flavor("l4-spot", L4)]
    cq = ClusterQueueBuilder("cq").flavor("l4", gpus="8").flavor("l4-spot", gpus="4000m").obj()
    assert quota_of(cq, flavors).nominal_gpus_by_type() == {L4: 12}


def test_a_fractional_quota_is_reported_not_taken() -> None:
    quota = quota_of(ClusterQueueBuilder("cq").flavor("l4", gpus="1500m").obj())
    assert quota.flavors == ()
    assert quota.ignored == ("l4: fractional GPU quantity: '1500m'",)


def test_a_local_queue_without_cluster_queue_is_an_error() -> None:
    lq = local_queue("team", "ns", "")
    with pytest.raises(kueue.QueueError, match=r"LocalQueue ns/team names no spec\.clusterQueue"):
        kueue.cluster_queue_name(lq)


@pytest.mark.parametrize(("gpus", "expected"), [
    (64, {A100: (8, 4)}),   # more quota than the cluster: the cluster bounds it
    (16, {A100: (8, 2)}),   # two whole nodes
    (12, {A100: (8, 1)}),   # whole nodes only: 1.5 nodes is one
    (4, {A100: (4, 1)}),    # less than a node: one node of that many GPUs
])
def test_pools_are_cut_to_the_quota(gpus: int, expected: dict[str, tuple[int, int]]) -> None:
    quota = quota_of(ClusterQueueBuilder("cq").flavor("a100", gpus=gpus).obj())
    out = kueue.restrict_pools(POOLS, quota)
    assert {p.gpu_type: (p.gpus_per_node, p.nodes) for p in out} == expected
    assert all(p.free_gpus <= p.gpus_per_node * p.nodes for p in out)


def test_no_gpu_type_message_names_the_queue_and_what_was_left_out() -> None:
    quota = quota_of(ClusterQueueBuilder("cq").flavor("cpu", gpus=8).obj(),
                     [*FLAVORS, resource_flavor("t4", "Tesla-T4")])
    assert kueue.restrict_pools(POOLS, quota) == []
    quota2 = quota_of(ClusterQueueBuilder("cq").flavor("t4", gpus=8).obj(),
                      [*FLAVORS, resource_flavor("t4", "Tesla-T4")])
    text = kueue.describe_no_gpu_types(quota2, POOLS)
    assert text.startswith("LocalQueue ns/team (ClusterQueue cq) has no nvidia.com/gpu quota "
                           f"for a GPU type of the cluster ({A100}, {H100}, {L4})")
    assert "quota for Tesla-T4 (8)" in text
    assert "cpu: no nvidia.com/gpu.product" in kueue.describe_no_gpu_types(quota, POOLS)


# ---- spec field, CRD and manifests


@pytest.mark.parametrize(("kueue_spec", "problem"), [
    ({"localQueue": "team-a"}, None),
    ({}, None),
    ({"localQueue": "Team"}, "spec.kueue.localQueue: must be a DNS label"),
    ({"localQueue": "a" * 64}, "spec.kueue.localQueue: must be a DNS label"),
    ({"localQueue": "-a"}, "spec.kueue.localQueue: must be a DNS label"),
    ({"localQueue": 3}, "spec.kueue.localQueue: must be a DNS label"),
    ("team", "spec.kueue: must be an object"),
])
def test_kueue_field_is_validated(kueue_spec: object, problem: str | None) -> None:
    problems = validation.validate_spec(SpecBuilder().set("kueue", kueue_spec).obj())
    if problem is None:
        assert problems == []
    else:
        assert len(problems) == 1 and problems[0].startswith(problem)


def test_parse_spec_carries_the_queue_and_none_without_it() -> None:
    spec = validation.parse_spec(SpecBuilder().set("kueue.localQueue", "team").obj())
    assert spec.local_queue == "team"
    assert validation.parse_spec(SpecBuilder().obj()).local_queue is None


@pytest.mark.parametrize("name", ["team", "a", "a-1", "Team", "-a", "a-", "a" * 63, "a" * 64])
def test_crd_and_validation_agree_on_queue_names(name: str) -> None:
    doc = yaml.safe_load((REPO_ROOT / "crds" / "trainingjobs.gpuplan.io.yaml").read_text())
    (version,) = doc["spec"]["versions"]
    field = version["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]["kueue"][
        "properties"]["localQueue"]
    by_crd = (field["minLength"] <= len(name) <= field["maxLength"]
              and re.fullmatch(field["pattern"].strip("^$"), name) is not None)
    by_operator = not validation.validate_spec(SpecBuilder().set("kueue.localQueue", name).obj())
    assert by_crd == by_operator


@pytest.mark.parametrize("nodes", [1, 2])
def test_queued_job_is_suspended_and_labelled(nodes: int) -> None:
    plan = make_plan(gpu_count=8 * nodes, gpus_per_node=8, nodes=nodes)
    owner = manifests.Owner(name="tj", uid="u")
    template = SpecBuilder().obj()["template"]
    job = manifests.build_job(owner=owner, namespace="ns", plan=plan, template=template,
                              local_queue="team")
    assert job["spec"]["suspend"] is True
    assert job["metadata"]["labels"] == {"gpuplan.io/trainingjob": "tj",
                                         "kueue.x-k8s.io/queue-name": "team"}
    # One PodSet of `nodes` pods: Kueue reserves quota for all of them or for none.
    assert (job["spec"]["parallelism"], job["spec"]["completions"]) == (nodes, nodes)
    assert job["spec"].get("completionMode") == ("Indexed" if nodes > 1 else None)
    plain = manifests.build_job(owner=owner, namespace="ns", plan=plan, template=template)
    assert "suspend" not in plain["spec"]
    assert "kueue.x-k8s.io/queue-name" not in plain["metadata"]["labels"]


# ---- reconcile against a fake kube with Kueue objects


class FakeKube(PlanningKube):
    """The `kube.Kube` methods reconcile uses, with Kueue's objects in dicts."""

    def __init__(self) -> None:
        super().__init__([_node(f"l4-{i}", L4, 4) for i in range(4)]
                         + [_node(f"a100-{i}", A100, 8) for i in range(2)])
        self.local_queues = {"team": local_queue("team", "ns", "cq")}
        self.cluster_queues = {"cq": ClusterQueueBuilder("cq").flavor("l4", gpus=8).obj()}
        self.flavors = list(FLAVORS)

    async def get_local_queue(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self.local_queues.get(name)

    async def get_cluster_queue(self, name: str) -> dict[str, Any] | None:
        return self.cluster_queues.get(name)

    async def list_resource_flavors(self) -> list[dict[str, Any]]:
        return list(self.flavors)


def _node(name: str, product: str, gpus: int) -> dict[str, Any]:
    return {"metadata": {"name": name, "labels": {"nvidia.com/gpu.product": product}},
            "spec": {}, "status": {"allocatable": {"nvidia.com/gpu": str(gpus)},
                                   "conditions": [{"type": "Ready", "status": "True"}]}}


class Estimator:
    """A fake `POST /v1/plans` that records requests and plans the first inventory entry."""

    def __init__(self, reject: bool = False) -> None:
        self.requests: list[dict[str, Any]] = []
        self.reject = reject
        self.app = web.Application()
        self.app.router.add_post("/v1/plans", self.plans)

    async def plans(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.requests.append(body)
        if self.reject:
            return no_feasible_plan()
        pool = body["inventory"][0]
        return web.json_response({"plan": {
            "gpu_type": pool["gpu_type"], "device": "l4", "gpu_count": pool["gpus_per_node"],
            "gpus_per_node": pool["gpus_per_node"], "nodes": 1, "estimated_seconds": 100.0,
            "step_time_ms": 10.0, "memory_bytes_per_gpu": 1, "cost_usd": 1.0,
            "predictor": "p"}})


def _context(kube: FakeKube, url: str = "http://127.0.0.1:9") -> reconcile.Context:
    return reconcile.Context(
        kube=kube, settings=settings.Settings(estimator_url=url),  # type: ignore[arg-type]
        metrics=metrics.OperatorMetrics(CollectorRegistry()), clock=lambda: NOW,
        guard=modelsource.UrlGuard())


def _reconcile(kube: FakeKube, estimator: Estimator,
               spec: dict[str, Any]) -> list[tuple[bool, str]]:
    events: list[tuple[bool, str]] = []

    def emit(*, warning: bool, reason: str, message: str) -> None:
        events.append((warning, reason))

    async def go() -> None:
        async with LocalServer(estimator.app) as srv:
            tj = reconcile.TrainingJobRef("ns", "tj", "uid-1", 1, {}, emit)
            await reconcile.reconcile(_context(kube, srv.url), tj, spec)
    asyncio.run(go())
    return events


def _conditions(kube: FakeKube) -> dict[str, dict[str, Any]]:
    return {c["type"]: c for c in kube.status["conditions"]}


QUEUED_SPEC = SpecBuilder().set("kueue.localQueue", "team").obj()


def test_queued_job_plans_within_the_quota_and_waits_for_admission() -> None:
    kube, est = FakeKube(), Estimator()
    events = _reconcile(kube, est, QUEUED_SPEC)
    [request] = est.requests
    assert request["inventory"] == [
        {"gpu_type": L4, "gpus_per_node": 4, "nodes": 2, "free_gpus": 8}]
    job = kube.jobs["tj-train"]
    assert job["spec"]["suspend"] is True
    assert job["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "team"
    conditions = _conditions(kube)
    assert [c["type"] for c in kube.status["conditions"]] == ["Estimated", "Queued", "Launched"]
    assert "LocalQueue ns/team (ClusterQueue cq): NVIDIA-L4 8/8 GPUs left" in conditions[
        "Estimated"]["message"]
    queued = conditions["Queued"]
    assert (queued["status"], queued["reason"]) == ("True", "WaitingForAdmission")
    assert queued["message"] == "Job tj-train waits for Kueue admission in LocalQueue ns/team"
    assert events == [(False, "Planned"), (False, "WaitingForAdmission"), (False, "JobCreated")]


def test_unqueued_job_reads_no_kueue_object() -> None:
    kube, est = FakeKube(), Estimator()
    kube.local_queues = {}  # reading one would fail the pass
    _reconcile(kube, est, SpecBuilder().obj())
    assert {p["gpu_type"] for p in est.requests[0]["inventory"]} == {L4, A100}
    assert "suspend" not in kube.jobs["tj-train"]["spec"]
    assert "Queued" not in _conditions(kube)


def test_queue_without_gpu_quota_is_no_feasible_plan_naming_it() -> None:
    kube, est = FakeKube(), Estimator()
    kube.cluster_queues["cq"] = ClusterQueueBuilder("cq").flavor("h100", gpus=8).obj()
    with pytest.raises(errors.NoQueueQuotaError):
        _reconcile(kube, est, QUEUED_SPEC)
    assert est.requests == [] and kube.jobs == {}
    estimated = _conditions(kube)["Estimated"]
    assert (estimated["status"], estimated["reason"]) == ("False", "NoFeasiblePlan")
    assert estimated["message"].startswith(
        "LocalQueue ns/team (ClusterQueue cq) has no nvidia.com/gpu quota for a GPU type of "
        f"the cluster ({A100}, {L4}); quota for {H100} (8)")
    assert reconcile.awaits_capacity(kube.status, 1)


def test_estimator_rejection_within_a_queue_names_the_queue() -> None:
    kube = FakeKube()
    with pytest.raises(errors.EstimatorRejectedError):
        _reconcile(kube, Estimator(reject=True), QUEUED_SPEC)
    assert _conditions(kube)["Estimated"]["message"] == (
        "within LocalQueue ns/team (ClusterQueue cq): no candidate meets the deadline")


@pytest.mark.parametrize(("missing", "message"), [
    ("local", "LocalQueue ns/team not found (spec.kueue.localQueue; is Kueue installed?)"),
    ("cluster", "ClusterQueue cq of LocalQueue ns/team not found"),
])
def test_missing_queue_is_retried_with_backoff(missing: str, message: str) -> None:
    kube = FakeKube()
    if missing == "local":
        kube.local_queues = {}
    else:
        kube.cluster_queues = {}
    with pytest.raises(errors.QueueNotFoundError) as caught:
        _reconcile(kube, Estimator(), QUEUED_SPEC)
    assert str(caught.value) == message
    assert _conditions(kube)["Estimated"]["reason"] == "QueueNotFound"
    ctx = _context(kube)
    out = handlers._kopf_error(ctx, caught.value, retry=0)
    assert isinstance(out, kopf.TemporaryError)
    assert out.delay == ctx.settings.retry_delay_seconds(0)


def test_admission_and_eviction_follow_the_jobs_suspend() -> None:
    kube, est = FakeKube(), Estimator()
    _reconcile(kube, est, QUEUED_SPEC)
    job = kube.jobs["tj-train"]
    job["metadata"].update(uid="job-1", namespace="ns")
    ctx = _context(kube)
    events: list[str] = []

    def emit_for(_body: Any) -> reconcile.EventSink:
        def emit(*, warning: bool, reason: str, message: str) -> None:
            events.append(reason)
        return emit

    async def event(suspend: bool) -> None:
        job["spec"]["suspend"] = suspend
        await reconcile.record_job(ctx, job, emit_for)

    asyncio.run(event(False))
    admitted = _conditions(kube)["Queued"]
    assert (admitted["status"], admitted["reason"]) == ("False", "Admitted")
    assert admitted["message"] == "Kueue admitted Job tj-train (LocalQueue ns/team)"
    reads = kube.tj_reads
    asyncio.run(event(False))  # further events of an admitted Job read nothing
    assert kube.tj_reads == reads
    asyncio.run(event(True))  # Kueue evicted it: queued again
    assert _conditions(kube)["Queued"]["reason"] == "WaitingForAdmission"
    assert events == ["Admitted", "WaitingForAdmission"]
