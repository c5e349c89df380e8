"""`gpuplan models list|show|add|activate` through the real `main()` against a real SQLite
performance database: documents and tables, rollback, and errors that name the version."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpuplan_estimator.interfaces.cli import main as cli
from gpuplan_estimator.perfdb import PerfStore
from gpuplan_testing.bundle_builders import tiny_bundle


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = cli.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_add_list_show_activate_and_roll_back(tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    db = f"sqlite:///{tmp_path / 'perf.db'}"
    first = tiny_bundle(tmp_path / "b1", seed=1, commit="1111111", rows=200)
    second = tiny_bundle(tmp_path / "b2", seed=2, commit="2222222", rows=400)

    code, out, _ = _run(capsys, "models", "add", str(first), "--activate", "--reason",
                        "first", "--db", db, "-o", "json")
    assert code == 0
    doc = json.loads(out)
    assert doc["kind"] == "ModelBundleList"
    assert [(b["version"], b["state"], b["rows"], b["git_commit"]) for b in doc["bundles"]] == [
        (1, "active", 200, "1111111")]
    code, out, _ = _run(capsys, "models", "add", str(second), "--db", db)
    assert code == 0 and "candidate" in out and "2222222" in out

    code, out, _ = _run(capsys, "models", "activate", "2", "--reason", "better", "--db", db)
    assert code == 0
    assert out.splitlines()[1].split()[:2] == ["2", "active"]
    assert "within their bundle poll" in out
    code, out, _ = _run(capsys, "models", "list", "--db", db, "-o", "yaml")
    assert code == 0
    assert "state: retired" in out and "reason: better" in out

    code, out, _ = _run(capsys, "models", "activate", "1", "--reason", "rollback", "--db", db,
                        "--json")
    assert code == 0 and [b["version"] for b in json.loads(out)["bundles"]] == [1]
    with PerfStore.open(db) as store:
        assert {b.version: b.state for b in store.bundles()} == {1: "active", 2: "retired"}

    code, out, _ = _run(capsys, "models", "show", "2", "--db", db)
    assert code == 0
    assert "state:        retired" in out and "replaced by version 1" in out
    assert "softmax" in out and "12.0" in out  # the held-out MAPE of its manifest
    code, out, _ = _run(capsys, "models", "show", "1", "--db", db, "-o", "json")
    assert json.loads(out)["metrics"]["softmax"]["random_split"]["mape_pct"] == 11.0

    code, out, _ = _run(capsys, "models", "list", "--db", db, "-o", "wide")
    assert code == 0 and "SHA256" in out and out.count("\n") == 3


@pytest.mark.parametrize("action", ["show", "activate"])
def test_an_unknown_version_is_an_error_naming_it(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], action: str) -> None:
    db = f"sqlite:///{tmp_path / 'perf.db'}"
    code, out, err = _run(capsys, "models", action, "7", "--db", db)
    assert code == 2 and out == ""
    assert err.startswith("gpuplan: error: no model bundle version 7 in sqlite:")


def test_an_empty_database_and_a_directory_that_is_not_a_bundle(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    db = f"sqlite:///{tmp_path / 'perf.db'}"
    code, out, _ = _run(capsys, "models", "list", "--db", db)
    assert code == 0 and "no model bundles" in out and "gpuplan models add" in out
    code, out, _ = _run(capsys, "models", "list", "--db", db, "-o", "json")
    assert json.loads(out)["bundles"] == []
    (tmp_path / "empty").mkdir()
    code, _, err = _run(capsys, "models", "add", str(tmp_path / "empty"), "--db", db)
    assert code == 2 and "no manifest; not a model bundle" in err
    code, _, err = _run(capsys, "models", "add", str(tmp_path / "missing"), "--db", db)
    assert code == 2 and "is not a directory" in err
