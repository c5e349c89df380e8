"""The host probe from node to estimate (issue #30): `gpuplan bench` on CPU measures it first
and stores it with its run and in the export's sidecar, `gpuplan import` stores it from the
sidecar into another database (once), and the planner context reads the newest per device."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from gpuplan_estimator.bench import host_probe, runner
from gpuplan_estimator.core import errors
from gpuplan_estimator.interfaces.cli import bench as cli
from gpuplan_estimator.interfaces.cli import serving
from gpuplan_estimator.perfdb import host_probes, importing
from gpuplan_estimator.perfdb.store import PerfStore
from gpuplan_estimator.step import host
from gpuplan_testing.bench_fixtures import TARGET, TINY
from gpuplan_testing.contexts import roofline_context
from gpuplan_testing.perfdb_contract import probe_row

PROBE_OPS = "10"
"""Calls per timed loop: the smallest the probe takes, so the test runs in seconds."""


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """`gpuplan bench --device cpu --export` with the probe, once for the module: the
    parquet's path (the node's database, node.db, beside it)."""
    root = tmp_path_factory.mktemp("bench")
    sweeps = root / "sweeps"
    sweeps.mkdir()
    (sweeps / "softmax.yaml").write_text(TINY["softmax.yaml"])
    out = root / "cpu.parquet"
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(runner, "resolve_target", lambda device: TARGET)
        code = cli.main(["bench", "--device", "cpu", "--backend", "torch", "--samples", "2",
                         "--repeats", "2",
                         "--sweep", str(sweeps), "--db", f"sqlite:///{root / 'node.db'}",
                         "--export", str(out), "--no-progress", "--host-probe-ops", PROBE_OPS])
    assert code == 0
    return out


def test_bench_stores_the_probe_with_its_run_and_exports_it(exported: Path) -> None:
    with PerfStore.open(f"sqlite:///{exported.parent / 'node.db'}") as store:
        (stored,) = store.host_probes()
        (run,) = store.runs()
    assert (stored.device, stored.run_id, stored.probe_version) == ("cpu", run.id,
                                                                    host.PROBE_VERSION)
    assert stored.cpu_model == host_probe.cpu_model()
    assert stored.provenance["ops"] == int(PROBE_OPS)
    assert stored.provenance["command"].startswith("gpuplan bench")
    assert stored.host_probe().eager_op_us > 0  # the estimates can read it
    side = json.loads(exported.with_suffix(".json").read_text())
    assert side[host_probes.SIDECAR_KEY]["figures_us"] == stored.figures_us


def test_import_stores_the_sidecars_probe_once(exported: Path, tmp_path: Path) -> None:
    with PerfStore.open(f"sqlite:///{tmp_path / 'central.db'}") as store:
        first = importing.import_gpu_ops(exported, store)
        again = importing.import_gpu_ops(exported, store)
        (stored,) = store.host_probes()
        (run,) = store.runs()
    assert (first.host_probes_added, again.host_probes_added) == (1, 0)
    assert "1 host probe(s) added" in first.summary()
    assert (stored.device, stored.run_id) == ("cpu", run.id)


def test_a_bad_probe_in_a_sidecar_names_file_and_field(exported: Path, tmp_path: Path) -> None:
    copy = tmp_path / exported.name
    shutil.copy(exported, copy)
    doc = json.loads(exported.with_suffix(".json").read_text())
    del doc[host_probes.SIDECAR_KEY]["figures_us"]["eager_op_us"]
    copy.with_suffix(".json").write_text(json.dumps(doc))
    with (PerfStore.open(f"sqlite:///{tmp_path / 'central.db'}") as store,
          pytest.raises(errors.GpuplanError, match=r"cpu\.json: field host_probe\."
                        r"figures_us: .*eager_op_us")):
        importing.import_gpu_ops(copy, store)


@pytest.mark.parametrize("flags", [["--no-host-probe"], []],
                         ids=["no-host-probe", "onnxruntime-backend"])
def test_bench_without_the_probe_stores_none(sweep_dir: Path, tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch,
                                             flags: list[str]) -> None:
    """Skipped on request, and by default with a backend other than torch (the onnxruntime
    image need not have torch, and the probe times PyTorch's host)."""
    monkeypatch.setattr(runner, "resolve_target", lambda device: TARGET)
    out = tmp_path / "cpu.parquet"
    db = f"sqlite:///{tmp_path / 'skip.db'}"
    assert cli.main(["bench", "--samples", "1", "--repeats", "2", "--sweep", str(sweep_dir),
                     "--db", db, "--export", str(out), "--no-progress", "--families",
                     "softmax", "--backend", "onnxruntime", *flags]) == 0
    assert json.loads(out.with_suffix(".json").read_text())[host_probes.SIDECAR_KEY] is None
    with PerfStore.open(db) as store:
        assert store.host_probes() == []
        assert importing.import_gpu_ops(out, store).host_probes_added == 0


def test_the_context_carries_the_newest_probe_per_device(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'perf.db'}"
    with PerfStore.open(url) as store:
        store.add_host_probe(probe_row("t4", "Xeon", 5.0))
        store.add_host_probe(probe_row("t4", "EPYC", 7.0, date="2026-11-28"))
        store.add_host_probe(probe_row("l4", "Xeon", 9.0, version=host.PROBE_VERSION + 1))
    ctx = serving.context_with_host_probes(roofline_context, url)
    assert {d: p.eager_op_us for d, p in ctx.host_probes.items()} == {"t4": 7.0}
    assert ctx.host_probes["t4"].source.startswith("host probe 2 of t4 | EPYC (2026-11-28")


def test_an_unreadable_database_leaves_the_bundles_default(tmp_path: Path) -> None:
    garbage = tmp_path / "perf.db"
    garbage.write_bytes(b"not a database" * 100)
    ctx = serving.context_with_host_probes(roofline_context, f"sqlite:///{garbage}")
    assert ctx.host_probes == {}


def test_the_probe_module_and_the_step_model_agree_on_the_version() -> None:
    assert host_probe.PROBE_VERSION == host.PROBE_VERSION
