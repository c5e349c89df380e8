"""The service's outcome history reads the job_outcomes table once, then only the rows added
since (issue #33: a refit per outcome re-read the whole table); a row committed out of id
order, which an "after the last id" read misses, makes it read the whole table again."""

from __future__ import annotations

from pathlib import Path

from sqlalchemy import text

from gpuplan_estimator.interfaces.cli import serving
from gpuplan_estimator.interfaces.http import wire
from gpuplan_estimator.perfdb.store import PerfStore


def _outcome(uid: str, actual_s: float) -> wire.OutcomeRequest:
    return wire.parse_outcome_request({
        "job_uid": uid, "gpu_type": "t4", "gpu_count": 1, "estimated_seconds": 10.0,
        "actual_seconds": actual_s, "namespace": "team-a"})


def test_new_outcomes_are_read_alone_and_every_one_counts(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'perf.db'}"
    sink = serving.perfdb_outcome_sink(url)
    rows = serving.perfdb_outcome_rows(url)
    history = serving.perfdb_outcome_history(url, rows)
    scaling = serving.perfdb_scaling_history(url, rows)
    sink(_outcome("u1", 11.0), "t4")
    assert [s.measured_ms for s in history()] == [11_000.0]
    for i in range(2, 6):
        sink(_outcome(f"u{i}", 10.0 + i), "t4")
        assert len(history()) == i
    assert [r["job_uid"] for r in scaling()] == ["u1", "u2", "u3", "u4", "u5"]
    assert rows.full_reads == 1, "after the first read, only the added rows"
    assert history() == serving.perfdb_outcome_history(url)(), "as a whole read says"


def test_a_row_committed_out_of_id_order_is_not_missed(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'perf.db'}"
    sink = serving.perfdb_outcome_sink(url)
    rows = serving.perfdb_outcome_rows(url)
    sink(_outcome("u1", 11.0), "t4")
    with PerfStore.open(url) as store, store.engine.begin() as conn:
        # Another replica's row with id 10 is committed first, then one with id 5.
        copy = ("INSERT INTO job_outcomes (id, job_uid, device, gpu_count, estimated_seconds,"
                " actual_seconds, model_digest, created_at, namespace) SELECT {id}, '{uid}', "
                "device, gpu_count, estimated_seconds, actual_seconds, model_digest, "
                "created_at, namespace FROM job_outcomes WHERE job_uid = 'u1'")
        conn.execute(text(copy.format(id=10, uid="late-10")))
    assert list(rows.frame()["job_uid"]) == ["u1", "late-10"]
    with PerfStore.open(url) as store, store.engine.begin() as conn:
        conn.execute(text(copy.format(id=5, uid="late-5")))
    assert list(rows.frame()["job_uid"]) == ["u1", "late-5", "late-10"]
    assert rows.full_reads == 2
