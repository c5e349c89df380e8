"""Reconcile ordering and idempotency against an in-memory fake of the `kube` module's facade."""

from __future__ import annotations

import asyncio
import base64
import datetime
from typing import Any

import pytest
from aiohttp import web
from prometheus_client import CollectorRegistry

from gpuplan_operator import errors, metrics, modelsource, reconcile, settings
from gpuplan_testing.operator_builders import LocalServer, SpecBuilder, make_plan

NOW = datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC)
PLAN = {"plan": {"gpu_type": "NVIDIA-L4", "device": "l4", "gpu_count": 2, "gpus_per_node": 2,
                 "nodes": 1, "estimated_seconds": 100.0, "step_time_ms": 10.0,
                 "memory_bytes_per_gpu": 1, "cost_usd": 1.0, "predictor": "p"}}


class FakeKube:
    """Same async methods as `kube.Kube`, backed by dicts; `calls` records the order."""

    def __init__(self, config_maps: dict[str, Any] | None = None) -> None:
        self.calls: list[str] = []
        self.config_maps = config_maps or {}
        self.jobs: dict[str, dict[str, Any]] = {}
        self.status: dict[str, Any] = {}
        self.annotations: dict[str, str] = {}

    async def get_config_map(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self.config_maps.get(name)

    async def list_gpu_nodes(self) -> list[dict[str, Any]]:
        return []

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
         estimator: web.Application | None = None) -> list[tuple[bool, str]]:
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
            tj = reconcile.TrainingJobRef("ns", "tj", "uid-1", 1, dict(status or {}), emit)
            await reconcile.reconcile(ctx, tj, spec)
    asyncio.run(go())
    return events


def _estimator() -> web.Application:
    async def plans(_: web.Request) -> web.Response:
        return web.json_response(PLAN)
    app = web.Application()
    app.router.add_post("/v1/plans", plans)
    return app


def test_plan_is_stored_before_the_job_is_created() -> None:
    kube = FakeKube(CM)
    events = _run(kube, SpecBuilder().obj(), estimator=_estimator())
    assert kube.calls == ["status:conditions,observedGeneration,plan", "annotations",
                          "create_job", "status:conditions,jobName,observedGeneration"]
    assert kube.annotations["gpuplan.io/gpu-count"] == "2"
    assert [c["type"] for c in kube.status["conditions"]] == ["Estimated", "Launched"]
    assert events == [(False, "Planned"), (False, "JobCreated")]


def test_stored_plan_of_this_generation_is_reused_without_the_estimator() -> None:
    kube = FakeKube(CM)
    status = {"plan": make_plan(generation=1).to_status(),
              "conditions": [{"type": "Estimated", "status": "True"}]}
    _run(kube, SpecBuilder().obj(), status=status)  # no estimator route: a call would fail
    assert kube.calls == ["create_job", "status:conditions,jobName,observedGeneration"]


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
    labels = {"gpu_type": "NVIDIA-A100-SXM4-80GB"}
    assert registry.get_sample_value("gpuplan_drift_ratio_count", labels) == 1
