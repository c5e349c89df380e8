"""`GET /v1/coverage`: performance-database rows and bundle devices per catalog key."""

from __future__ import annotations

import asyncio
import datetime as dt
import functools
import pathlib
from typing import Any

import pandas as pd
from aiohttp.test_utils import TestClient, TestServer

from gpuplan_estimator import devices
from gpuplan_estimator.core import errors
from gpuplan_estimator.cost import roofline
from gpuplan_estimator.interfaces.cli import serving
from gpuplan_estimator.interfaces.http import coverage, service, storage, work
from gpuplan_estimator.perfdb import PerfStore
from gpuplan_estimator.planning import planner

NEWEST = dt.datetime(2026, 3, 1, 12, tzinfo=dt.UTC)


def _context() -> planner.PlannerContext:
    return planner.PlannerContext(
        catalog=devices.load_catalog(), predictor=roofline.RooflinePredictor(),
        predictor_source="roofline", manifest={"devices": ["t4", "cpu"]})


async def _get(source: storage.CoverageSource | None) -> tuple[int, dict[str, Any]]:
    app = service.make_app(service.ServiceState(functools.partial(work.given_context, _context())),
                           service.ServiceSettings(bundle_poll_s=3600), coverage_source=source)
    async with TestClient(TestServer(app)) as client:
        resp = await client.get("/v1/coverage")
        return resp.status, await resp.json()


def test_coverage_json_lists_catalog_bundle_and_database_devices() -> None:
    doc = coverage.coverage_json({"l4": (7, NEWEST), "custom-gpu": (2, None)}, ["t4"],
                                ["t4", "l4", "h100-sxm-80gb"], bundle_rows={"t4": 40},
                                bundle_version=5)
    assert doc["bundle_version"] == 5
    got = doc["devices"]
    assert list(got) == ["custom-gpu", "h100-sxm-80gb", "l4", "t4"]
    assert got["l4"] == {"measurements": 7, "newest_run_unix": NEWEST.timestamp(),
                         "in_bundle": False, "bundle_rows": 0}
    assert got["t4"] == {"measurements": 0, "newest_run_unix": None, "in_bundle": True,
                         "bundle_rows": 40}
    assert got["custom-gpu"]["measurements"] == 2
    assert got["h100-sxm-80gb"]["measurements"] == 0


def test_endpoint_reads_a_real_sqlite_database(tmp_path: pathlib.Path) -> None:
    url = f"sqlite:///{tmp_path / 'perf.db'}"
    with PerfStore.open(url, clock=lambda: NEWEST) as store:
        run = store.add_run(device="l4", backend="b")
        store.add_measurements(run, pd.DataFrame({
            "device": "l4", "backend": "b", "kernel": "gemm", "op": "matmul",
            "dtype": "float32", "dims": ['{"m":1}', '{"m":2}'], "latency_ms": [1.0, 2.0],
            "latency_std_ms": [0.0, 0.0], "repeats": 3, "source": "t"}))
        store.finish_run(run, "done")
    status, body = asyncio.run(_get(serving.perfdb_coverage_source(url)))
    assert status == 200, body
    assert body["devices"]["l4"] == {"measurements": 2, "newest_run_unix": NEWEST.timestamp(),
                                     "in_bundle": False, "bundle_rows": 0}
    assert body["bundle_version"] is None  # a file (here: no) bundle, not the database's
    assert body["devices"]["t4"]["in_bundle"] is True
    assert body["devices"]["h100-sxm-80gb"]["measurements"] == 0


def test_without_a_database_or_when_it_fails_the_answer_is_503() -> None:
    def broken() -> dict[str, tuple[int, dt.datetime | None]]:
        raise errors.DatabaseError("database at sqlite:///x unreachable")

    status, body = asyncio.run(_get(None))
    assert status == 503 and body["error"]["reason"] == "NotReady"
    status, body = asyncio.run(_get(broken))
    assert status == 503 and body["error"]["reason"] == "DatabaseUnavailable"
    assert "unreachable" in body["error"]["message"]


def test_bundle_heldout_rows_sum_the_manifests_random_split_rows_per_device() -> None:
    manifest = {"metrics": {
        "gemm": {"random_split_by_device": {"t4": {"rows": 30.0, "mape_pct": 9.0},
                                            "l4": {"rows": 12.0}}},
        "conv2d": {"random_split_by_device": {"t4": {"rows": 10.0}}},
        "pool": {"random_split": {"rows": 99.0}},  # no per-device split: counts nothing
        "bad": "not an object"}}
    assert coverage.bundle_heldout_rows(manifest) == {"t4": 40, "l4": 12}
    assert coverage.bundle_heldout_rows({}) == {}


def test_shipped_bundle_counts_rows_for_every_gpu_it_was_trained_on() -> None:
    from gpuplan_estimator.latency import bundles

    manifest = bundles.read_manifest(bundles.SHIPPED_BUNDLE)
    rows = coverage.bundle_training_rows(manifest)  # the shipped one predates device_rows
    gpus = [d for d in manifest["devices"] if d != "cpu"]
    assert gpus and all(rows.get(d, 0) > 0 for d in gpus), rows


def test_bundle_rows_are_the_manifests_device_rows_when_it_has_them() -> None:
    held_out_only = {"metrics": {"gemm": {"random_split_by_device": {"t4": {"rows": 30.0}}}}}
    trained = {**held_out_only, "device_rows": {"t4": 1500, "l4": 80}}
    assert coverage.bundle_training_rows(trained) == {"t4": 1500, "l4": 80}
    assert coverage.bundle_training_rows(held_out_only) == {"t4": 30}  # an older bundle
    doc = coverage.coverage_json({}, ["t4", "l4"], [],
                                bundle_rows=coverage.bundle_training_rows(trained))
    assert doc["devices"]["l4"]["bundle_rows"] == 80
