"""Two writers of the same rows at the same moment, on one SQLite file: each trial releases two
threads, each with its own `PerfStore` (own engine and connections), from a barrier, so both
check for existing keys before either inserts. The database must keep one copy and neither
writer may fail."""

from __future__ import annotations

from collections.abc import Iterator
from functools import partial
from pathlib import Path

import pandas as pd
import pytest

from gpuplan_estimator.devices.catalog import DeviceSpec
from gpuplan_estimator.perfdb.store import PerfStore, StoredOutcome
from gpuplan_testing import perfdb_contract as contract

TRIALS = 30
ROWS = 20


@pytest.fixture
def writers(tmp_path: Path) -> Iterator[list[PerfStore]]:
    url = f"sqlite:///{tmp_path / 'perf.db'}"
    stores = [PerfStore.open(url), PerfStore.open(url)]
    yield stores
    for s in stores:
        s.close()


def test_two_writers_of_the_same_frame_store_it_once(writers: list[PerfStore]) -> None:
    errors: list[BaseException] = []
    for _ in range(TRIALS):
        run = writers[0].add_run(device="t4", backend="b")
        rows = contract.frame(ROWS)
        added = contract.race(writers, partial(PerfStore.add_measurements, run_id=run, frame=rows))
        errors += [r for r in added if isinstance(r, BaseException)]
        counts = [r for r in added if isinstance(r, int)]
        # Every row stored by exactly one of the two writers, and counted by that one.
        assert sum(counts) == ROWS and len(writers[0].measurements(run_id=run)) == ROWS
    assert errors == []
    assert len(writers[1].measurements()) == TRIALS * ROWS


def test_two_writers_of_the_same_job_outcome_store_it_once(writers: list[PerfStore]) -> None:
    for trial in range(TRIALS):
        uid = f"job-{trial}"
        got = contract.race(writers, partial(
            PerfStore.record_job_outcome, job_uid=uid, device="t4", gpu_count=1,
            estimated_seconds=10.0, actual_seconds=12.0))
        assert all(isinstance(g, StoredOutcome) for g in got), got
        stored = [g for g in got if isinstance(g, StoredOutcome)]
        assert sorted(g.created for g in stored) == [False, True]
        assert stored[0].id == stored[1].id
    frame = writers[0].job_outcomes()
    assert len(frame) == TRIALS and frame["job_uid"].is_unique


def test_two_benchmarks_registering_one_device_do_not_collide(
    writers: list[PerfStore],
) -> None:
    for trial in range(TRIALS):
        spec = DeviceSpec(key=f"gpu{trial}", name="G", vendor="nvidia", memory_bytes=1 << 30,
                          mem_bandwidth_gbps=1.0, peak_tflops={"fp32": 1.0}, sm_count=1,
                          boost_clock_mhz=1.0, l2_cache_mb=1.0)
        got = contract.race(writers, partial(PerfStore.upsert_device, spec=spec))
        assert got == [None, None]
    devices: pd.DataFrame = writers[0].devices()
    assert len(devices) == TRIALS and devices["key"].is_unique
