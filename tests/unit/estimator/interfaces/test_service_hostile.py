"""Issue #21: the estimator under hostile bodies, slow models, greedy clients, retries and
poisoned or failing outcome stores — over a real socket with real worker processes."""

from __future__ import annotations

import asyncio
import base64
import functools
import itertools
import math
import os
import pathlib
import time
from collections.abc import Awaitable, Callable
from typing import Any

import onnx
import pytest
from aiohttp.test_utils import TestClient, TestServer
from prometheus_client import CollectorRegistry

from gpuplan_estimator.core import errors
from gpuplan_estimator.interfaces.cli import serving
from gpuplan_estimator.interfaces.http import routes, service, wire, work
from gpuplan_estimator.planning import calibrating
from gpuplan_testing import contexts

LIGHT = pathlib.Path(onnx.__file__).parent / "backend" / "test" / "data" / "light"
RESNET50_B64 = base64.b64encode((LIGHT / "light_resnet50.onnx").read_bytes()).decode()
L4 = {"gpu_type": "NVIDIA-L4", "gpus_per_node": 4, "nodes": 1, "free_gpus": 4}


def plan_body(**training: Any) -> dict[str, Any]:
    return {"model_onnx_b64": RESNET50_B64,
            "training": {"batch_size": 1, "dataset_size": 1000, "optimizer": "sgd", **training},
            "objective": {"prefer": "cheapest", "max_gpus": 4}, "inventory": [L4]}


def estimate_body(device: str, batch_size: int = 1) -> dict[str, Any]:
    return {"model_onnx_b64": RESNET50_B64, "training": {"batch_size": batch_size},
            "devices": [device]}


def serve(check: Callable[[TestClient, CollectorRegistry], Awaitable[None]],
          loader: work.ContextLoader = contexts.roofline_context, **kwargs: Any) -> None:
    settings = service.ServiceSettings(bundle_poll_s=kwargs.pop("bundle_poll_s", 3600),
                                       **kwargs.pop("settings", {}))
    registry = CollectorRegistry()

    async def main() -> None:
        app = service.make_app(service.ServiceState(loader), settings, registry, **kwargs)
        async with TestClient(TestServer(app)) as client:
            await check(client, registry)

    asyncio.run(main())


def answers(registry: CollectorRegistry, source: str) -> float:
    return registry.get_sample_value("gpuplan_estimator_answers_total", {"source": source}) or 0


@pytest.mark.parametrize(("body", "words"), [
    (b'{"model_onnx_b64": "\xff\xfe"}', "not UTF-8"),
    (b'{"training": {"batch_size": ' + b"9" * 5000 + b"}}", "invalid JSON"),
    (b"[" * 100_000 + b"]" * 100_000, "nested too deeply"),
    (b"", "invalid JSON"),
])
def test_malformed_bodies_are_400_envelopes_never_500(body: bytes, words: str) -> None:
    async def check(client: TestClient, _: CollectorRegistry) -> None:
        for path in ("/v1/plans", "/v1/estimate"):
            resp = await client.post(path, data=body)
            assert resp.status == 400, await resp.text()
            err = (await resp.json())["error"]
            assert err["reason"] == "InvalidJSON" and words in err["message"]
        if len(body) < routes.MAX_OUTCOME_BODY_BYTES:
            resp = await client.post("/v1/outcomes", data=body)
            assert resp.status in (400, 503)  # 503: this service has no database
        assert (await client.get("/healthz")).status == 200

    serve(check)


def test_counts_beyond_their_caps_are_refused_by_name() -> None:
    async def check(client: TestClient, _: CollectorRegistry) -> None:
        cases = {
            "training.batch_size": plan_body(batch_size=2**63),
            "training.epochs": plan_body(epochs=10**29),
            "training.dataset_size": plan_body(dataset_size=10**18),
            "training.dims": plan_body(batch_size=2**20, dims={"a": 2**20, "b": 2**10}),
        }
        cases["training.dims.sequence"] = plan_body(dims={"sequence": 2**62})
        for field, body in cases.items():
            resp = await client.post("/v1/plans", json=body)
            assert resp.status == 422, (field, await resp.text())
            err = (await resp.json())["error"]
            assert err["reason"] == "InvalidRequest"
            assert any(d["field"] == field or d["field"].startswith(field + ".")
                       for d in err["details"]), (field, err)
            assert len(err["message"]) < 1000

    serve(check)


