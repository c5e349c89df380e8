"""How long the promotion gate's job-outcome measure adds to `gpuplan models promote` (and so
to `gpuplan train --db --candidate --promote`): a synthetic SQLite database with the shipped
bundle stored twice (active, candidate) and N finished jobs, each with a distinct stored
workload (light ResNet-50 at batches 1..N/4 on four GPU types, planned by the shipped bundle).
The gate runs with the outcomes linked, then on the same database with the links removed (the
measure skipped); the difference is what scoring adds.

    .venv/bin/python hack/bench_gate_outcomes.py --outcomes 200 --repeats 3
"""

from __future__ import annotations

import argparse
import pathlib
import statistics
import tempfile
import time

import onnx

from gpuplan_estimator import devices
from gpuplan_estimator.interfaces.cli import models as models_cli
from gpuplan_estimator.latency import bundles, selection
from gpuplan_estimator.perfdb import PerfStore
from gpuplan_estimator.planning import planner, requests, workloads
from gpuplan_estimator.step.decomposition import build_step

LIGHT = pathlib.Path(onnx.__file__).parent / "backend" / "test" / "data" / "light"
DEVICES = ("t4", "l4", "a100-sxm4-80gb", "h100-sxm-80gb")


def _workloads(n: int) -> list[workloads.Workload]:
    model = (LIGHT / "light_resnet50.onnx").read_bytes()
    predictor, _ = selection.select_predictor(str(bundles.SHIPPED_BUNDLE))
    catalog = devices.load_catalog()
    out = []
    for batch in range(1, n // len(DEVICES) + 1):
        t = requests.TrainingRequest(batch_size=batch, dataset_size=10000, epochs=1)
        graph = planner.graph_at(model, t, batch)
        items = workloads.distinct_items(build_step(graph, planner.training_settings(t, batch))
                                         .items)
        for key in DEVICES:
            spec = catalog.resolve(key)
            out.append(workloads.Workload(
                device=spec.key, gpu_count=1, batch_size=batch, global_batch=batch,
                precision=t.precision, mode=t.mode, optimizer=t.optimizer, steps=1000,
                planned_seconds=100.0, bundle_share=0.9,
                reference_step_ms=workloads.step_ms(items, predictor, spec), items=items))
    return out


def _gate_seconds(store: PerfStore, version: int, repeats: int) -> tuple[float, str]:
    times, last = [], None
    for _ in range(repeats):
        start = time.perf_counter()
        last = models_cli.gate(store, version)
        times.append(time.perf_counter() - start)
    assert last is not None
    return statistics.median(times), last.reason + " | skipped: " + "; ".join(last.skipped)


def main() -> None:
    """Build the database, time the gate with and without linked outcomes, print both."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--outcomes", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    built = _workloads(args.outcomes)
    with tempfile.TemporaryDirectory() as tmp, \
            PerfStore.open(f"sqlite:///{tmp}/perf.db") as store:
        store.add_bundle(bundles.SHIPPED_BUNDLE, state="active")
        version = store.add_bundle(bundles.SHIPPED_BUNDLE, state="candidate")
        sizes = []
        for i, w in enumerate(built):
            workload_id, data = workloads.encode(w)
            sizes.append(len(data))
            store.add_workload(workload_id, data, device=w.device, gpu_count=1)
            store.record_job_outcome(job_uid=f"job-{i}", device=w.device, gpu_count=1,
                                     estimated_seconds=100.0, actual_seconds=110.0,
                                     workload_id=workload_id)
        with_s, with_reason = _gate_seconds(store, version, args.repeats)
        with store.engine.begin() as conn:
            conn.exec_driver_sql("update job_outcomes set workload_id = NULL")
        without_s, without_reason = _gate_seconds(store, version, args.repeats)
    print(f"{len(built)} outcomes, workloads {min(sizes)}-{max(sizes)} bytes compressed, "
          f"{len(built[0].items)}-{len(built[-1].items)} distinct items each")
    print(f"gate with outcomes:    {with_s:.2f} s  ({with_reason})")
    print(f"gate without outcomes: {without_s:.2f} s  ({without_reason})")
    print(f"outcome scoring adds:  {with_s - without_s:.2f} s (median of {args.repeats})")


if __name__ == "__main__":
    main()
