"""The service serves the performance database's active bundle (issue #17): a real server
(aiohttp on a socket, a real estimation worker process) over a real SQLite database hot-swaps a
newly activated bundle within one poll and names its version in estimates, plans, /v1/models
and /v1/coverage; `POST /v1/models/{version}/activate` activates, reloads and answers 404 for
an unknown version."""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from aiohttp.test_utils import TestClient, TestServer

from gpuplan_estimator.interfaces.cli import serving
from gpuplan_estimator.interfaces.http import responses, service
from gpuplan_estimator.perfdb import PerfStore
from gpuplan_testing.bundle_builders import tiny_bundle
from gpuplan_testing.contexts import roofline_context

from .test_service import RESNET50_B64, plan_body

POLL_S = 0.3
ESTIMATE = {"model_onnx_b64": RESNET50_B64, "training": {"batch_size": 1}, "devices": ["t4"]}


def _serve(tmp_path: Path, check: Callable[[TestClient, PerfStore], Awaitable[None]],
           *, activator: bool = True) -> None:
    url = f"sqlite:///{tmp_path / 'perf.db'}"
    cache = tmp_path / "cache"
    store = PerfStore.open(url)

    async def main() -> None:
        state = service.ServiceState(
            functools.partial(service.database_bundle_context, str(cache), roofline_context),
            bundle_sync=serving.perfdb_bundle_sync(url, cache))
        app = service.make_app(
            state, service.ServiceSettings(bundle_poll_s=POLL_S, workers=1),
            coverage_source=serving.perfdb_coverage_source(url),
            bundle_activator=serving.perfdb_bundle_activator(url) if activator else None)
        async with TestClient(TestServer(app)) as client:
            await check(client, store)

    try:
        asyncio.run(main())
    finally:
        store.close()


async def _json(client: TestClient, method: str, path: str, **kwargs: Any) -> dict[str, Any]:
    resp = await client.request(method, path, **kwargs)
    assert resp.status == 200, await resp.text()
    body: dict[str, Any] = await resp.json()
    return body


def test_a_newly_activated_bundle_is_served_within_one_poll(tmp_path: Path) -> None:
    with PerfStore.open(f"sqlite:///{tmp_path / 'perf.db'}") as store:
        v1 = store.add_bundle(tiny_bundle(tmp_path / "b1", seed=1, devices=("t4",)),
                              state="active")
        v2 = store.add_bundle(tiny_bundle(tmp_path / "b2", seed=2, devices=("t4", "l4")))

    async def check(client: TestClient, store: PerfStore) -> None:
        first = await _json(client, "post", "/v1/estimate", json=ESTIMATE)
        responses.EstimateResponse.model_validate(first)
        assert first["bundle_version"] == v1
        assert first["predictor_source"].endswith(f"(database v{v1})")
        coverage = await _json(client, "get", "/v1/coverage")
        responses.CoverageResponse.model_validate(coverage)
        assert coverage["bundle_version"] == v1
        assert coverage["devices"]["t4"]["in_bundle"] is True
        assert coverage["devices"]["t4"]["bundle_rows"] == 60
        assert coverage["devices"]["l4"]["in_bundle"] is False

        store.activate(v2, "promoted")  # another process (gpuplan models activate)
        activated = time.monotonic()
        while True:
            models = await _json(client, "get", "/v1/models")
            if models["bundle_version"] == v2:
                break
            assert time.monotonic() - activated < POLL_S + 5.0, "not reloaded within a poll"
            await asyncio.sleep(0.05)
        # Within one poll plus the load of a tiny bundle (well under a second here).
        assert time.monotonic() - activated < POLL_S + 2.0
        second = await _json(client, "post", "/v1/estimate", json=ESTIMATE)
        assert second["bundle_version"] == v2
        assert second["predictor_source"].endswith(f"v{v2} (database v{v2})")
        plan = await _json(client, "post", "/v1/plans", json=plan_body())
        responses.PlanResponse.model_validate(plan)
        assert plan["bundle_version"] == v2
        coverage = await _json(client, "get", "/v1/coverage")
        assert coverage["bundle_version"] == v2
        assert coverage["devices"]["l4"] == {**coverage["devices"]["l4"], "in_bundle": True,
                                             "bundle_rows": 60}

    _serve(tmp_path, check)


