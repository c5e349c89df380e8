"""First half of the CPU closed loop: benchmark this host, fit its CPU latency models.

The shipped bundle's CPU rows come from whichever host measured them; a CPU elsewhere has other
SIMD units, caches and clocks. So `gpuplan eval` times this host's single-kernel units first
(`gpuplan bench --device cpu`, resumable in the performance database) and prices the light
models with models fitted on exactly those rows, never on the whole-model timings it compares
against.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from gpuplan_estimator.bench import runner, sweep, timing
from gpuplan_estimator.core import errors, measurements
from gpuplan_estimator.core.progress import Progress, silent
from gpuplan_estimator.core.workload import WorkItem
from gpuplan_estimator.cost.predictors import LatencyPrediction, LatencyPredictor
from gpuplan_estimator.devices.catalog import DeviceSpec
from gpuplan_estimator.latency.bundles import Bundle
from gpuplan_estimator.perfdb.store import PerfStore
from gpuplan_estimator.training import fitting, recipe


@dataclass(frozen=True)
class HostBenchSettings:
    """How `gpuplan eval` benchmarks this host before fitting its CPU models."""
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
    reference_rows_per_kernel: int = 6
    """Stored rows re-timed right after the fit: how much faster or slower the host is now
    than when its rows were measured (0 = assume the same speed)."""
    backend: str = "onnxruntime"
    """`gpuplan bench --backend`: onnxruntime for the inference loop, torch for the training
    step."""


@dataclass(frozen=True)
class HostModels:
    """CPU latency models fitted on this host's rows, with their provenance."""
    bundle: Bundle
    run_id: int
    rows: int  # CPU rows of this backend in the database, this run's and earlier ones
    status: str  # the bench run's: done | interrupted
    db_url: str
    backend: str
    speed_ratio: float = 1.0  # now / stored latency of re-timed reference rows (median)
    reference_rows: int = 0

    def describe(self) -> str:
        """Report sentence: where the models' rows came from and the host speed index applied."""
        text = (f"CPU latency models fitted in this run from the {self.rows} {self.backend} CPU "
                f"rows of "
                f"{self.db_url} (this host's bench runs; this run's plan: run {self.run_id}, "
                f"{self.status})")
        if self.reference_rows:
            text += (f"; {self.reference_rows} stored rows re-timed now take "
                     f"{self.speed_ratio:.3f}x their stored latency, and predictions are "
                     "scaled by that host speed index")
        return text


class ScaledPredictor:
    """A predictor whose times are multiplied by a host speed index (see `speed_ratio`)."""

    def __init__(self, inner: LatencyPredictor, factor: float) -> None:
        self.inner, self.factor = inner, factor
        self.name = inner.name

    def predict(self, items: Sequence[WorkItem], device: DeviceSpec) -> LatencyPrediction:
        """The inner predictor's median, p10 and p90 times multiplied by `factor`."""
        p = self.inner.predict(items, device)
        return LatencyPrediction(p.median_ms * self.factor, p.p10_ms * self.factor,
                                 p.p90_ms * self.factor, p.predictor)


def retime(frame: pd.DataFrame, per_kernel: int, seed: int,
           settings: timing.TimingSettings, backend: str = "onnxruntime") -> pd.DataFrame:
    """Time `per_kernel` stored rows of every kernel again on this host.

    Columns: kernel, stored_ms, now_ms, ratio (now / stored).
    """
    picked = pd.concat([g.sample(n=min(per_kernel, len(g)), random_state=seed)
                        for _, g in frame.groupby("kernel")])
    target = runner.resolve_target("cpu")
    out = []
    for _, r in picked.iterrows():
        item = sweep.PlanItem(str(r["kernel"]), str(r["op"]), str(r["dtype"]),
                              json.loads(str(r["dims"])))
        now = runner.measure_item(item, target, settings, seed, backend)["latency_ms"]
        out.append((item.kernel, float(r["latency_ms"]), now))
    timed = pd.DataFrame(out, columns=["kernel", "stored_ms", "now_ms"])
    return timed.assign(ratio=timed["now_ms"] / timed["stored_ms"])


def speed_ratio(frame: pd.DataFrame, per_kernel: int, seed: int,
                settings: timing.TimingSettings, backend: str = "onnxruntime"
                ) -> tuple[float, int]:
    """Median of now / stored latency over `per_kernel` stored rows of every kernel.

    The 2-core VM this was built on ran 5-30 % faster or slower from one half hour to the
    next (hack/cpu_remeasure.py), so whole-model timings taken now are compared with op
    timings taken then only after this index. Rows of 0.05-20 ms: long enough to time well,
    short enough to keep the check to seconds.
    """
    usable = frame[(frame["latency_ms"] >= 0.05) & (frame["latency_ms"] <= 20.0)]
    if usable.empty or per_kernel < 1:
        return 1.0, 0
    timed = retime(usable, per_kernel, seed, settings, backend)
    return float(np.median(timed["ratio"])), len(timed)


def bench_and_fit(
    settings: HostBenchSettings, *, progress: Progress = silent,
) -> HostModels:
    """Run (or resume) the CPU bench plan on this host, then fit CPU models on its rows.

    The bench's rows and the fit's kernels are reported to `progress`.
    """
    bench = runner.BenchSettings(
        device="cpu", samples=settings.samples, budget_minutes=settings.minutes,
        seed=settings.seed, sweep_paths=settings.sweep_paths, timing=settings.timing,
        backend=settings.backend,
        command=(f"gpuplan bench --device cpu --backend {settings.backend} --samples "
                 f"{settings.samples} --budget-minutes {settings.minutes:g} --seed "
                 f"{settings.seed}"))
    with PerfStore.open(settings.db_url) as store:
        report = runner.run_bench(bench, store, progress=progress)
        # Every row this host's database holds for the CPU on this backend: earlier runs (other
        # plans, targeted sweeps) measured the same machine and only add coverage.
        frame = store.measurements(devices=[report.device], backend=report.backend)
        url = store.url
    if len(frame) < settings.min_rows:
        raise errors.InvalidRequestError(
            "--cpu-bench-minutes",
            f"only {len(frame)} CPU rows measured (need {settings.min_rows}); give the bench "
            "more minutes or run `gpuplan eval` again to resume it")
    fitted = fitting.train_bundle(
        frame[[*measurements.MEASUREMENT_COLUMNS, *measurements.OPTIONAL_TRAIN_COLUMNS]],
        fitting.TrainSettings(seed=settings.seed, min_rows_per_kernel=50,
                            cpu_params=recipe.CPU_PARAMS),
        validate=False, progress=progress)
    ratio, checked = speed_ratio(frame, settings.reference_rows_per_kernel, settings.seed,
                                 settings.timing, settings.backend)
    return HostModels(fitted, report.run_id, len(frame), report.status, url, report.backend,
                      ratio, checked)
