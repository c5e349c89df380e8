"""Which commit a number records (issue #30 part 6): only gpuplan's own checkout, an explicit
``--commit`` or ``$GPUPLAN_COMMIT`` may name it; a repository that merely encloses a copy of the
code (a device machine's checkout travels without .git) must not."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from gpuplan_estimator.bench import runner
from gpuplan_estimator.core import errors, provenance
from gpuplan_estimator.interfaces.cli import bench as cli
from gpuplan_estimator.perfdb.store import PerfStore
from gpuplan_testing.bench_fixtures import TARGET

PYPROJECT = '[project]\nname = "gpuplan"\nversion = "0.1.0"\n'


def _git(cwd: Path, *args: str) -> str:
    done = subprocess.run(["git", "-C", str(cwd), "-c", "user.name=t", "-c", "user.email=t@t",
                           *args], capture_output=True, text=True, check=True)
    return done.stdout.strip()


def _repo(root: Path) -> str:
    """A git repository at `root` with one commit; its HEAD."""
    root.mkdir(parents=True, exist_ok=True)
    _git(root, "init", "-q")
    (root / "README").write_text("x\n")
    _git(root, "add", "README")
    _git(root, "commit", "-q", "-m", "init")
    return _git(root, "rev-parse", "HEAD")


def test_an_enclosing_repository_names_no_commit(tmp_path: Path) -> None:
    """The H200 run's defect: a copy of gpuplan inside someone else's repository."""
    _repo(tmp_path / "outer")
    copy = tmp_path / "outer" / "work" / "gpuplan"
    copy.mkdir(parents=True)
    (copy / "pyproject.toml").write_text(PYPROJECT)
    assert provenance.git_commit(copy) == ""
    assert provenance.code_commit(cwd=copy, environ={}) is None


def test_gpuplans_own_checkout_names_its_head(tmp_path: Path) -> None:
    root = tmp_path / "gpuplan"
    root.mkdir()
    (root / "pyproject.toml").write_text(PYPROJECT)
    head = _repo(root)
    assert provenance.git_commit(root) == head
    assert provenance.code_commit(cwd=root, environ={}) == head


def test_a_repository_of_another_project_names_no_commit(tmp_path: Path) -> None:
    root = tmp_path / "other"
    root.mkdir()
    (root / "pyproject.toml").write_text('[project]\nname = "not-gpuplan"\n')
    _repo(root)
    assert provenance.git_commit(root) == ""


def test_explicit_commit_then_environment_win_over_git(tmp_path: Path) -> None:
    root = tmp_path / "gpuplan"
    root.mkdir()
    (root / "pyproject.toml").write_text(PYPROJECT)
    _repo(root)
    env = {provenance.COMMIT_ENV: "cc66580"}
    assert provenance.code_commit("abcdef1", cwd=root, environ=env) == "abcdef1"
    assert provenance.code_commit(None, cwd=root, environ=env) == "cc66580"


@pytest.mark.parametrize("bad", ["HEAD", "cc665", "cc66580; rm -rf /", "x" * 100])
def test_a_malformed_commit_is_refused_naming_its_source(bad: str, tmp_path: Path) -> None:
    with pytest.raises(errors.InvalidRequestError, match="--commit"):
        provenance.code_commit(bad, cwd=tmp_path, environ={})
    with pytest.raises(errors.InvalidRequestError, match=provenance.COMMIT_ENV):
        provenance.code_commit(None, cwd=tmp_path, environ={provenance.COMMIT_ENV: bad})


def _bench(tmp_path: Path, sweep_dir: Path, *extra: str) -> tuple[int, dict, str]:
    out = tmp_path / "out" / "bench.parquet"
    code = cli.main(["bench", "--samples", "2", "--repeats", "2", "--sweep", str(sweep_dir),
                     "--db", f"sqlite:///{tmp_path / 'c.db'}", "--export", str(out),
                     "--no-progress", "--families", "softmax", *extra])
    side = json.loads(out.with_suffix(".json").read_text()) if out.exists() else {}
    return code, side, f"sqlite:///{tmp_path / 'c.db'}"


def test_bench_sidecar_records_null_and_says_unknown_outside_the_checkout(
    sweep_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A device copy inside an enclosing repository: the sidecar and the run record name no
    commit, and the note says unknown."""
    _repo(tmp_path / "outer")
    copy = tmp_path / "outer" / "gpuplan"
    copy.mkdir()
    (copy / "pyproject.toml").write_text(PYPROJECT)
    monkeypatch.setattr(runner, "resolve_target", lambda device: TARGET)
    monkeypatch.setattr(provenance.paths, "REPO_ROOT", copy)
    monkeypatch.delenv(provenance.COMMIT_ENV, raising=False)
    code, side, db = _bench(tmp_path, sweep_dir)
    assert code == 0
    assert side["commit"] is None
    assert "(commit unknown)" in capsys.readouterr().out
    with PerfStore.open(db) as store:
        assert [r.git_commit for r in store.runs()] == [""]


def test_bench_sidecar_takes_the_commit_flag_then_the_environment(
    sweep_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(runner, "resolve_target", lambda device: TARGET)
    monkeypatch.setenv(provenance.COMMIT_ENV, "cc66580")
    code, side, db = _bench(tmp_path, sweep_dir)
    assert (code, side["commit"]) == (0, "cc66580")
    with PerfStore.open(db) as store:
        assert [r.git_commit for r in store.runs()] == ["cc66580"]
    code, side, _ = _bench(tmp_path / "flag", sweep_dir, "--commit", "0123abcd")
    assert (code, side["commit"]) == (0, "0123abcd")

