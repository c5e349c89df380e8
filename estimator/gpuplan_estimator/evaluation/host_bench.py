"""First half of the CPU closed loop: benchmark this host, fit its CPU latency models.

The shipped bundle's CPU rows come from whichever host measured them; a CPU elsewhere has other
SIMD units, caches and clocks. So `gpuplan eval` times this host's single-kernel units first
(`gpuplan bench --device cpu`, resumable in the performance database) and prices the light
models with models fitted on exactly those rows, never on the whole-model timings it compares
against.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from gpuplan_estimator import errors, measurements, train, train_cli
from gpuplan_estimator.bench import runner, timing
from gpuplan_estimator.bundle import Bundle
from gpuplan_estimator.perfdb.store import PerfStore


@dataclass(frozen=True)
class HostBenchSettings:
    minutes: float = 10.0
    """Benchmark budget; a later run with the same settings resumes the plan."""
    samples: int = 4000
    """Rows in the sampled plan (about 380 rows/min on an idle 2-core host)."""
    seed: int = 0
    """Sampling seed of the plan and random_state of the fit."""
    db_url: str | None = None
    """Performance database (None: $GPUPLAN_DB_URL or the default SQLite file)."""
    min_rows: int = 400
    """Fewer measured rows than this is too little to fit per-kernel models from."""
    sweep_paths: tuple[str, ...] = runner.BenchSettings().sweep_paths
    timing: timing.TimingSettings = field(default_factory=timing.TimingSettings)


@dataclass(frozen=True)
class HostModels:
    bundle: Bundle
    run_id: int
    rows: int  # CPU rows of this backend in the database, this run's and earlier ones
    status: str  # the bench run's: done | interrupted
    db_url: str

    def describe(self) -> str:
        return (f"CPU latency models fitted in this run from the {self.rows} CPU rows of "
                f"{self.db_url} (this host's bench runs; this run's plan: run {self.run_id}, "
                f"{self.status})")


def bench_and_fit(
    settings: HostBenchSettings, *, progress: Callable[[str], None] | None = None,
) -> HostModels:
    """Run (or resume) the CPU bench plan on this host, then fit CPU models on its rows."""
    bench = runner.BenchSettings(
        device="cpu", samples=settings.samples, budget_minutes=settings.minutes,
        seed=settings.seed, sweep_paths=settings.sweep_paths, timing=settings.timing,
        command=(f"gpuplan bench --device cpu --samples {settings.samples} --budget-minutes "
                 f"{settings.minutes:g} --seed {settings.seed}"))
    with PerfStore.open(settings.db_url) as store:
        report = runner.run_bench(bench, store, progress=False)
        # Every row this host's database holds for the CPU on this backend: earlier runs (other
        # plans, targeted sweeps) measured the same machine and only add coverage.
        frame = store.measurements(devices=[report.device], backend=report.backend)
        url = store.url
    if progress is not None:
        progress(f"eval: CPU bench run {report.run_id}: {report.rows_total}/{report.planned} rows "
                 f"({report.status}, {report.rows_added} added in {report.elapsed_s:.0f} s)")
    if len(frame) < settings.min_rows:
        raise errors.InvalidRequestError(
            "--cpu-bench-minutes",
            f"only {len(frame)} CPU rows measured (need {settings.min_rows}); give the bench "
            "more minutes or run `gpuplan eval` again to resume it")
    fitted = train.train_bundle(
        frame[list(measurements.MEASUREMENT_COLUMNS)],
        train.TrainSettings(seed=settings.seed, min_rows_per_kernel=50,
                            cpu_params=train_cli.CPU_PARAMS),
        validate=False)
    return HostModels(fitted, report.run_id, len(frame), report.status, url)
