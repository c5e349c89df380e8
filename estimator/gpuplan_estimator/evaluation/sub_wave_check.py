"""Leave-one-GPU-out of gemm rows before and after one-wave pricing of sub-wave GEMMs (#30 part 5).

Before: the transfer model a GPU absent from the bundle gets (`fitting.leave_one_device_out`).
After: the same, except rows whose tile plan fits one wave of the left-out GPU's SMs
(`features.one_wave_gemm`) are priced as that wave, with the scale fitted on the other GPUs'
sub-wave rows only (`fitting.fit_sub_wave`). Errors by the band of the *before* prediction and
by whether the plan fits one wave.

``gpuplan eval sub-wave-check --max-rows 15000`` (the shared gpu-ops
rows; ``--bench RUN/bench.parquet`` adds a benchmark run's GPU, e.g. the H200, as one more GPU
left out: its rows are never in a fit that prices them).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import numpy.typing as npt
import pandas as pd

from gpuplan_estimator import devices
from gpuplan_estimator.core import errors
from gpuplan_estimator.cost.predictors import FloatArray
from gpuplan_estimator.training import fitting, recipe, sources

BANDS_MS: tuple[tuple[str, float, float], ...] = (
    ("< 0.05 ms", 0.0, 0.05), ("0.05-0.5 ms", 0.05, 0.5), ("0.5-5 ms", 0.5, 5.0),
    (">= 5 ms", 5.0, float("inf")))
"""Bands of the before-prediction (the interval bands of `planning.intervals`)."""
MAX_BENCH_ROWS = 100_000


@dataclass(frozen=True)
class HeldOut:
    """Every gemm row priced with its GPU left out of the fit."""

    device: npt.NDArray[np.str_]
    latency_ms: FloatArray
    before_ms: FloatArray
    after_ms: FloatArray
    sub_wave: npt.NDArray[np.bool_]
    log_scale: dict[str, float]  # per GPU left out: the one-wave scale fitted without it


def held_out(frame: pd.DataFrame, settings: fitting.TrainSettings) -> HeldOut:
    """Leave-one-GPU-out of the gemm rows of `frame` (GPU rows, all of them: cap before)."""
    rows = frame[frame["kernel"] == "gemm"].reset_index(drop=True)
    backends = sorted(rows["backend"].unique())
    data = fitting.kernel_data(rows, "gemm", devices.resolve_device, backends, "roofline")
    mask, log_ratio = fitting.sub_wave_log_ratios(rows, devices.resolve_device, backends)
    before = np.full(len(rows), np.nan)
    after = np.full(len(rows), np.nan)
    scales: dict[str, float] = {}
    for device, (idx, pred) in fitting.leave_one_device_out("gemm", data, settings).items():
        others = (data.device != device) & mask
        if not others.any():
            raise errors.InvalidRequestError("frame", f"no sub-wave gemm rows beside {device}")
        scale = float(np.median(log_ratio[others]))
        scales[device] = scale
        before[idx] = pred
        wave_ms = data.latency_ms[idx] / np.exp(log_ratio[idx]) * np.exp(scale)
        after[idx] = np.where(mask[idx], wave_ms, pred)
    kept = ~np.isnan(before)
    return HeldOut(data.device[kept].astype(str), data.latency_ms[kept], before[kept],
                   after[kept], mask[kept], scales)


def _ape(actual: FloatArray, predicted: FloatArray) -> FloatArray:
    return np.abs(predicted - actual) / actual * 100.0


def table(result: HeldOut) -> str:
    """Markdown: rows, MAPE and median signed error (%) before -> after, by band and wave."""
    lines = ["| GPU left out | band (before) | plan | rows | MAPE before | MAPE after | "
             "median error before | after |", "|---|---|---|--:|--:|--:|--:|--:|"]
    groups = [("all", np.ones(len(result.device), dtype=bool))] + [
        (str(d), result.device == d) for d in sorted(set(result.device.tolist()))]
    for name, in_group in groups:
        for band, lo, hi in (("all", 0.0, float("inf")), *BANDS_MS):
            in_band = in_group & (result.before_ms >= lo) & (result.before_ms < hi)
            for plan, m in (("all", in_band), ("<= 1 wave", in_band & result.sub_wave),
                            ("> 1 wave", in_band & ~result.sub_wave)):
                if not m.any() or (name != "all" and plan != "all" and band != "all"):
                    continue
                a, b, c = result.latency_ms[m], result.before_ms[m], result.after_ms[m]
                lines.append(
                    f"| {name} | {band} | {plan} | {int(m.sum())} | {_ape(a, b).mean():.1f} | "
                    f"{_ape(a, c).mean():.1f} | {np.median(b / a - 1) * 100:+.1f} | "
                    f"{np.median(c / a - 1) * 100:+.1f} |")
    return "\n".join(lines)


def bench_rows(path: Path, backend: str) -> pd.DataFrame:
    """A benchmark run's gemm rows (`gpuplan bench --export`), on the shared rows' `backend`
    (what `LearnedPredictor` prices a GPU without its own backend with)."""
    if path.stat().st_size > 512 << 20:
        raise errors.InvalidRequestError("--bench", f"{path}: larger than 512 MiB")
    frame = sources.load_sources([str(path)])
    if len(frame) > MAX_BENCH_ROWS:
        raise errors.InvalidRequestError("--bench", f"{path}: more than {MAX_BENCH_ROWS} rows")
    gemm = frame[(frame["kernel"] == "gemm") & (frame["dtype"] == "float32")]
    return gemm.assign(backend=backend)


@dataclass(frozen=True)
class SubWaveCheckSettings:
    """`gpuplan eval sub-wave-check`'s flags."""
    max_rows: int
    """GEMM rows of the shared gpu-ops kept (a bench run's rows all stay)."""
    seed: int
    bench: tuple[Path, ...]
    """`gpuplan bench --export` parquets; each one's GPU is left out like the rest."""


def run(settings: SubWaveCheckSettings) -> int:
    """Print the before/after table; 0."""
    gpu_ops = str(recipe.shared_data_dir() / "gpu-ops")
    frame = sources.load_sources([gpu_ops])
    frame = frame[frame["kernel"] == "gemm"]
    train = fitting.TrainSettings(seed=settings.seed, max_rows_per_kernel=settings.max_rows,
                                  kernel_params=recipe.KERNEL_PARAMS,
                                  transfer_params=recipe.TRANSFER_PARAMS)
    # The cap applies to the shared rows; a bench run's few rows all stay.
    frame = fitting.subsample(frame, settings.max_rows, settings.seed)
    backend = str(frame["backend"].iloc[0])
    extra = [bench_rows(path, backend) for path in settings.bench]
    result = held_out(pd.concat([frame, *extra], ignore_index=True), train)
    print(table(result))
    print("\none-wave log scale fitted without each GPU: " + ", ".join(
        f"{d} {s:+.3f} (x{np.exp(s):.2f})" for d, s in sorted(result.log_scale.items())))
    return 0
