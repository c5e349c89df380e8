"""The retraining loop end to end on the testbed with PostgreSQL (issue #17, part 4).

A node of a GPU type the cluster and the active bundle lack (NVIDIA-L40S) is added; the real
operator creates its benchmark Job; the Job's container command runs here as a process, with
the CPU standing in for the GPU (`gpuplan_testing.gpu_standin`: rows are timed on the CPU and
stored under the GPU's catalog key, as NVML would name it) and writes rows to PostgreSQL; the
Job's pod ends with that exit code; the operator starts the training Job, whose command
(`gpuplan train --db --candidate --promote`) runs here too; the candidate passes the promotion
gate and becomes active; the estimator (`gpuplan serve` on the same database) answers the next
L40S estimate with the new bundle version; the coverage alert's inputs no longer fire it.

Second pass, after an operator restart with a retraining schedule: a broken benchmark run
(scrambled latencies) is in the database, the scheduled training Job's candidate is refused by
the gate, stays a candidate with the gate's reason, the active bundle keeps serving, and the
refused counter behind GpuplanCandidateBundleRefused moves.

What stands in for the cluster: the Jobs' pods never reach a kubelet (the node is tainted and
selected only by this test's Jobs; the training pod asks for more CPU than any node has), so the
test writes each pod's terminal status with the local process's exit code and the real Job
controller does the rest. The test-only mapping: `--device cuda` → `--device cpu`, the image's
`/sweeps` → the softmax spec alone, plus `--samples 16 --repeats 2` (rows in seconds).

`GPUPLAN_LOOP_TIMELINE=PATH` writes the stages' timestamps as JSON (`make loop-e2e`).
"""

from __future__ import annotations

import base64
import json
import os
import pathlib
import shutil
import sys
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pandas as pd
import pytest
import requests

from gpuplan_estimator.interfaces.cli import main as cli_main
from gpuplan_estimator.perfdb import PerfStore
from gpuplan_testing import loop_harness as lh
from gpuplan_testing import operator_harness as h
from gpuplan_testing import postgres_server
from gpuplan_testing.estimator_server import serve_process

pytestmark = [pytest.mark.slow, pytest.mark.postgres]

NEW_PRODUCT = "NVIDIA-L40S"  # in the catalog; not in testbed/nodes.yaml nor the seed bundle
NEW_DEVICE = "l40s"
SECRET = "gpuplan-perfdb"
GPU_OPS = h.ROOT.parent / "shared" / "data" / "gpu-ops"
SWEEP = h.ROOT / "benchmark-jobs" / "sweeps" / "softmax.yaml"
# Seed: real GPU measurements of one kernel (softmax), 100 rows of each of three GPUs: enough to
# fit the kernel (fitting.min_rows_per_kernel 200) with each GPU left out in turn, and each GPU
# at fitting.probe_max_rows, so the new type's few rows are probe rows (a correction of the
# transfer model). Below that the CPU timings filed as L40S would join the fitted rows, and the
# gate rightly refuses the candidate (random-split MAPE 2.75 % -> 182 % when tried).
SEED_DEVICES = ("Tesla T4", "Tesla V100-PCIE-32GB", "NVIDIA A100-PCIE-40GB")
SEED_ROWS_PER_DEVICE = 100
# The broken run of the second pass: another GPU's rows with latencies x [1/10, 10].
BROKEN_DEVICE, BROKEN_ROWS = "Tesla P100-PCIE-16GB", 150
MAX_ROWS = 1000  # every row is used: the gate compares like with like
STANDIN_ARGS = ["--samples", "16", "--repeats", "2", "--no-progress"]
HOT_RELOAD_S = 1  # gpuplan serve --bundle-poll


@pytest.fixture
def loop_db(tmp_path: pathlib.Path) -> Iterator[str]:
    """A fresh PostgreSQL database (migrated on first open), seeded with real softmax rows of
    four GPUs and an active bundle trained from them."""
    if not (GPU_OPS / "softmax.parquet").exists():
        pytest.skip(f"{GPU_OPS} missing (the shared measurement data)")
    with postgres_server.running_server() as server:
        url = postgres_server.create_database(server, "loop")
        raw = pd.read_parquet(GPU_OPS / "softmax.parquet")
        seed = raw[raw["device"].isin(SEED_DEVICES)].groupby("device").head(SEED_ROWS_PER_DEVICE)
        seed.to_parquet(tmp_path / "seed.parquet")
        assert cli_main.main(["import", "--db", url, str(tmp_path / "seed.parquet")]) == 0
        assert cli_main.main(["train", "--db", url, "--candidate", "--promote", "--max-rows",
                              str(MAX_ROWS), "--no-progress"]) == 0
        yield url


