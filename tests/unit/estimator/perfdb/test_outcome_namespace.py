"""Job outcomes carry the TrainingJob's namespace (revision 0009, issue #33), from the HTTP body
through the store to the calibration samples, so each namespace's weight can be bounded."""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlalchemy import text

from gpuplan_estimator.core import errors
from gpuplan_estimator.interfaces.cli import serving
from gpuplan_estimator.interfaces.http import wire
from gpuplan_estimator.perfdb.store import PerfStore
from gpuplan_testing.old_databases import database_at

BODY = {"job_uid": "u1", "gpu_type": "t4", "gpu_count": 1, "estimated_seconds": 10.0,
        "actual_seconds": 12.0}


def test_the_namespace_goes_from_the_body_to_the_calibration_samples(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'perf.db'}"
    sink = serving.perfdb_outcome_sink(url)
    sink(wire.parse_outcome_request({**BODY, "namespace": "team-a"}), "t4")
    sink(wire.parse_outcome_request({**BODY, "job_uid": "u2"}), "t4")  # an older operator
    samples = serving.perfdb_outcome_history(url)()
    assert [s.namespace for s in samples] == ["team-a", ""]


@pytest.mark.parametrize("bad", ["Team-A", "a" * 64, "-a", "a_b"])
def test_a_namespace_that_is_no_kubernetes_name_is_refused_naming_the_field(bad: str) -> None:
    with pytest.raises(wire.InvalidFieldsError) as caught:
        wire.parse_outcome_request({**BODY, "namespace": bad})
    assert "namespace" in str(caught.value)


def test_the_store_refuses_a_bad_namespace(tmp_path: Path) -> None:
    with PerfStore.open(f"sqlite:///{tmp_path / 'perf.db'}") as store, pytest.raises(
            errors.InvalidRequestError, match="namespace"):
        store.record_job_outcome(job_uid="u", device="t4", gpu_count=1, estimated_seconds=1.0,
                                 actual_seconds=1.0, namespace="No Such")


def test_migration_0009_gives_older_outcomes_no_namespace(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'old.db'}"
    database_at(url, "0008", [
        "insert into job_outcomes (job_uid, device, gpu_count, estimated_seconds, "
        "actual_seconds, model_digest, created_at) values ('old', 't4', 1, 10.0, 12.0, 'd', "
        "'2025-01-01')"])
    with PerfStore.open(url) as store:
        with store.engine.connect() as conn:
            assert conn.execute(text("select version_num from alembic_version")).scalar() == "0009"
        store.record_job_outcome(job_uid="new", device="t4", gpu_count=1, estimated_seconds=1.0,
                                 actual_seconds=2.0, namespace="team-b")
        assert store.job_outcomes()["namespace"].tolist() == ["", "team-b"]
