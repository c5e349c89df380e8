"""Plan → outcome round trip through the real HTTP service (issue #17): a plan stores its
workload in the performance database and names it (`workload_id`); the operator keeps it in
status.plan and posts it back with the job's outcome; the outcome row links the workload, which
the served bundle re-estimates to the outcome's own (uncalibrated) seconds. Without a
database nothing is stored and the plan says null."""

from __future__ import annotations

import asyncio
import functools
from pathlib import Path
from typing import Any

from aiohttp.test_utils import TestClient, TestServer

from gpuplan_estimator import devices
from gpuplan_estimator.interfaces.cli import serving
from gpuplan_estimator.interfaces.http import responses, service
from gpuplan_estimator.perfdb import PerfStore
from gpuplan_estimator.planning import workloads
from gpuplan_operator import estimator_client
from gpuplan_operator.core import resources
from gpuplan_testing import workload_builders as wb
from gpuplan_testing.contexts import roofline_context

from .test_service import plan_body


async def _plan(client: TestClient) -> dict[str, Any]:
    resp = await client.post("/v1/plans", json=plan_body())
    assert resp.status == 200, await resp.text()
    body: dict[str, Any] = await resp.json()
    responses.PlanResponse.model_validate(body)
    return body


def test_a_plan_stores_its_workload_and_the_outcome_links_it(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'perf.db'}"
    cache = tmp_path / "cache"
    bundle = wb.gpu_bundle(tmp_path / "b1", seed=1)
    with PerfStore.open(url) as store:
        version = store.add_bundle(bundle, state="active")
    seen: dict[str, Any] = {}

    async def main() -> None:
        state = service.ServiceState(
            functools.partial(service.database_bundle_context, str(cache), roofline_context),
            bundle_sync=serving.perfdb_bundle_sync(url, cache))
        app = service.make_app(
            state, service.ServiceSettings(bundle_poll_s=3600, workers=1),
            outcome_sink=serving.perfdb_outcome_sink(url),
            workload_sink=serving.perfdb_workload_sink(url))
        async with TestClient(TestServer(app)) as client:
            body = await _plan(client)
            assert body["bundle_version"] == version
            assert len(body["workload_id"]) == 64
            again = await _plan(client)  # answered from the cache: the same workload
            assert again["workload_id"] == body["workload_id"]
            # The operator's side: status.plan keeps the id, the outcome carries it back.
            plan = estimator_client.parse_plan(body, generation=1)
            restored = resources.StatusPlan.from_status(plan.to_status())
            outcome = estimator_client.build_outcome(job_uid="job-1", plan=restored,
                                                     actual_seconds=80.0)
            resp = await client.post("/v1/outcomes", json=outcome)
            assert resp.status == 201, await resp.text()
            seen.update(body=body)

    asyncio.run(main())
    body = seen["body"]
    with PerfStore.open(url) as store:
        (row,) = store.outcome_workloads(limit=200)
        assert store.outcome_counts() == (1, 1)
        with store.engine.connect() as conn:
            stored = conn.exec_driver_sql("select count(*) from plan_workloads").scalar()
    assert stored == 1
    assert (row.job_uid, row.workload_id, row.actual_seconds) == (
        "job-1", body["workload_id"], 80.0)
    w = workloads.decode(row.workload_zstd)
    assert w.bundle_version == version
    assert (w.device, w.gpu_count) == (body["plan"]["device"], body["plan"]["gpu_count"])
    # The served bundle re-estimates the job to what the outcome stored as its own estimate.
    (again,) = workloads.repredict_seconds([w], wb.predictor(bundle), devices.load_catalog())
    assert again == row.estimated_seconds
    assert row.estimated_seconds == (body["plan"]["estimated_seconds"]
                                     / body["plan"]["calibration"]["factor"])


def test_without_a_database_nothing_is_stored_and_the_plan_says_null() -> None:
    async def main() -> None:
        app = service.make_app(service.ServiceState(roofline_context),
                               service.ServiceSettings(bundle_poll_s=3600, workers=1))
        async with TestClient(TestServer(app)) as client:
            body = await _plan(client)
            assert body["workload_id"] is None
            assert "_workload" not in body
            plan = estimator_client.parse_plan(body, generation=1)
            assert "workload_id" not in estimator_client.build_outcome(
                job_uid="j", plan=plan, actual_seconds=1.0)

    asyncio.run(main())


def test_a_failing_workload_store_still_answers_the_plan(tmp_path: Path) -> None:
    def broken(*_: Any) -> None:
        raise OSError("disk full")

    async def main() -> None:
        app = service.make_app(service.ServiceState(roofline_context),
                               service.ServiceSettings(bundle_poll_s=3600, workers=1),
                               workload_sink=broken)
        async with TestClient(TestServer(app)) as client:
            assert (await _plan(client))["workload_id"] is None

    asyncio.run(main())