@pytest.fixture
def serve(loop_db: str, tmp_path: pathlib.Path) -> Iterator[str]:
    """`gpuplan serve` on the loop's database, polling its active bundle every second."""
    port = h.free_port()
    argv = [str(pathlib.Path(sys.executable).with_name("gpuplan")), "serve", "--port", str(port),
            "--db", loop_db, "--bundle-poll", str(HOT_RELOAD_S), "--workers", "1",
            "--bundle-cache", str(tmp_path / "bundle-cache")]
    with serve_process(argv, port, tmp_path / "estimator.log", ready_timeout_s=120) as url:
        yield url


@pytest.fixture
def new_gpu_node(core_v1: Any, namespace: str) -> Iterator[Callable[[], None]]:
    """Adds one kwok node of NEW_PRODUCT when called; removed afterwards. Tainted, so no pod of
    another session lands on it; labelled, so only this test's benchmark Jobs select it."""
    pool = {"namePrefix": f"l40s-{namespace[-6:]}", "count": 1, "cpu": "64", "memory": "512Gi",
            "gpu": {"product": NEW_PRODUCT, "count": 4, "memoryMiB": 46068}}
    with h.tainted_gpu_node(core_v1, namespace, pool,
                            labels={"gpuplan.io/loop-test": namespace}) as add:
        yield add


def _operator_env(namespace: str, port: int, interval: str) -> dict[str, str]:
    return {
        "METRICS_PORT": str(port), "BENCHMARKS_ENABLED": "true",
        "BENCHMARK_IMAGE": "gpuplan-bench:test", "BENCHMARK_DB_SECRET": SECRET,
        "BENCHMARK_NAMESPACE": namespace, "BENCHMARK_INTERVAL_SECONDS": "1",
        "BENCHMARK_BUDGET_MINUTES": "3",
        # Only the new node carries this label: the Jobs of the testbed's own GPU types (the
        # seed bundle lacks them too) stay Pending instead of taking testbed GPUs.
        "BENCHMARK_NODE_SELECTOR_JSON": json.dumps({"gpuplan.io/loop-test": namespace}),
        "RETRAINING_ENABLED": "true", "RETRAINING_IMAGE": "gpuplan:test",
        "RETRAINING_MAX_ROWS": str(MAX_ROWS), "RETRAINING_INTERVAL": interval,
        # No node has this much CPU: the training pod waits for the test (see the docstring).
        "RETRAINING_RESOURCES_JSON": json.dumps({"requests": {"cpu": "4096"}}),
    }


def _jobs(batch_v1: Any, namespace: str, component: str) -> list[Any]:
    return list(batch_v1.list_namespaced_job(
        namespace, label_selector=f"app.kubernetes.io/component={component}",
        _request_timeout=30).items)


def _bench_job(batch_v1: Any, namespace: str) -> Any | None:
    return next((j for j in _jobs(batch_v1, namespace, "benchmark")
                 if j.metadata.labels.get("gpuplan.io/gpu-product") == NEW_PRODUCT), None)


def _condition(job: Any) -> str | None:
    for c in (job.status.conditions or []) if job.status else []:
        if c.type in {"Complete", "Failed"} and c.status == "True":
            return str(c.type)
    return None


def _run_job_locally(core_v1: Any, batch_v1: Any, namespace: str, job: Any, argv: list[str],
                     env: dict[str, str], tmp_path: pathlib.Path, wait_for: Any) -> int:
    """Run the Job's command here, then end its pod with the exit code; returns it."""
    name = job.metadata.name
    code = lh.run_local(argv, env, tmp_path / f"{name}.log", timeout_s=300)
    pod = wait_for(lambda: lh.job_pod(core_v1, namespace, name), 30, f"pod of {name}")
    lh.finish_pod(core_v1, pod, code)
    wait_for(lambda: _condition(batch_v1.read_namespaced_job(name, namespace,
                                                             _request_timeout=30)),
             60, f"{name} finished")
    return code


def _estimate(url: str) -> dict[str, Any]:
    body = {"model_onnx_b64": base64.b64encode(h.RESNET50.read_bytes()).decode(),
            "training": {"batch_size": 8, "dataset_size": 800, "epochs": 1},
            "devices": [NEW_PRODUCT]}
    resp = requests.post(f"{url}/v1/estimate", json=body, timeout=120)
    assert resp.status_code == 200, resp.text
    out: dict[str, Any] = resp.json()
    return out


def _bundle_rows(url: str) -> int:
    devices = requests.get(f"{url}/v1/coverage", timeout=30).json()["devices"]
    return int(devices.get(NEW_DEVICE, {}).get("bundle_rows", 0))