def test_unknown_paths_and_methods_answer_the_json_envelope() -> None:
    async def check(client: TestClient, _: CollectorRegistry) -> None:
        resp = await client.get("/v2/nothing")
        assert resp.status == 404
        assert (await resp.json())["error"]["reason"] == "NotFound"
        resp = await client.get("/v1/plans")
        assert resp.status == 405
        assert (await resp.json())["error"]["reason"] == "MethodNotAllowed"

    serve(check)


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    # A killed child stays a zombie until its parent reaps it: that is gone too.
    stat = pathlib.Path(f"/proc/{pid}/stat")
    return not stat.exists() or stat.read_text().split(") ")[1].startswith("Z")


def test_a_timed_out_estimate_is_stopped_and_its_worker_replaced(tmp_path: pathlib.Path) -> None:
    """Issue #21: `wait_for` answered 504 while the estimate kept running in its thread."""
    loader = functools.partial(contexts.slow_context, "l4", 600.0, str(tmp_path))

    async def check(client: TestClient, registry: CollectorRegistry) -> None:
        resp = await client.post("/v1/estimate", json=estimate_body("l4"))
        assert resp.status == 504
        assert (await resp.json())["error"]["reason"] == "Timeout"
        pids = [int(p.name) for p in tmp_path.iterdir()]
        assert len(pids) == 1 and pids[0] != os.getpid()
        for _ in range(100):
            if _gone(pids[0]):
                break
            await asyncio.sleep(0.1)
        assert _gone(pids[0]), "the worker that ran past its deadline is still running"
        assert registry.get_sample_value("gpuplan_estimator_worker_timeouts_total") == 1
        # The pool replaced the worker; other requests are answered.
        resp = await client.post("/v1/estimate", json=estimate_body("t4"))
        assert resp.status == 200, await resp.text()
        # A retry of the model that timed out is answered from the cache, not run again.
        resp = await client.post("/v1/estimate", json=estimate_body("l4"))
        assert resp.status == 504
        assert answers(registry, "cache") == 1
        assert len(list(tmp_path.iterdir())) == 1

    serve(check, loader, settings={"request_timeout_s": 4.0})


def test_a_model_that_needs_more_memory_than_a_worker_may_map_is_a_422() -> None:
    loader = functools.partial(contexts.hungry_context, "l4", 8 * 2**30)

    async def check(client: TestClient, _: CollectorRegistry) -> None:
        resp = await client.post("/v1/estimate", json=estimate_body("l4"))
        assert resp.status == 422, await resp.text()
        err = (await resp.json())["error"]
        assert err["reason"] == "InvalidModel" and "more memory" in err["message"]
        resp = await client.post("/v1/estimate", json=estimate_body("t4"))
        assert resp.status == 200, await resp.text()

    serve(check, loader, settings={"worker_memory_bytes": 2 * 2**30})


def test_one_client_cannot_take_the_worker_another_needs(tmp_path: pathlib.Path) -> None:
    """Issue #21: two large models of one client held both workers and five small requests of
    others all timed out. A busy client leaves one worker spare, so another's request runs."""
    loader = functools.partial(contexts.slow_context, "l4", 3.0, str(tmp_path))
    greedy = {service.admission.CLIENT_HEADER: "team-a"}

    async def check(client: TestClient, _: CollectorRegistry) -> None:
        hog = [asyncio.create_task(client.post("/v1/estimate", json=estimate_body("l4", b),
                                               headers=greedy)) for b in (1, 2)]
        for _ in range(100):  # until team-a's first estimate is running in a worker
            if any(tmp_path.iterdir()):
                break
            await asyncio.sleep(0.1)
        await asyncio.sleep(0.3)
        assert len(list(tmp_path.iterdir())) == 1  # one of team-a's runs, one worker spare
        # team-a has one running and one waiting: a third is refused, not queued.
        refused = await client.post("/v1/estimate", json=estimate_body("l4", 3), headers=greedy)
        assert refused.status == 429
        assert (await refused.json())["error"]["reason"] == "TooManyRequests"
        other = await client.post("/v1/estimate", json=estimate_body("t4"),
                                  headers={service.admission.CLIENT_HEADER: "team-b"})
        assert other.status == 200, await other.text()
        assert not any(t.done() for t in hog)  # team-b was served during team-a's first
        assert sorted([(await t).status for t in hog]) == [200, 200]

    serve(check, loader, settings={"workers": 2, "queued_per_client": 1})


