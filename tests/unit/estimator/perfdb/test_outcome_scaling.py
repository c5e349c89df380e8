"""Job outcomes with the scaling fields of revision 0005: an old database upgrades with its rows
kept (NULL there), new rows round-trip, bad values name their field, and stored records become
scaling samples (`parallel.scaling.samples_from_outcomes`) only where every field is present."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import text

from gpuplan_estimator.core import errors
from gpuplan_estimator.parallel import scaling
from gpuplan_estimator.perfdb.store import PerfStore
from gpuplan_testing.old_databases import database_at

BASE: dict[str, Any] = {"device": "a100-80gb", "estimated_seconds": 100.0,
                        "actual_seconds": 120.0}
SCALING: dict[str, Any] = {"gpus_per_node": 4, "nodes": 1, "per_gpu_batch": 16, "steps": 1000,
                           "forward_ms": 30.0, "backward_ms": 60.0, "optimizer_ms": 5.0,
                           "gradient_bytes": 10**9, "intra_node_gbps": 300.0}


def test_migration_0005_keeps_old_outcomes_and_adds_the_scaling_columns(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'old.db'}"
    database_at(url, "0004", [
        "insert into job_outcomes (job_uid, device, gpu_count, estimated_seconds, "
            "actual_seconds, model_digest, created_at) values ('old', 'a100-80gb', 4, 10.0, "
            "12.0, 'd', '2025-01-01')",
    ])
    with PerfStore.open(url) as store:
        store.record_job_outcome(job_uid="new", gpu_count=4, **BASE, **SCALING)
        frame = store.job_outcomes()
        with store.engine.connect() as conn:
            version = conn.execute(text("select version_num from alembic_version")).scalar()
    assert version == "0009"  # the head: later revisions keep these rows too
    assert frame["job_uid"].tolist() == ["old", "new"]
    old_row, new_row = frame.to_dict("records")
    assert (old_row["actual_seconds"], old_row["model_digest"]) == (12.0, "d")
    assert all(old_row[k] is None or math.isnan(old_row[k]) for k in SCALING)
    assert {k: new_row[k] for k in SCALING} == SCALING
    # The old row lacks the fields: only the new one is a sample, its step measured per step.
    samples = scaling.samples_from_outcomes(frame.to_dict("records"))
    assert [(s.gpu_count, s.measured_step_ms, s.compute_ms) for s in samples] == [
        (4, 120.0, 90.0)]


@pytest.mark.parametrize(
    ("field", "value"),
    [("gpus_per_node", 0), ("nodes", 1.5), ("per_gpu_batch", True), ("steps", 0),
     ("steps", 2**63), ("gradient_bytes", -1), ("forward_ms", -0.1), ("backward_ms", math.nan),
     ("optimizer_ms", "1"), ("intra_node_gbps", 0.0), ("intra_node_gbps", math.inf)],
)
def test_bad_scaling_values_are_refused_naming_the_field(
    store: PerfStore, field: str, value: object
) -> None:
    with pytest.raises(errors.InvalidRequestError) as info:
        store.record_job_outcome(job_uid="u", gpu_count=4, **BASE, **{**SCALING, field: value})
    assert info.value.field == field
    assert store.job_outcomes().empty


def test_outcomes_without_the_fields_are_still_stored(store: PerfStore) -> None:
    store.record_job_outcome(job_uid="u", gpu_count=4, **BASE)
    assert store.job_outcomes()["job_uid"].tolist() == ["u"]
