"""Store behaviour every backend must show; run on SQLite (unit) and PostgreSQL (integration).

Each `contract_*` takes a freshly opened, empty `PerfStore`.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable
from typing import TypeVar

import pandas as pd
import pytest

from gpuplan_estimator.core import errors
from gpuplan_estimator.core.measurements import MEASUREMENT_COLUMNS
from gpuplan_estimator.devices.catalog import DeviceSpec
from gpuplan_estimator.perfdb.frames import EXTRA_COLUMNS
from gpuplan_estimator.perfdb.host_probes import ProbeRow
from gpuplan_estimator.perfdb.store import PerfStore

T = TypeVar("T")
RACE_JOIN_LIMIT_S = 120.0  # a hang guard, not a timing assertion


def race(stores: list[PerfStore], work: Callable[[PerfStore], T]) -> list[T | BaseException]:
    """`work` once per store, all released by one barrier (so every writer checks for
    existing keys before any inserts); each result or the exception raised."""
    barrier = threading.Barrier(len(stores))
    results: list[T | BaseException] = [RuntimeError("did not run")] * len(stores)

    def run(i: int) -> None:
        barrier.wait()
        try:
            results[i] = work(stores[i])
        except BaseException as exc:  # reported to the test, which asserts none
            results[i] = exc

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(stores))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(RACE_JOIN_LIMIT_S)
    assert not any(t.is_alive() for t in threads), "a writer hung"
    return results


def frame(n: int, *, device: str = "t4", kernel: str = "gemm", start: int = 1) -> pd.DataFrame:
    return pd.DataFrame(
        {
            "device": device,
            "backend": "onnxruntime-1.23.2-cpu",
            "kernel": kernel,
            "op": "matmul",
            "dtype": "float32",
            "dims": [f'{{"m":{i}}}' for i in range(start, start + n)],
            "latency_ms": [0.5 * i for i in range(start, start + n)],
            "latency_std_ms": [0.01] * n,
            "repeats": 5,
            "source": "test",
        }
    )


def contract_roundtrip_keeps_values(store: PerfStore) -> None:
    run = store.add_run(device="t4", backend="onnxruntime-1.23.2-cpu")
    assert store.add_measurements(run, frame(3)) == 3
    got = store.measurements()
    assert list(got.columns) == [*MEASUREMENT_COLUMNS, *EXTRA_COLUMNS]
    assert got["latency_ms"].tolist() == [0.5, 1.0, 1.5]
    assert got["dims"].tolist() == ['{"m":1}', '{"m":2}', '{"m":3}']
    assert set(got["run_id"]) == {run}
    assert math.isnan(got["latency_min_ms"].iloc[0])


def contract_add_is_idempotent(store: PerfStore) -> None:
    run = store.add_run(device="t4", backend="b")
    assert store.add_measurements(run, frame(4)) == 4
    assert store.add_measurements(run, frame(4)) == 0
    assert store.add_measurements(run, frame(6)) == 2  # only the 2 new keys
    assert len(store.measurements()) == 6


def contract_repeated_keys_in_a_source_are_kept(store: PerfStore) -> None:
    run = store.add_run(device="t4", backend="b")
    twice = pd.concat([frame(2), frame(2)], ignore_index=True)
    assert store.add_measurements(run, twice) == 4
    assert store.add_measurements(run, twice) == 0
    assert len(store.measurements()) == 4


def contract_filters(store: PerfStore) -> None:
    run = store.add_run(device="t4", backend="b")
    store.add_measurements(run, frame(2, device="t4", kernel="gemm"))
    store.add_measurements(run, frame(3, device="p4", kernel="softmax"))
    assert len(store.measurements(devices=["p4"])) == 3
    assert len(store.measurements(kernels=["gemm"])) == 2
    assert len(store.measurements(devices=["t4"], kernels=["softmax"])) == 0
    assert len(store.measurements(backend="other")) == 0


def contract_runs_and_finish(store: PerfStore) -> None:
    a = store.add_run(device="t4", backend="b", sweep_digest="d1", plan_json="[]",
                      settings={"seed": 1})
    store.add_run(device="p4", backend="b", sweep_digest="d2")
    store.finish_run(a, "done")
    (run,) = store.runs(sweep_digest="d1")
    assert (run.id, run.status, run.device) == (a, "done", "t4")
    assert run.ended_at is not None and run.settings_json == '{"seed": 1}'
    with pytest.raises(errors.InvalidRequestError, match="status"):
        store.finish_run(a, "great")
    with pytest.raises(errors.DatabaseError, match="no benchmark run"):
        store.finish_run(99999, "done")


def contract_devices_keep_first_seen(store: PerfStore) -> None:
    spec = DeviceSpec(
        key="t4", name="Tesla T4", vendor="nvidia", memory_bytes=16 << 30,
        mem_bandwidth_gbps=320.0, peak_tflops={"fp32": 8.1}, sm_count=40,
        boost_clock_mhz=1590.0, l2_cache_mb=4.0, nvml_names=("Tesla T4",),
    )
    store.upsert_device(spec)
    first = store.devices()
    store.upsert_device(spec, nvml_name="Tesla T4", nvml_uuid="GPU-1")
    second = store.devices()
    assert len(second) == 1
    assert second["first_seen"].iloc[0] == first["first_seen"].iloc[0]
    assert second["last_seen"].iloc[0] >= first["last_seen"].iloc[0]
    assert second["nvml_uuid"].iloc[0] == "GPU-1"
    assert '"fp32": 8.1' in second["spec_json"].iloc[0]


def contract_model_versions_and_job_outcomes(store: PerfStore) -> None:
    mv = store.record_model_version(data_digest="abc", metrics={"gemm": {"mape": 0.1}},
                                    bundle_path="/b/1")
    assert store.model_versions()["id"].tolist() == [mv]
    store.record_job_outcome(job_uid="u1", device="t4", gpu_count=2, estimated_seconds=100.0,
                             actual_seconds=125.0, model_digest="abc")
    store.record_job_outcome(job_uid="u2", device="p4", gpu_count=1, estimated_seconds=10.0,
                             actual_seconds=5.0)
    got = store.job_outcomes(device="t4")
    assert got["job_uid"].tolist() == ["u1"]
    assert got["drift_ratio"].tolist() == [1.25]
    assert len(store.job_outcomes()) == 2
    with pytest.raises(errors.InvalidRequestError, match="gpu_count"):
        store.record_job_outcome(job_uid="u3", device="t4", gpu_count=0,
                                 estimated_seconds=1.0, actual_seconds=1.0)


def contract_job_outcome_scaling_fields_round_trip(store: PerfStore) -> None:
    # 2**40 gradient bytes and 2**40 steps do not fit PostgreSQL's int4: the columns are BIGINT.
    scaling = {"gpus_per_node": 8, "nodes": 2, "per_gpu_batch": 32, "steps": 2**40,
               "forward_ms": 10.5, "backward_ms": 21.0, "optimizer_ms": 0.0,
               "gradient_bytes": 2**40, "intra_node_gbps": 300.0}
    store.record_job_outcome(job_uid="s1", device="h100", gpu_count=16,
                             estimated_seconds=100.0, actual_seconds=120.0, **scaling)
    store.record_job_outcome(job_uid="s0", device="h100", gpu_count=1,
                             estimated_seconds=10.0, actual_seconds=12.0)
    frame = store.job_outcomes()
    new, old = frame.iloc[0], frame.iloc[1]
    assert {k: new[k] for k in scaling} == scaling
    assert all(pd.isna(old[k]) for k in scaling)
    with pytest.raises(errors.InvalidRequestError, match="gradient_bytes"):
        store.record_job_outcome(job_uid="s2", device="h100", gpu_count=2,
                                 estimated_seconds=1.0, actual_seconds=1.0, gradient_bytes=-1)
    with pytest.raises(errors.InvalidRequestError, match="intra_node_gbps"):
        store.record_job_outcome(job_uid="s2", device="h100", gpu_count=2,
                                 estimated_seconds=1.0, actual_seconds=1.0,
                                 intra_node_gbps=math.inf)
    assert len(store.job_outcomes()) == 2


def contract_bad_frames_are_rejected(store: PerfStore) -> None:
    run = store.add_run(device="t4", backend="b")
    with pytest.raises(errors.GpuplanError, match="dims"):
        store.add_measurements(run, frame(2).drop(columns="dims"))
    bad = frame(2)
    bad.loc[0, "latency_ms"] = -1.0
    with pytest.raises(errors.GpuplanError, match="latency_ms"):
        store.add_measurements(run, bad)
    assert store.add_measurements(run, frame(0)) == 0


def contract_bulk_insert_is_idempotent(store: PerfStore) -> None:
    run = store.add_run(device="t4", backend="b")
    assert store.add_measurements(run, frame(20_000)) == 20_000
    assert store.add_measurements(run, frame(20_000)) == 0
    assert len(store.measurements()) == 20_000


def probe_row(device: str, cpu_model: str, eager_op_us: float, *, date: str = "2026-11-27",
              version: int = 1) -> ProbeRow:
    """A probe of a node type: `eager_op_us` varies, the other figures are fixed."""
    figures = {"eager_op_us": eager_op_us, "module_call_us": 9.0, "linear_us": 6.0,
               "autocast_linear_us": 15.0, "backward_node_us": 8.0,
               "optimizer_foreach_us_per_tensor": 3.0, "optimizer_for_loop_us_per_tensor": 16.0,
               "optimizer_fused_us_per_tensor": 1.0, "launch_latency_us": 12.0}
    return ProbeRow(device=device, cpu_model=cpu_model, probe_version=version,
                    figures_us=figures, provenance={"date": date, "commit": "abc123",
                                                    "torch": "2.11.0", "command": "probe"})


def contract_host_probes_round_trip_and_latest(store: PerfStore) -> None:
    run = store.add_run(device="h200", backend="torch-2.11.0-cuda")
    assert store.add_host_probe(probe_row("h200", "Xeon 8480", 5.0), run_id=run)
    assert not store.add_host_probe(probe_row("h200", "Xeon 8480", 5.0))  # same digest
    assert store.add_host_probe(probe_row("h200", "EPYC 9654", 7.0, date="2026-11-28"))
    assert store.add_host_probe(probe_row("h200", "Xeon 8480", 6.0, date="2026-11-29"))
    assert store.add_host_probe(probe_row("a10", "EPYC 7R32", 9.0))
    assert store.add_host_probe(probe_row("a10", "EPYC 7R32", 99.0, date="2026-12-01",
                                          version=2))
    stored = store.host_probes(device="h200")
    assert [p.figures_us["eager_op_us"] for p in stored] == [5.0, 7.0, 6.0]
    first = stored[0]
    assert (first.run_id, first.node_type, first.cpu_model) == (run, "h200 | Xeon 8480",
                                                                 "Xeon 8480")
    assert first.provenance["torch"] == "2.11.0" and first.created_at.tzinfo is not None
    by_device = store.latest_host_probes(per="device", probe_version=1)
    assert {d: p.figures_us["eager_op_us"] for d, p in by_device.items()} == {
        "h200": 6.0, "a10": 9.0}
    by_node = store.latest_host_probes(per="node_type", probe_version=1)
    assert {n: p.figures_us["eager_op_us"] for n, p in by_node.items()} == {
        "h200 | Xeon 8480": 6.0, "h200 | EPYC 9654": 7.0, "a10 | EPYC 7R32": 9.0}
    assert store.latest_host_probes(per="device", probe_version=2)["a10"].run_id is None
    assert by_device["h200"].host_probe().eager_op_us == 6.0


def contract_bad_host_probes_are_rejected(store: PerfStore) -> None:
    good = probe_row("h200", "Xeon", 5.0)
    bad = {
        "device": ProbeRow("", "Xeon", 1, good.figures_us, {}),
        "cpu_model": ProbeRow("h200", "x" * 300, 1, good.figures_us, {}),
        "probe_version": ProbeRow("h200", "Xeon", 0, good.figures_us, {}),
        "figures_us.eager_op_us": ProbeRow("h200", "Xeon", 1,
                                           {**good.figures_us, "eager_op_us": math.nan}, {}),
        "provenance": ProbeRow("h200", "Xeon", 1, good.figures_us, {"log": "x" * 20_000}),
    }
    for name, row in bad.items():
        with pytest.raises(errors.InvalidRequestError, match=name.replace(".", r"\.")):
            store.add_host_probe(row)
    with pytest.raises(errors.InvalidRequestError, match="per"):
        store.latest_host_probes(per="cpu", probe_version=1)
    assert store.host_probes() == []


CONTRACT = {
    name.removeprefix("contract_"): fn
    for name, fn in sorted(globals().items())
    if name.startswith("contract_")
}