def test_identical_requests_are_computed_once() -> None:
    async def check(client: TestClient, registry: CollectorRegistry) -> None:
        first, second = await asyncio.gather(client.post("/v1/plans", json=plan_body()),
                                             client.post("/v1/plans", json=plan_body()))
        assert first.status == second.status == 200
        third = await client.post("/v1/plans", json=plan_body())
        bodies = [await r.json() for r in (first, second, third)]
        assert bodies[0] == bodies[1] == bodies[2]
        assert answers(registry, "computed") == 1
        assert answers(registry, "shared") + answers(registry, "cache") == 2
        changed = await client.post("/v1/plans", json=plan_body(epochs=2))
        assert changed.status == 200
        assert answers(registry, "computed") == 2

    serve(check)


OUTCOME = {"job_uid": "job-1", "gpu_type": "NVIDIA-L4", "gpu_count": 1,
           "estimated_seconds": 100.0, "actual_seconds": 180.0}


def test_an_outcome_is_counted_once_per_job_and_survives_a_restart(
        tmp_path: pathlib.Path) -> None:
    url = f"sqlite:///{tmp_path / 'perf.db'}"
    stores = {"outcome_sink": serving.perfdb_outcome_sink(url),
              "outcome_history": serving.perfdb_outcome_history(url)}
    factors: list[dict[str, float]] = []

    async def report(client: TestClient, _: CollectorRegistry) -> None:
        for uid in ("job-1", "job-2"):
            resp = await client.post("/v1/outcomes", json={**OUTCOME, "job_uid": uid})
            assert resp.status == 201, await resp.text()
        for _ in range(5):  # a retried report must not push the factor toward the clip
            resp = await client.post("/v1/outcomes", json=OUTCOME)
            assert resp.status == 200
            assert (await resp.json())["duplicate"] is True
        models = await (await client.get("/v1/models")).json()
        assert models["calibration"]["outcomes"] == 2
        factors.append(models["calibration"]["factors"])

    async def restarted(client: TestClient, _: CollectorRegistry) -> None:
        models = await (await client.get("/v1/models")).json()
        factors.append(models["calibration"]["factors"])

    serve(report, **stores)
    serve(restarted, **stores)
    assert factors[0] == factors[1] and factors[0]["l4/train"] > 1.0


def test_a_database_outage_is_503_and_a_failed_refit_keeps_the_last_good_calibration() -> None:
    history_fails = [False]

    def history() -> list[calibrating.Outcome]:
        if history_fails[0]:
            raise errors.DatabaseError("database unreachable")
        return [calibrating.Outcome("l4", "train", 1000.0, 2000.0)] * 3

    def sink(req: wire.OutcomeRequest, device: str) -> tuple[int, bool]:
        if req.job_uid == "down":
            raise errors.DatabaseError("connection refused")
        return 7, True

    async def check(client: TestClient, registry: CollectorRegistry) -> None:
        before = (await (await client.get("/v1/models")).json())["calibration"]
        resp = await client.post("/v1/outcomes", json={**OUTCOME, "job_uid": "down"})
        assert resp.status == 503
        assert (await resp.json())["error"]["reason"] == "DatabaseUnavailable"
        history_fails[0] = True
        resp = await client.post("/v1/outcomes", json=OUTCOME)
        assert resp.status == 201
        after = (await (await client.get("/v1/models")).json())["calibration"]
        assert after["factors"] == before["factors"] and after["stale"] is True
        assert registry.get_sample_value("gpuplan_estimator_calibration_stale") == 1
        assert registry.get_sample_value(
            "gpuplan_estimator_calibration_refit_failures_total") == 1
        history_fails[0] = False  # the database is back: the next poll refits
        for _ in range(50):
            if registry.get_sample_value("gpuplan_estimator_calibration_stale") == 0:
                break
            await asyncio.sleep(0.1)
        assert (await (await client.get("/v1/models")).json())["calibration"]["stale"] is False

    serve(check, bundle_poll_s=0.2, outcome_sink=sink, outcome_history=history)