def _without_data_fires(text: str) -> bool | None:
    labels = f'{{gpu_type="{NEW_PRODUCT}"}}'
    series = {f"gpuplan_gpu_type_measurements{labels}":
              [lh.sample(text, "gpuplan_gpu_type_measurements", gpu_type=NEW_PRODUCT) or 0] * 121,
              f"gpuplan_gpu_type_in_bundle{labels}":
              [lh.sample(text, "gpuplan_gpu_type_in_bundle", gpu_type=NEW_PRODUCT) or 0] * 121}
    return lh.alert_fires("GpuplanGpuTypeWithoutData", series, interval="1m", eval_time="2h")


def _broken_run(loop_db: str, tmp_path: pathlib.Path) -> None:
    """A benchmark run gone wrong: real rows of another GPU with latencies x [1/10, 10]."""
    raw = pd.read_parquet(GPU_OPS / "softmax.parquet")
    rows = raw[raw["device"] == BROKEN_DEVICE].head(BROKEN_ROWS).copy()
    rng = np.random.default_rng(17)
    rows["latency_ms"] = rows["latency_ms"] * np.exp(rng.uniform(-np.log(10), np.log(10),
                                                                 len(rows)))
    rows.to_parquet(tmp_path / "broken.parquet")
    assert cli_main.main(["import", "--db", loop_db, str(tmp_path / "broken.parquet")]) == 0


def test_new_gpu_type_is_benchmarked_retrained_promoted_and_served(
        monkeypatch: pytest.MonkeyPatch, namespace: str, core_v1: Any, batch_v1: Any,
        loop_db: str, serve: str, new_gpu_node: Callable[[], None], wait_for: Any,
        tmp_path: pathlib.Path) -> None:
    path = os.environ.get("GPUPLAN_LOOP_TIMELINE")
    # The operator refuses GPUPLAN_* variables it does not know; this one is the test's.
    monkeypatch.delenv("GPUPLAN_LOOP_TIMELINE", raising=False)
    timeline = lh.LoopTimeline()
    try:
        _loop(monkeypatch, namespace, core_v1, batch_v1, loop_db, serve, new_gpu_node,
              wait_for, tmp_path, timeline)
        timeline.result = "passed"
    except BaseException as exc:
        timeline.result = f"failed: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}"
        raise
    finally:
        print(json.dumps(timeline.as_dict(), indent=2))
        if path:
            timeline.write(pathlib.Path(path))


