"""The benchmark Job template renders to a valid batch/v1 Job pinned to one GPU type, and the
operator's Job command, run in-process, resumes after a preemption and records NVML data."""

import datetime
import json
import pathlib
import string
from typing import Any

import pytest
import yaml

from gpuplan_estimator.bench import host_probe, nvml, runner, torch_units
from gpuplan_estimator.interfaces.cli import bench as bench_cli
from gpuplan_estimator.perfdb.store import PerfStore

ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_template_renders_a_pinned_gpu_job() -> None:
    text = (ROOT / "benchmark-jobs" / "job-template.yaml").read_text()
    rendered = string.Template(text).substitute(
        NAME="bench-l4", NAMESPACE="gpuplan", GPU_PRODUCT="NVIDIA-L4", IMAGE="img:1",
        DB_SECRET="perfdb", BUDGET_MINUTES="30", BACKEND="torch")
    job = yaml.safe_load(rendered)
    assert job["kind"] == "Job" and job["apiVersion"] == "batch/v1"
    pod = job["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == {"nvidia.com/gpu.product": "NVIDIA-L4"}
    container = pod["containers"][0]
    assert container["resources"]["limits"] == {"nvidia.com/gpu": 1}
    assert container["args"][:3] == ["bench", "--device", "cuda"]
    assert "--sweep" in container["args"]


def test_every_sweep_spec_is_listed_for_the_image() -> None:
    sweeps = sorted((ROOT / "benchmark-jobs" / "sweeps").glob("*.yaml"))
    assert sweeps
    dockerfile = (ROOT / "benchmark-jobs" / "Dockerfile.cuda").read_text()
    assert "COPY benchmark-jobs/sweeps /sweeps" in dockerfile


def test_the_image_runs_as_the_jobs_non_root_user() -> None:
    from gpuplan_operator.core import benchmarks

    lines = (ROOT / "benchmark-jobs" / "Dockerfile.cuda").read_text().splitlines()
    uid = benchmarks.RUN_AS_UID
    users = [line.split()[1] for line in lines if line.startswith("USER ")]
    assert users == [f"{uid}:{uid}"] and uid != 0
    assert any(f"--uid {uid}" in line for line in lines)
    assert any(f"--home-dir {benchmarks.HOME}" in line for line in lines)
    assert any(line.startswith("RUN pip install") and "torch" in line for line in lines)


# --- The Job's command, run as a local process's main() (issue #17) --------------------------

TINY_GEMM = """
kernel: gemm
ops: [matmul]
dims: {batch: {choice: [1, 2]}, m: {log: [1, 32]}, k: {log: [1, 32]}, n: {log: [1, 32]},
       bias: {choice: [0, 1]}}
limits: {cpu: {max_flops: 1.0e6, max_bytes: 1.0e6}, cuda: {max_flops: 1.0e6, max_bytes: 1.0e6}}
"""


def _job_args(**mapping: str) -> list[str]:
    """The container args of the operator's Job, with test-only substitutions (the sweep
    directory, and --device cuda → cpu where no GPU is at hand)."""
    from gpuplan_operator.core import benchmarks

    job = benchmarks.build_job(
        "NVIDIA-L4", now=datetime.datetime(2026, 6, 15, tzinfo=datetime.UTC), namespace="ml",
        options=benchmarks.BenchmarkJobOptions(image="img:1", db_secret="perfdb",
                                               budget_minutes=30))
    args = list(job["spec"]["template"]["spec"]["containers"][0]["args"])
    return [mapping.get(a, a) for a in args]


@pytest.fixture
def tiny_sweeps(tmp_path: pathlib.Path) -> pathlib.Path:
    d = tmp_path / "sweeps"
    d.mkdir()
    (d / "gemm.yaml").write_text(TINY_GEMM)
    return d


def test_a_retried_pod_resumes_the_same_run(tmp_path: pathlib.Path, tiny_sweeps: pathlib.Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """Preempted mid-plan, the retried pod runs the same command and finishes the same run."""
    db = f"sqlite:///{tmp_path / 'perf.db'}"
    argv = [*_job_args(cuda="cpu", **{"/sweeps": str(tiny_sweeps)}), "--samples", "6",
            "--repeats", "2", "--db", db]
    assert argv[argv.index("--backend") + 1] == "torch"
    real_measure = runner.measure_item
    calls = {"n": 0}

    def preempted_after_two(*args: Any, **kwargs: Any) -> dict[str, Any]:
        calls["n"] += 1
        if calls["n"] == 3:
            raise KeyboardInterrupt  # the second SIGTERM of an eviction abandons the row
        return real_measure(*args, **kwargs)

    monkeypatch.setattr(runner, "measure_item", preempted_after_two)
    assert bench_cli.main(argv) == 130
    with PerfStore.open(db) as store:
        [run] = store.runs()
        assert run.status == "interrupted" and len(store.measurements(run_id=run.id)) == 2
    monkeypatch.setattr(runner, "measure_item", real_measure)
    assert bench_cli.main(argv) == 0
    with PerfStore.open(db) as store:
        [again] = store.runs()
        frame = store.measurements(run_id=again.id)
    assert (again.id, again.status, len(frame)) == (run.id, "done", 6)
    assert frame["fwd_bwd_latency_ms"].notna().all()  # the torch backend's forward+backward


class FakeNvml:
    """pynvml's calls the bench makes, answering like an L4."""

    NVML_CLOCK_SM, NVML_CLOCK_MEM = 0, 1

    def nvmlInit(self) -> None: ...
    def nvmlShutdown(self) -> None: ...

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:
        return index

    def nvmlDeviceGetName(self, h: int) -> bytes:
        return b"NVIDIA L4"

    def nvmlDeviceGetUUID(self, h: int) -> str:
        return "GPU-0c1a"

    def nvmlDeviceGetMemoryInfo(self, h: int) -> Any:
        return type("Memory", (), {"total": 24 * 1024**3})()

    def nvmlSystemGetDriverVersion(self) -> str:
        return "550.54.15"

    def nvmlDeviceGetMaxClockInfo(self, h: int, kind: int) -> int:
        return 2040 if kind == self.NVML_CLOCK_SM else 6251

    def nvmlDeviceGetPowerManagementLimit(self, h: int) -> int:
        return 72000  # mW

    def nvmlDeviceGetPowerUsage(self, h: int) -> int:
        return 60000  # mW

    def nvmlDeviceGetClockInfo(self, h: int, kind: int) -> int:
        return 1800


def test_the_jobs_command_records_nvml_identity_clocks_and_power(
        tmp_path: pathlib.Path, tiny_sweeps: pathlib.Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """`gpuplan bench --device cuda --backend torch` as the Job runs it; NVML is faked and the
    torch layers run on the CPU (no GPU here), everything else is the real path."""
    monkeypatch.setattr(nvml, "pynvml", FakeNvml())
    build, time_ = torch_units.build_unit, torch_units.time_unit
    monkeypatch.setattr(torch_units, "build_unit",
                        lambda item, rng, device: build(item, rng, "cpu"))
    monkeypatch.setattr(torch_units, "time_unit",
                        lambda unit, *, device, settings: time_(unit, device="cpu",
                                                                settings=settings))
    probe = host_probe.measure  # the Job's host probe, on this CPU in a few short loops
    monkeypatch.setattr(host_probe, "measure", lambda settings, **kw: probe(
        host_probe.ProbeSettings("cpu", ops=10, repeats=1), **kw))
    db = f"sqlite:///{tmp_path / 'perf.db'}"
    argv = [*_job_args(**{"/sweeps": str(tiny_sweeps)}), "--samples", "3", "--repeats", "2",
            "--db", db]
    assert argv[:5] == ["bench", "--device", "cuda", "--backend", "torch"]
    assert bench_cli.main(argv) == 0
    with PerfStore.open(db) as store:
        [run] = store.runs()
        frame = store.measurements(run_id=run.id)
        stored_devices = store.devices()
    assert run.device == "l4" and run.backend.startswith("torch-") and run.backend.endswith("cuda")
    identity = json.loads(run.settings_json)["nvml"]
    assert identity == {"index": 0, "name": "NVIDIA L4", "uuid": "GPU-0c1a",
                        "memory_bytes": 24 * 1024**3, "driver_version": "550.54.15",
                        "max_sm_clock_mhz": 2040, "max_mem_clock_mhz": 6251,
                        "power_limit_watts": 72.0}
    assert len(frame) == 3
    assert (frame["power_watts"] == 60.0).all() and (frame["sm_clock_mhz"] == 1800.0).all()
    assert (frame["energy_mj"] > 0).all()
    row = stored_devices.set_index("key").loc["l4"]
    assert (row["nvml_name"], row["nvml_uuid"]) == ("NVIDIA L4", "GPU-0c1a")