def test_the_documented_limits_are_the_enforced_ones() -> None:
    """docs/estimator-service.md copies core.limits' caps: the copy must follow the source."""
    from gpuplan_estimator.core import limits
    from gpuplan_estimator.graph import loading

    doc = (pathlib.Path(__file__).parents[4] / "docs" / "estimator-service.md").read_text()

    def power(value: int, base: int = 2) -> str:
        exponent = round(math.log(value, base))
        assert base**exponent == value
        return f"{base}^{exponent}"

    expected = [
        f"`--batch` | {limits.MAX_BATCH_SIZE} ({power(limits.MAX_BATCH_SIZE)}) |",
        f"`--dataset-size` | {power(limits.MAX_DATASET_SIZE, 10)} |",
        f"`--epochs` | {limits.MAX_EPOCHS} |",
        f"`--dim NAME=V` | {limits.MAX_DIM} ({power(limits.MAX_DIM)}) |",
        f"batch × every dim | {power(limits.MAX_SAMPLE_ELEMENTS)} elements |",
        f"dims per request | {limits.MAX_DIMS} |",
        f"inventory pools per plan | {wire.MAX_INVENTORY_POOLS} |",
        f"| {limits.MAX_GPUS_PER_NODE} / {limits.MAX_NODES_PER_POOL} |",
        f"graph nodes | {loading.MAX_NODES} (",
        f"field errors reported | {wire.MAX_REPORTED_ERRORS}, then",
    ]
    missing = [line for line in expected if line not in doc]
    assert not missing, missing


def test_the_poll_prunes_plan_workloads_once_an_interval_and_outlives_a_failed_prune() -> None:
    calls: list[float] = []

    def pruner() -> int:
        calls.append(time.monotonic())
        if len(calls) == 1:
            raise RuntimeError("database is locked")
        return 3

    async def check(_: TestClient, __: CollectorRegistry) -> None:
        for _ in range(60):
            if len(calls) >= 2:
                break
            await asyncio.sleep(0.1)

    serve(check, bundle_poll_s=0.05, settings={"workload_prune_interval_s": 0.5},
          workload_pruner=pruner)
    assert len(calls) >= 2  # the failure did not stop the poll
    # Not every 0.05 s poll: once an interval (less a thread start on a loaded machine).
    assert all(b - a >= 0.3 for a, b in itertools.pairwise(calls))


def test_the_served_pruner_deletes_only_old_unnamed_workloads(tmp_path: pathlib.Path) -> None:
    from datetime import UTC, datetime, timedelta

    from gpuplan_estimator.interfaces.cli import serving
    from gpuplan_estimator.perfdb import PerfStore

    url = f"sqlite:///{tmp_path / 'perf.db'}"
    stored = datetime(2026, 1, 1, tzinfo=UTC)
    with PerfStore.open(url, clock=lambda: stored) as store:
        for n in (1, 2):
            store.add_workload(f"{n:064x}", b"w", device="t4", gpu_count=1)
        store.record_job_outcome(job_uid="j", device="t4", gpu_count=1, estimated_seconds=1.0,
                                 actual_seconds=1.0, workload_id=f"{1:064x}")
    day = timedelta(days=1)
    early = serving.perfdb_workload_pruner(url, 30 * day.total_seconds(),
                                           clock=lambda: stored + 29 * day)
    late = serving.perfdb_workload_pruner(url, 30 * day.total_seconds(),
                                          clock=lambda: stored + 31 * day)
    assert (early(), late(), late()) == (0, 1, 0)