def _loop(monkeypatch: pytest.MonkeyPatch, namespace: str, core_v1: Any, batch_v1: Any,
          loop_db: str, serve: str, new_gpu_node: Callable[[], None], wait_for: Any,
          tmp_path: pathlib.Path, timeline: lh.LoopTimeline) -> None:
    core_v1.create_namespaced_secret(namespace, {"metadata": {"name": SECRET},
                                                 "stringData": {"url": loop_db}},
                                     _request_timeout=30)
    sweeps = tmp_path / "sweeps"
    sweeps.mkdir()
    shutil.copy(SWEEP, sweeps / SWEEP.name)
    seed_version = _estimate(serve)["bundle_version"]
    assert seed_version == 1 and _bundle_rows(serve) == 0
    port = h.free_port()
    with h.run_operator(monkeypatch, namespace, serve, **_operator_env(namespace, port, "0")):
        new_gpu_node()
        timeline.mark("node added")
        job = wait_for(lambda: _bench_job(batch_v1, namespace), 60, "benchmark Job for L40S")
        timeline.mark("benchmark Job created")
        before = wait_for(lambda: lh.scrape(port) if lh.sample(
            lh.scrape(port), "gpuplan_gpu_type_in_bundle", gpu_type=NEW_PRODUCT) is not None
            else "", 30, "coverage gauges for L40S")
        assert lh.sample(before, "gpuplan_gpu_type_measurements", gpu_type=NEW_PRODUCT) == 0
        assert lh.sample(before, "gpuplan_gpu_type_in_bundle", gpu_type=NEW_PRODUCT) == 0
        assert _without_data_fires(before) in {True, None}

        # The benchmark Job's command, GPU mapped to this CPU (the test's only substitution).
        container = job.spec.template.spec.containers[0]
        env = lh.local_env(core_v1, namespace, container, tmp_path / "bench")
        args = lh.expand(container.args, env)
        assert args[:3] == ["bench", "--device", "cuda"] and "--db" not in args
        args = lh.replace_flag(lh.replace_flag(args, "--device", "cpu"), "--sweep", str(sweeps))
        argv = [sys.executable, "-m", "gpuplan_testing.gpu_standin", "--as", NEW_PRODUCT, "--",
                *args, *STANDIN_ARGS]
        code = _run_job_locally(core_v1, batch_v1, namespace, job, argv, env, tmp_path,
                                wait_for)
        assert code == 0, (tmp_path / f"{job.metadata.name}.log").read_text()[-3000:]
        with PerfStore.open(loop_db) as store:
            rows = len(store.measurements(devices=[NEW_DEVICE]))
        assert rows == 16
        timeline.mark("rows written")

        train = wait_for(lambda: next(iter(_jobs(batch_v1, namespace, "retraining")), None),
                         60, "training Job")
        timeline.mark("training Job created")
        code = _train_locally(core_v1, batch_v1, namespace, train, tmp_path, wait_for)
        assert code == 0, (tmp_path / f"{train.metadata.name}.log").read_text()[-3000:]
        with PerfStore.open(loop_db) as store:
            states = {b.version: (b.state, b.reason) for b in store.bundles()}
        assert states[2][0] == "active" and states[1][0] == "retired", states
        assert "no worse" in states[2][1]
        timeline.mark("bundle promoted")

        answer = wait_for(lambda: (lambda a: a if a["bundle_version"] == 2 else None)(
            _estimate(serve)), 10 * HOT_RELOAD_S + 30, "estimate from bundle 2")
        assert answer["devices"][0]["device"] == NEW_DEVICE
        assert _bundle_rows(serve) == rows  # probe rows: the new bundle learned L40S from them
        timeline.mark("estimate shows new version")

        # The operator's next pass (1 s apart) reads the coverage and counts the Job.
        after = wait_for(lambda: (lambda t: t if lh.sample(
            t, "gpuplan_gpu_type_in_bundle", gpu_type=NEW_PRODUCT) == 1 and lh.sample(
            t, "gpuplan_retraining_jobs_total", outcome="promoted") == 1 else "")(
            lh.scrape(port)), 30, "L40S covered by the served bundle, training counted")
        assert lh.sample(after, "gpuplan_gpu_type_measurements", gpu_type=NEW_PRODUCT) == rows
        assert _without_data_fires(after) in {False, None}
        assert lh.sample(after, "gpuplan_retraining_jobs_total", outcome="promoted") == 1
        assert lh.sample(after, "gpuplan_benchmark_jobs_total", gpu_type=NEW_PRODUCT,
                         outcome="succeeded") == 1
        timeline.mark("coverage resolved")
        refused_before = lh.sample(after, "gpuplan_retraining_jobs_total", outcome="refused")

    # Second pass: a restarted operator (its triggers rebuilt from the Jobs) with a schedule.
    _broken_run(loop_db, tmp_path)
    timeline.mark("broken rows written")
    done = {j.metadata.name for j in _jobs(batch_v1, namespace, "retraining")}
    with h.run_operator(monkeypatch, namespace, serve, **_operator_env(namespace, port, "1h")):
        train = wait_for(lambda: next((j for j in _jobs(batch_v1, namespace, "retraining")
                                       if j.metadata.name not in done), None),
                         60, "scheduled training Job")
        assert train.metadata.name.startswith("gpuplan-retrain-schedule-")
        timeline.mark("scheduled training Job created")
        code = _train_locally(core_v1, batch_v1, namespace, train, tmp_path, wait_for)
        assert code == 3, (tmp_path / f"{train.metadata.name}.log").read_text()[-3000:]
        job = batch_v1.read_namespaced_job(train.metadata.name, namespace, _request_timeout=30)
        assert _condition(job) == "Failed"
        with PerfStore.open(loop_db) as store:
            states = {b.version: (b.state, b.reason) for b in store.bundles()}
        assert states[3][0] == "candidate" and states[2][0] == "active", states
        assert "promotion gate: worse than the active bundle on random-split MAPE" in states[3][1]
        timeline.mark("worse candidate refused")
        refused = wait_for(lambda: (lambda t: t if lh.sample(
            t, "gpuplan_retraining_jobs_total", outcome="refused") == 1 else "")(
            lh.scrape(port)), 30, "refused training Job counted")
        assert refused_before == 0 and refused
        # The counter as scraped before and after the refusal, an hour apart.
        series = {'gpuplan_retraining_jobs_total{outcome="refused"}': [refused_before] * 2 + [
            lh.sample(refused, "gpuplan_retraining_jobs_total", outcome="refused") or 0] * 2}
        assert lh.alert_fires("GpuplanCandidateBundleRefused", series, interval="1h",
                              eval_time="2h") in {True, None}
        # Nothing else started: one training Job at a time, one per trigger.
        assert len(_jobs(batch_v1, namespace, "retraining")) == 2
    assert _estimate(serve)["bundle_version"] == 2


def _train_locally(core_v1: Any, batch_v1: Any, namespace: str, train: Any,
                   tmp_path: pathlib.Path, wait_for: Any) -> int:
    container = train.spec.template.spec.containers[0]
    env = lh.local_env(core_v1, namespace, container, tmp_path / train.metadata.name)
    args = lh.expand(container.args, env)
    assert args[:2] == ["train", "--db"] and "--promote" in args
    argv = [str(pathlib.Path(sys.executable).with_name("gpuplan")), *args, "--no-progress"]
    return _run_job_locally(core_v1, batch_v1, namespace, train, argv, env, tmp_path, wait_for)
