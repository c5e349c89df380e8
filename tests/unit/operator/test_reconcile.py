"""Reconcile ordering and idempotency against an in-memory fake of the `kube` module's facade."""

from __future__ import annotations

import asyncio
import base64
import datetime
import json
import math
from typing import Any

import pytest
from aiohttp import web
from prometheus_client import CollectorRegistry

from gpuplan_operator import kube, metrics, modelsource, reconcile
from gpuplan_operator.core import errors, gpu_pools, manifests, settings
from gpuplan_testing.operator_builders import (
    LocalServer,
    SchedulingKubeMixin,
    SpecBuilder,
    make_plan,
)

NOW = datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC)
PLAN = {"plan": {"gpu_type": "NVIDIA-L4", "device": "l4", "gpu_count": 2, "gpus_per_node": 2,
                 "nodes": 1, "estimated_seconds": 100.0, "step_time_ms": 10.0,
                 "memory_bytes_per_gpu": 1, "cost_usd": 1.0, "predictor": "p"}}


class FakeKube(SchedulingKubeMixin):
    """Same async methods as `kube.Kube`, backed by dicts; `calls` records the order."""

    def __init__(self, config_maps: dict[str, Any] | None = None) -> None:
        self.calls: list[str] = []
        self.config_maps = config_maps or {}
        self.jobs: dict[str, dict[str, Any]] = {}
        self.status: dict[str, Any] = {}
        self.annotations: dict[str, str] = {}
        self.nodes: list[dict[str, Any]] = []
        self.pods: list[dict[str, Any]] = []
        self.service_accounts: set[str] = set()
        self.create_job_error: Exception | None = None
        self.node_lists = 0
        self.init_scheduling()

    async def get_config_map(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self.config_maps.get(name)

    async def list_gpu_nodes(self) -> list[dict[str, Any]]:
        self.node_lists += 1
        return list(self.nodes)

    async def get_service_account(self, namespace: str, name: str) -> dict[str, Any] | None:
        return {"metadata": {"name": name}} if name in self.service_accounts else None

    async def list_job_pods(self, namespace: str, job_uid: str) -> list[dict[str, Any]]:
        return list(self.pods)

    async def list_active_pods(self) -> list[dict[str, Any]]:
        return []

    async def patch_trainingjob_status(self, namespace: str, name: str,
                                       status: dict[str, Any]) -> dict[str, Any]:
        self.calls.append("status:" + ",".join(sorted(status)))
        self.status.update(status)
        return {}

    async def patch_trainingjob_annotations(self, namespace: str, name: str,
                                            annotations: dict[str, str]) -> dict[str, Any]:
        self.calls.append("annotations")
        self.annotations.update(annotations)
        return {}

    async def get_trainingjob(self, namespace: str, name: str) -> dict[str, Any] | None:
        return {"metadata": {"name": name, "uid": "uid-1", "generation": 1},
                "status": dict(self.status)}

    async def create_job(self, namespace: str,
                         body: dict[str, Any]) -> tuple[dict[str, Any], bool]:
        name = body["metadata"]["name"]
        self.calls.append("create_job")
        if self.create_job_error is not None:
            raise self.create_job_error
        if name in self.jobs:
            return self.jobs[name], False
        self.jobs[name] = body
        return body, True

    async def create_service(self, namespace: str,
                             body: dict[str, Any]) -> tuple[dict[str, Any], bool]:
        self.calls.append("create_service")
        return body, True


CM = {"resnet": {"metadata": {"name": "resnet"},
                 "binaryData": {"model.onnx": base64.b64encode(b"\x08\x07").decode()}}}


def _run(kube: FakeKube, spec: dict[str, Any], status: dict[str, Any] | None = None,
         estimator: web.Application | None = None,
         annotations: dict[str, str] | None = None) -> list[tuple[bool, str]]:
    events: list[tuple[bool, str]] = []

    def emit(*, warning: bool, reason: str, message: str) -> None:
        events.append((warning, reason))

    async def go() -> None:
        app = estimator or web.Application()
        async with LocalServer(app) as srv:
            ctx = reconcile.Context(
                kube=kube,  # type: ignore[arg-type]
                settings=settings.Settings(estimator_url=srv.url),
                metrics=metrics.OperatorMetrics(CollectorRegistry()), clock=lambda: NOW,
                guard=modelsource.UrlGuard())
            tj = reconcile.TrainingJobRef("ns", "tj", "uid-1", 1, dict(status or {}), emit,
                                          annotations=dict(annotations or {}))
            await reconcile.reconcile(ctx, tj, spec)
    asyncio.run(go())
    return events


def _estimator(answer: dict[str, Any] = PLAN) -> web.Application:
    async def plans(_: web.Request) -> web.Response:
        return web.json_response(answer)
    app = web.Application()
    app.router.add_post("/v1/plans", plans)
    return app


def test_plan_is_stored_before_the_job_is_created() -> None:
    kube = FakeKube(CM)
    events = _run(kube, SpecBuilder().obj(), estimator=_estimator())
    assert kube.calls == ["status:conditions,observedGeneration,plan,relativeSpeeds", "annotations",
                          "create_job", "status:conditions,jobName,observedGeneration"]
    assert kube.annotations["gpuplan.io/gpu-count"] == "2"
    assert [c["type"] for c in kube.status["conditions"]] == ["Estimated", "Launched"]
    assert events == [(False, "Planned"), (False, "JobCreated")]


def test_stored_plan_of_this_generation_is_reused_without_the_estimator() -> None:
    kube = FakeKube(CM)
    plan = make_plan(generation=1)
    status = {"plan": plan.to_status(), "conditions": [{"type": "Estimated", "status": "True"}]}
    # no estimator route: a call would fail
    _run(kube, SpecBuilder().obj(), status=status, annotations=manifests.plan_annotations(plan))
    assert kube.calls == ["create_job", "status:conditions,jobName,observedGeneration"]


SETUP = {"parallelism": {"dp": 2, "tp": 1, "pp": 1, "micro_batches": 2, "micro_batch": 4},
         "strategy": {"label": "zero-2 + accumulate x2", "zero_stage": 2, "fsdp": "none",
                      "checkpointing": "none", "checkpoint_fraction": None,
                      "gradient_accumulation": 2, "offload_optimizer": False}}


def _trainer_env(job: dict[str, Any]) -> dict[str, str]:
    (container,) = job["spec"]["template"]["spec"]["containers"]
    return {e["name"]: e["value"] for e in container["env"] if "value" in e}


def test_the_planned_condition_names_the_layout_and_strategy_the_job_gets() -> None:
    """A plan that fits only with ZeRO-2 and accumulation says so, and the trainer is told."""
    kube = FakeKube(CM)
    _run(kube, SpecBuilder().obj(), estimator=_estimator({"plan": {**PLAN["plan"], **SETUP}}))
    (estimated,) = [c for c in kube.status["conditions"] if c["type"] == "Estimated"]
    assert estimated["message"] == ("2x NVIDIA-L4 (1 node(s)), estimated 100s, predictor p; "
                                    "dp=2 tp=1 pp=1, zero-2 + accumulate x2")
    assert kube.status["plan"]["memoryStrategy"]["label"] == "zero-2 + accumulate x2"
    env = _trainer_env(kube.jobs["tj-train"])
    assert (env["GPUPLAN_ZERO_STAGE"], env["GPUPLAN_GRADIENT_ACCUMULATION"],
            env["GPUPLAN_DATA_PARALLEL"]) == ("2", "2", "2")


def test_a_restarted_operator_launches_the_stored_strategy() -> None:
    """The Job made from status.plan alone (no estimator) still carries the strategy."""
    kube = FakeKube(CM)
    _run(kube, SpecBuilder().obj(), estimator=_estimator({"plan": {**PLAN["plan"], **SETUP}}))
    first = kube.jobs.pop("tj-train")
    status = {"plan": kube.status["plan"],
              "conditions": [{"type": "Estimated", "status": "True"}]}
    _run(kube, SpecBuilder().obj(), status=status, annotations=dict(kube.annotations))
    assert _trainer_env(kube.jobs["tj-train"]) == _trainer_env(first)


def test_crash_after_the_plan_status_leaves_nothing_undone() -> None:
    """Killed between writing status.plan and the annotations: the next pass writes them
    from the stored plan, then launches, without asking the estimator again."""
    kube = FakeKube(CM)
    plan = make_plan(generation=1)
    status = {"plan": plan.to_status(), "conditions": [{"type": "Estimated", "status": "True"}]}
    _run(kube, SpecBuilder().obj(), status=status)
    assert kube.calls == ["annotations", "create_job",
                          "status:conditions,jobName,observedGeneration"]
    assert kube.annotations == manifests.plan_annotations(plan)
    assert list(kube.jobs) == ["tj-train"]


def test_launched_job_without_annotations_gets_them_and_no_second_job() -> None:
    kube = FakeKube(CM)
    plan = make_plan(generation=1)
    status = {"plan": plan.to_status(), "jobName": "tj-train",
              "conditions": [{"type": "Estimated", "status": "True"},
                             {"type": "Launched", "status": "True"}]}
    _run(kube, SpecBuilder().obj(), status=status, annotations={"other": "kept"})
    assert kube.calls == ["annotations"]
    _run(kube, SpecBuilder().obj(), status=status,
         annotations={"other": "kept", **manifests.plan_annotations(plan)})
    assert kube.calls == ["annotations"], "annotations present: nothing to do"


def test_invalid_template_sets_condition_and_creates_nothing() -> None:
    kube = FakeKube(CM)
    with pytest.raises(errors.InvalidSpecError):
        _run(kube, SpecBuilder().set("template", {"spec": {}}).obj())
    [cond] = kube.status["conditions"]
    assert (cond["status"], cond["reason"]) == ("False", "InvalidSpec")
    assert "spec.template.spec.containers" in cond["message"]
    assert not kube.jobs


def test_missing_configmap_is_temporary_with_a_condition() -> None:
    kube = FakeKube({})
    with pytest.raises(errors.ModelSourceUnavailableError):
        _run(kube, SpecBuilder().obj())
    assert kube.status["conditions"][0]["reason"] == "ModelSourceUnavailable"


def test_foreign_job_with_our_name_is_a_conflict() -> None:
    kube = FakeKube(CM)
    kube.jobs["tj-train"] = {"metadata": {"name": "tj-train", "ownerReferences": [{"uid": "x"}]}}
    with pytest.raises(errors.JobNameConflictError):
        _run(kube, SpecBuilder().obj(), estimator=_estimator())
    launched = [c for c in kube.status["conditions"] if c["type"] == "Launched"]
    assert launched[0]["status"] == "False" and launched[0]["reason"] == "JobNameConflict"


def test_finished_job_is_recorded_once() -> None:
    kube = FakeKube()
    kube.status = {"jobName": "tj-train", "plan": make_plan(estimated_seconds=50).to_status()}
    job = {"metadata": {"name": "tj-train", "namespace": "ns",
                        "labels": {"gpuplan.io/trainingjob": "tj"}},
           "status": {"startTime": "2026-01-01T00:00:00Z",
                      "completionTime": "2026-01-01T00:01:40Z",
                      "conditions": [{"type": "Complete", "status": "True"}]}}
    registry = CollectorRegistry()
    ctx = reconcile.Context(kube=kube, settings=settings.Settings(),  # type: ignore[arg-type]
                            metrics=metrics.OperatorMetrics(registry), clock=lambda: NOW,
                            guard=modelsource.UrlGuard())
    noop = lambda _body: lambda **_kw: None  # noqa: E731
    asyncio.run(reconcile.record_job(ctx, job, noop))
    asyncio.run(reconcile.record_job(ctx, job, noop))
    assert kube.status["actual"]["seconds"] == 100 and kube.status["drift"] == 2.0
    assert len([c for c in kube.calls if c.startswith("status")]) == 1
    labels = {"gpu_type": "NVIDIA-A100-SXM4-80GB", "trainingjob_namespace": "ns"}
    assert registry.get_sample_value("gpuplan_drift_ratio_count", labels) == 1


def _api_error(status: int, message: str) -> kube.ApiError:
    exc = kube.ApiError(status=status, reason="Refused")
    exc.body = json.dumps({"kind": "Status", "status": "Failure", "message": message,
                           "code": status})
    return exc


@pytest.mark.parametrize("status", [403, 422])
def test_job_rejected_by_the_api_server_is_a_condition_not_a_retry(status: int) -> None:
    kube = FakeKube(CM)
    kube.create_job_error = _api_error(status, 'Job.batch "tj-train" is invalid: spec.x: bad')
    with pytest.raises(errors.JobRejectedError) as info:
        _run(kube, SpecBuilder().obj(), estimator=_estimator())
    assert info.value.status == status
    [launched] = [c for c in kube.status["conditions"] if c["type"] == "Launched"]
    assert (launched["status"], launched["reason"]) == ("False", "JobRejected")
    assert 'Job.batch "tj-train" is invalid: spec.x: bad' in launched["message"]
    assert "jobName" not in kube.status


def test_job_refused_by_a_resource_quota_is_retried_later() -> None:
    kube = FakeKube(CM)
    kube.create_job_error = _api_error(
        403, 'jobs.batch "tj-train" is forbidden: exceeded quota: jobs, requested: '
             'count/jobs.batch=1, used: count/jobs.batch=5, limited: count/jobs.batch=5')
    with pytest.raises(errors.QuotaExceededError):
        _run(kube, SpecBuilder().obj(), estimator=_estimator())
    [launched] = [c for c in kube.status["conditions"] if c["type"] == "Launched"]
    assert (launched["status"], launched["reason"]) == ("False", "QuotaExceeded")
    assert "exceeded quota: jobs" in launched["message"]
    kube.create_job_error = None  # quota freed: the retry launches from the stored plan
    _run(kube, SpecBuilder().obj(), status=kube.status, annotations=kube.annotations)
    assert list(kube.jobs) == ["tj-train"]


def test_job_create_when_the_api_is_unavailable_is_temporary_without_a_launch_condition() -> None:
    kube = FakeKube(CM)
    kube.create_job_error = errors.KubeApiUnavailableError("Kubernetes API answered 503")
    with pytest.raises(errors.KubeApiUnavailableError):
        _run(kube, SpecBuilder().obj(), estimator=_estimator())
    assert [c["type"] for c in kube.status["conditions"]] == ["Estimated"]


def test_missing_service_account_blocks_the_launch() -> None:
    kube = FakeKube(CM)
    spec = SpecBuilder().set("template.spec.serviceAccountName", "trainer").obj()
    with pytest.raises(errors.ServiceAccountNotFoundError, match="'trainer'"):
        _run(kube, spec, estimator=_estimator())
    [launched] = [c for c in kube.status["conditions"] if c["type"] == "Launched"]
    assert (launched["status"], launched["reason"]) == ("False", "ServiceAccountNotFound")
    assert not kube.jobs and "create_job" not in kube.calls
    kube.service_accounts.add("trainer")  # created later: the retry launches
    _run(kube, spec, status=kube.status, annotations=kube.annotations)
    assert list(kube.jobs) == ["tj-train"]
    assert [c["status"] for c in kube.status["conditions"]] == ["True", "True"]


def _gpu_node(name: str, product: str, gpus: int = 8) -> dict[str, Any]:
    return {"metadata": {"name": name, "labels": {"nvidia.com/gpu.product": product}},
            "status": {"allocatable": {"nvidia.com/gpu": str(gpus)},
                       "conditions": [{"type": "Ready", "status": "True"}]}}


def _capacity_estimator(requests: list[dict[str, Any]]) -> web.Application:
    """Plans only when an NVIDIA-H200 pool is in the request's inventory."""
    async def plans(request: web.Request) -> web.Response:
        body = await request.json()
        requests.append(body)
        if any(p["gpu_type"] == "NVIDIA-H200" for p in body["inventory"]):
            return web.json_response(PLAN)
        return web.json_response({"error": {
            "reason": "NoFeasiblePlan", "message": "no usable GPU type in the inventory",
            "details": ["NVIDIA-L4: not in gpuTypes allow-list"]}}, status=422)
    app = web.Application()
    app.router.add_post("/v1/plans", plans)
    return app


def test_no_feasible_plan_is_re_evaluated_when_gpu_capacity_changes() -> None:
    kube = FakeKube(CM)
    kube.nodes = [_gpu_node("l4-0", "NVIDIA-L4", 4)]
    sent: list[dict[str, Any]] = []
    now = [NOW]

    async def go() -> None:
        async with LocalServer(_capacity_estimator(sent)) as srv:
            ctx = reconcile.Context(
                kube=kube,  # type: ignore[arg-type]
                settings=settings.Settings(estimator_url=srv.url,
                                           capacity_check_interval_seconds=30),
                metrics=metrics.OperatorMetrics(CollectorRegistry()), clock=lambda: now[0],
                guard=modelsource.UrlGuard())

            async def attempt() -> None:
                tj = reconcile.TrainingJobRef("ns", "tj", "uid-1", 1, dict(kube.status),
                                              lambda **_: None, annotations=kube.annotations)
                await reconcile.reconcile(ctx, tj, SpecBuilder().obj())

            with pytest.raises(errors.EstimatorRejectedError, match="no usable GPU type"):
                await attempt()
            assert kube.status["conditions"][0]["reason"] == "NoFeasiblePlan"
            # Unchanged capacity: no estimator call, one node list per interval for all.
            for _ in range(3):
                with pytest.raises(errors.AwaitingCapacityError):
                    await attempt()
            assert (len(sent), kube.node_lists) == (1, 2)
            kube.nodes.append(_gpu_node("h200-0", "NVIDIA-H200"))
            with pytest.raises(errors.AwaitingCapacityError):
                await attempt()  # the cached list is younger than the interval
            now[0] += datetime.timedelta(seconds=30)
            await attempt()
    asyncio.run(go())
    assert len(sent) == 2 and list(kube.jobs) == ["tj-train"]
    assert [(c["type"], c["reason"]) for c in kube.status["conditions"]] == [
        ("Estimated", "Planned"), ("Launched", "JobCreated")]


def test_free_gpus_do_not_count_as_a_capacity_change() -> None:
    busy = gpu_pools.build_inventory([_gpu_node("l4-0", "NVIDIA-L4", 4)], [
        {"spec": {"nodeName": "l4-0", "containers": [
            {"resources": {"limits": {"nvidia.com/gpu": "2"}}}]},
         "status": {"phase": "Running"}}])
    idle = gpu_pools.build_inventory([_gpu_node("l4-0", "NVIDIA-L4", 4)], [])
    assert busy != idle
    assert gpu_pools.capacity(busy) == gpu_pools.capacity(idle)


def _finished_job(condition: str, *, uid: str = "job-uid") -> dict[str, Any]:
    status: dict[str, Any] = {
        "startTime": "2026-01-01T00:00:00Z",
        "conditions": [{"type": condition, "status": "True",
                        "lastTransitionTime": "2026-01-01T00:03:20Z"}]}
    if condition == "Complete":
        status["completionTime"] = "2026-01-01T00:03:20Z"
    return {"metadata": {"name": "tj-train", "namespace": "ns", "uid": uid,
                         "labels": {"gpuplan.io/trainingjob": "tj"}}, "status": status}


def _pod(started: str) -> dict[str, Any]:
    return {"status": {"startTime": "2026-01-01T00:00:10Z", "containerStatuses": [
        {"name": "trainer", "state": {"terminated": {"startedAt": started, "exitCode": 0}}}]}}


class StaleKube(FakeKube):
    """Answers every read with the status as it was first: two racing Job events."""

    async def get_trainingjob(self, namespace: str, name: str) -> dict[str, Any] | None:
        return {"metadata": {"name": name, "uid": "uid-1", "generation": 1},
                "status": {"jobName": "tj-train",
                           "plan": make_plan(estimated_seconds=50).to_status()}}


def _record(kube: FakeKube, jobs: list[dict[str, Any]]) -> tuple[CollectorRegistry,
                                                                   list[dict[str, Any]]]:
    outcomes: list[dict[str, Any]] = []

    async def post(request: web.Request) -> web.Response:
        outcomes.append(await request.json())
        return web.json_response({}, status=201)

    app = web.Application()
    app.router.add_post("/v1/outcomes", post)
    registry = CollectorRegistry()

    async def go() -> None:
        async with LocalServer(app) as srv:
            ctx = reconcile.Context(kube=kube,  # type: ignore[arg-type]
                                    settings=settings.Settings(estimator_url=srv.url),
                                    metrics=metrics.OperatorMetrics(registry), clock=lambda: NOW,
                                    guard=modelsource.UrlGuard())
            for job in jobs:
                await reconcile.record_job(ctx, job, lambda _b: lambda **_kw: None)
    asyncio.run(go())
    return registry, outcomes


def test_drift_runs_from_the_first_container_start() -> None:
    """Queued and pulling images for 100 s: the run is the last 100 s, drift 2.0 not 4.0."""
    kube = FakeKube()
    kube.status = {"jobName": "tj-train", "plan": make_plan(estimated_seconds=50).to_status()}
    kube.pods = [_pod("2026-01-01T00:01:40Z")]
    registry, outcomes = _record(kube, [_finished_job("Complete")])
    assert kube.status["actual"]["seconds"] == 100 and kube.status["drift"] == 2.0
    assert kube.status["actual"]["startTime"] == "2026-01-01T00:01:40Z"
    succeeded = kube.status["conditions"][0]
    assert "from the first container start" in succeeded["message"]
    assert [o["actual_seconds"] for o in outcomes] == [100]
    labels = {"gpu_type": "NVIDIA-A100-SXM4-80GB", "trainingjob_namespace": "ns"}
    assert registry.get_sample_value("gpuplan_drift_log_slow_total", labels) == pytest.approx(
        math.log(2.0))


def test_failed_job_has_no_drift_and_no_outcome() -> None:
    kube = FakeKube()
    kube.status = {"jobName": "tj-train", "plan": make_plan(estimated_seconds=50).to_status()}
    kube.pods = [_pod("2026-01-01T00:01:40Z")]
    registry, outcomes = _record(kube, [_finished_job("Failed")])
    assert kube.status["actual"]["seconds"] == 100 and "drift" not in kube.status
    assert kube.status["conditions"][0]["reason"] == "JobFailed"
    assert outcomes == []
    labels = {"gpu_type": "NVIDIA-A100-SXM4-80GB", "trainingjob_namespace": "ns"}
    assert registry.get_sample_value("gpuplan_drift_ratio_count", labels) is None
    assert registry.get_sample_value("gpuplan_actual_seconds", {
        "namespace": "ns", "trainingjob": "tj", "gpu_type": "NVIDIA-A100-SXM4-80GB"}) == 100


def test_outcome_is_sent_once_per_job_even_when_events_race() -> None:
    kube = StaleKube()
    kube.pods = [_pod("2026-01-01T00:01:40Z")]
    _registry, outcomes = _record(kube, [_finished_job("Complete")] * 3)
    assert [o["job_uid"] for o in outcomes] == ["uid-1"]


def test_start_seen_while_running_survives_a_pod_that_forgot_it() -> None:
    """The running pod's start is noted in status.actual.startTime; at the end the pod is
    gone (replaced) or reports its termination time as its start: the noted start wins."""
    kube = FakeKube()
    kube.status = {"jobName": "tj-train", "plan": make_plan(estimated_seconds=50).to_status()}
    running = _finished_job("Complete")
    running["status"] = {"startTime": "2026-01-01T00:00:00Z", "active": 1, "ready": 1}
    kube.pods = [{"status": {"containerStatuses": [
        {"name": "trainer", "state": {"running": {"startedAt": "2026-01-01T00:01:40Z"}}}]}}]

    async def go() -> None:
        ctx = reconcile.Context(kube=kube, settings=settings.Settings(),  # type: ignore[arg-type]
                                metrics=metrics.OperatorMetrics(CollectorRegistry()),
                                clock=lambda: NOW, guard=modelsource.UrlGuard())
        noop = lambda _b: lambda **_kw: None  # noqa: E731
        await reconcile.record_job(ctx, running, noop)
        assert kube.status["actual"] == {"startTime": "2026-01-01T00:01:40Z"}
        await reconcile.record_job(ctx, running, noop)  # noted: no second read or patch
        assert kube.calls == ["status:actual"]
        kube.pods = [_pod("2026-01-01T00:03:20Z")]  # start rewritten at termination
        await reconcile.record_job(ctx, _finished_job("Failed"), noop)
    asyncio.run(go())
    assert kube.status["actual"]["startTime"] == "2026-01-01T00:01:40Z"
    assert kube.status["actual"]["seconds"] == 100


def test_fused_attention_the_estimator_could_not_find_is_said_in_the_condition() -> None:
    """Asked fused, the model has no attention core to fuse: the Estimated message, a Warning
    event and status.plan.attention all say the estimate is the eager one."""
    warning = "fused attention was asked for, but no attention core was found"
    answer = {**PLAN, "attention": {"requested": "fused", "cores": 0, "fused_cores": 0,
                                    "unfused_scores": 0, "warning": warning}}
    kube = FakeKube(CM)
    events = _run(kube, SpecBuilder().set("training.attention", "fused").obj(),
                  estimator=_estimator(answer))
    (estimated,) = [c for c in kube.status["conditions"] if c["type"] == "Estimated"]
    assert estimated["message"].endswith(f"; attention not fused: {warning}")
    assert (True, "AttentionNotFused") in events
    assert kube.status["plan"]["attention"] == {"requested": "fused", "cores": 0,
                                                "fusedCores": 0, "warning": warning}


def test_attention_priced_as_asked_adds_nothing_to_the_condition() -> None:
    answer = {**PLAN, "attention": {"requested": "fused", "cores": 12, "fused_cores": 12,
                                    "unfused_scores": 0, "warning": None}}
    kube = FakeKube(CM)
    events = _run(kube, SpecBuilder().set("training.attention", "fused").obj(),
                  estimator=_estimator(answer))
    (estimated,) = [c for c in kube.status["conditions"] if c["type"] == "Estimated"]
    assert "attention" not in estimated["message"]
    assert events == [(False, "Planned"), (False, "JobCreated")]
    assert kube.status["plan"]["attention"] == {"requested": "fused", "cores": 12,
                                                "fusedCores": 12}