def test_activate_endpoint_switches_reloads_and_names_unknown_versions(tmp_path: Path) -> None:
    with PerfStore.open(f"sqlite:///{tmp_path / 'perf.db'}") as store:
        v1 = store.add_bundle(tiny_bundle(tmp_path / "b1", seed=1), state="active")
        v2 = store.add_bundle(tiny_bundle(tmp_path / "b2", seed=2), state="active")

    async def check(client: TestClient, store: PerfStore) -> None:
        assert (await _json(client, "get", "/v1/models"))["bundle_version"] == v2
        body = await _json(client, "post", f"/v1/models/{v1}/activate",
                           json={"reason": "rollback: v2 is worse on t4"})
        responses.ActivateResponse.model_validate(body)
        assert body == {"active_version": v1, "serving_version": v1}  # reloaded at once
        assert (await _json(client, "get", "/v1/models"))["bundle_version"] == v1
        assert {b.version: (b.state, b.reason) for b in store.bundles()} == {
            v1: ("active", "rollback: v2 is worse on t4"),
            v2: ("retired", f"replaced by version {v1}")}
        # No body is fine too.
        assert (await _json(client, "post", f"/v1/models/{v2}/activate"))["active_version"] == v2

        resp = await client.post("/v1/models/99/activate")
        assert resp.status == 404
        error = (await resp.json())["error"]
        assert error["reason"] == "NotFound" and "version 99" in error["message"]
        resp = await client.post(f"/v1/models/{2**40}/activate")
        assert resp.status == 404
        resp = await client.post("/v1/models/latest/activate")
        assert resp.status == 404 and (await resp.json())["error"]["reason"] == "NotFound"
        resp = await client.post(f"/v1/models/{v1}/activate", data=b"{not json")
        assert resp.status == 400 and (await resp.json())["error"]["reason"] == "InvalidJSON"
        resp = await client.post(f"/v1/models/{v1}/activate", json={"reason": 5})
        assert resp.status == 422
        assert (await resp.json())["error"]["details"][0]["field"] == "reason"
        assert store.active_version() == v2  # none of the refused ones changed anything

    _serve(tmp_path, check)


def test_without_a_database_bundle_the_file_bundle_serves_and_activate_needs_a_database(
        tmp_path: Path) -> None:
    async def check(client: TestClient, _: PerfStore) -> None:
        doc = await _json(client, "post", "/v1/estimate", json=ESTIMATE)
        assert doc["bundle_version"] is None and doc["predictor_source"] == "roofline"
        assert (await _json(client, "get", "/v1/coverage"))["bundle_version"] is None
        resp = await client.post("/v1/models/1/activate")
        assert resp.status == 503 and (await resp.json())["error"]["reason"] == "NotReady"

    _serve(tmp_path, check, activator=False)


def test_a_database_that_fails_keeps_the_bundle_in_use() -> None:
    calls: list[str] = []

    def sync() -> int | None:
        calls.append("sync")
        raise RuntimeError("database down")

    def loader() -> Any:
        calls.append("load")
        return roofline_context("bundle:/cache/v4 (database v4)")

    state = service.ServiceState(loader, bundle_sync=sync)
    assert state.load() is True  # at start-up: what the cache points at, database or not
    assert state.bundle_version == 4
    assert state.load() is False and calls == ["sync", "load", "sync"]


def test_an_unchanged_active_version_is_not_reloaded() -> None:
    loads: list[str] = []

    def loader() -> Any:
        loads.append("load")
        return roofline_context("bundle:/cache/v3 (database v3)")

    state = service.ServiceState(loader, bundle_sync=lambda: 3)
    assert state.load() is True and state.load() is False and state.load() is False
    assert loads == ["load"]  # the bundle is not re-read every poll
