"""Training and validation of the per-kernel latency models from a measurement frame.

`train_bundle` fits one `LayerLatencyModel` per kernel on all rows and validates it with a
held-out random split and leave-one-device-out refits; only held-out rows produce the metrics
written to the manifest. ``python -m gpuplan_estimator.training.fitting --report`` prints the
tables and writes ``docs/latency-models.md``.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import numpy as np
import numpy.typing as npt
import pandas as pd

from gpuplan_estimator import devices
from gpuplan_estimator.core import errors, measurements
from gpuplan_estimator.core.precisions import TF32_DIM, TF32_MATH
from gpuplan_estimator.core.progress import Progress, silent, track
from gpuplan_estimator.cost import features
from gpuplan_estimator.cost.predictors import FloatArray
from gpuplan_estimator.devices.catalog import DeviceSpec
from gpuplan_estimator.latency import basis, bundles
from gpuplan_estimator.latency.bundles import Bundle
from gpuplan_estimator.latency.regressors import LayerLatencyModel, ProbeCorrection
from gpuplan_estimator.planning import intervals
from gpuplan_estimator.training import backward_factors, probes

DeviceResolver = Callable[[str], DeviceSpec]


@dataclass(frozen=True)
class TrainSettings:
    """What `train_bundle` fits and how it validates."""

    seed: int = 0
    """random_state of the split, the subsample and LightGBM."""
    max_rows_per_kernel: int = 40_000
    """Subsample cap per kernel (stratified by device) so training stays in minutes on 2 cores."""
    test_fraction: float = 0.2
    leave_one_device_out: bool = True
    model_params: Mapping[str, Any] = field(default_factory=dict)
    """Overrides of `LayerLatencyModel` keyword arguments for every kernel."""
    kernel_params: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    """Further overrides per kernel (bigger models where the data supports them)."""
    transfer_params: Mapping[str, Any] = field(default_factory=dict)
    """Overrides for the transfer models (kept small: they see fewer features)."""
    cpu_params: Mapping[str, Any] = field(default_factory=dict)
    """Overrides for the CPU models (a few thousand rows each; small trees keep the bundle
    small). Per-kernel sizes in `kernel_params` apply to GPU models only."""
    min_rows_per_kernel: int = 200
    """Kernels with fewer rows get no model (they fall back to the roofline)."""
    probe_max_rows: int = 100
    """A GPU with fewer rows than this of a kernel is *probed*, not trained on: its rows stay
    out of that kernel's fits and fit a `ProbeCorrection` of the transfer model for it (a short
    `gpuplan bench` on a new GPU type). Leave-one-device-out also reports this few-shot case."""
    probe_rows: int = 20
    """Rows of the left-out GPU used as its probe in the few-shot leave-one-device-out metric
    (the metric is computed on its other rows)."""
    transfer_kind: str = "roofline"
    """Structure of the transfer models (`features.TRANSFER_KINDS`): "tiled" learns a bounded
    utilisation of the tile-and-wave time (`cost.tiling`), "roofline" the ratio over the
    device roofline, "tiled-gemm" the first for gemm and the second for the rest. Recorded in
    the manifest, read back by `LearnedPredictor`; bundles without it are "roofline", the
    default: no tiled kind lowered whole-model leave-one-GPU-out error at the evaluation's
    15000 rows per kernel (docs/latency-method.md, `evaluation.transfer_check`)."""

    def __post_init__(self) -> None:
        features.transfer_feature_names("gemm", self.transfer_kind)  # rejects an unknown kind


@dataclass(frozen=True)
class KernelData:
    """Rows of one kernel ready for LightGBM."""

    x: FloatArray
    y: FloatArray  # log(latency / base)
    base_ms: FloatArray
    transfer_x: FloatArray  # the transfer model's features (`features.transfer_matrix`)
    transfer_base_ms: FloatArray  # and its normaliser
    latency_ms: FloatArray
    device: np.ndarray  # catalog key per row
    platform: np.ndarray  # "cpu" or "gpu" per row
    backend: np.ndarray  # backend name per row (onnxruntime and torch rows of one CPU differ)


def data_digest(frame: pd.DataFrame) -> str:
    """sha256 over the frame's rows in a canonical column order and row order."""
    cols = [c for c in measurements.MEASUREMENT_COLUMNS if c in frame.columns]
    canon = frame[cols].sort_values(cols[:6]).reset_index(drop=True)
    hashed = pd.util.hash_pandas_object(canon, index=False).to_numpy()
    return "sha256:" + hashlib.sha256(hashed.tobytes()).hexdigest()


def kernel_data(
    frame: pd.DataFrame, kernel: str, resolve: DeviceResolver, backends: Sequence[str],
    transfer_kind: str = "roofline",
) -> KernelData:
    """Features and target for the rows of one kernel (any mix of devices and backends)."""
    rows = frame[frame["kernel"] == kernel]
    cols, dev, specs = _columns(rows, kernel, resolve, backends)
    x, base = features.feature_matrix(cols, dev)
    latency = rows["latency_ms"].to_numpy(dtype=np.float64)
    kinds = {d: s.platform for d, s in specs.items()}
    x_t, base_t = features.transfer_matrix(cols, dev, x, base, transfer_kind)
    return KernelData(x, np.log(latency / base), base, x_t, base_t, latency,
                      rows["device"].to_numpy(),
                      rows["device"].map(kinds).to_numpy(), rows["backend"].to_numpy())


def _columns(rows: pd.DataFrame, kernel: str, resolve: DeviceResolver, backends: Sequence[str]
             ) -> tuple[features.WorkColumns, features.DeviceColumns, dict[str, DeviceSpec]]:
    """Work and device columns of `kernel`'s rows, and the spec of each device among them."""
    if (rows["latency_ms"] <= 0).any() or rows["latency_ms"].isna().any():
        raise errors.InvalidRequestError("latency_ms", f"{kernel}: latencies must be > 0")
    parsed = [measurements.dims_from_json(t) for t in rows["dims"]]
    keys = features.KERNEL_DIMS[kernel]
    try:
        dims = {k: np.array([p[k] for p in parsed], dtype=np.int64) for k in keys}
    except KeyError as exc:
        raise errors.InvalidRequestError(
            "dims", f"{kernel} rows lack dim {exc.args[0]!r}") from None
    math = np.array([TF32_MATH if p.get(TF32_DIM) == 1 else "" for p in parsed], dtype=np.str_)
    cols = features.WorkColumns(
        kernel, dims, rows["dtype"].to_numpy().astype(str), rows["op"].to_numpy().astype(str),
        math if math.any() else None)
    specs = {d: resolve(d) for d in rows["device"].unique()}
    codes = [backends.index(b) for b in rows["backend"]]
    dev = features.device_columns([specs[d] for d in rows["device"]], cols.dtype, codes, kernel,
                                  cols.math)
    return cols, dev, specs


MIN_SUB_WAVE_ROWS = 50
"""Fewer sub-wave gemm rows than this fit no scale (the record is left out)."""


def sub_wave_log_ratios(rows: pd.DataFrame, resolve: DeviceResolver, backends: Sequence[str]
                        ) -> tuple[npt.NDArray[np.bool_], FloatArray]:
    """Per gemm row of `rows` (GPU rows only): whether it is sub-wave on its device
    (`features.one_wave_gemm`), and log(measured / unscaled one-wave time)."""
    cols, dev, _ = _columns(rows, "gemm", resolve, backends)
    mask, wave_ms = features.one_wave_gemm(cols, dev, 0.0)
    return mask, np.log(rows["latency_ms"].to_numpy(dtype=np.float64) / wave_ms)


def fit_sub_wave(rows: pd.DataFrame, resolve: DeviceResolver, backends: Sequence[str]
                 ) -> dict[str, Any] | None:
    """The one-wave log scale (`tiling.one_wave_ms`) of GPU gemm `rows`: the median over their
    sub-wave rows of log(measured / one-wave time), with the rows and devices it rests on;
    None with fewer than `MIN_SUB_WAVE_ROWS` sub-wave rows."""
    mask, log_ratio = sub_wave_log_ratios(rows, resolve, backends)
    if int(mask.sum()) < MIN_SUB_WAVE_ROWS:
        return None
    return {"log_scale": round(float(np.median(log_ratio[mask])), 6), "rows": int(mask.sum()),
            "devices": sorted(str(d) for d in rows["device"][mask].unique())}


def error_metrics(actual_ms: FloatArray, predicted_ms: FloatArray) -> dict[str, float]:
    """Row count, MAPE and P90 APE (percent) and log-space RMSE of predictions vs actual."""
    ape = np.abs(predicted_ms - actual_ms) / actual_ms
    return {
        "rows": float(len(actual_ms)),
        "mape_pct": round(float(100 * ape.mean()), 3),
        "p90_ape_pct": round(float(100 * np.quantile(ape, 0.9)), 3),
        "rmse_log": round(float(np.sqrt(np.mean(np.log(predicted_ms / actual_ms) ** 2))), 5),
    }


def validate_kernel(kernel: str, data: KernelData, settings: TrainSettings) -> dict[str, Any]:
    """Held-out error metrics of one kernel's models.

    A random split (overall and per device) with the full model, and leave-one-device-out
    with the transfer model (the one unseen devices get).
    """
    rng = np.random.default_rng(settings.seed)
    order = rng.permutation(len(data.y))
    n_test = max(1, int(len(order) * settings.test_fraction))
    test, train = order[:n_test], order[n_test:]
    pred = _fit_predict(kernel, data, train, test, settings, transfer=False)
    out: dict[str, Any] = {"random_split": error_metrics(data.latency_ms[test], pred)}
    out["random_split_by_platform"] = {
        str(k): error_metrics(data.latency_ms[test][m], pred[m])
        for k in np.unique(data.platform[test]) for m in [data.platform[test] == k]
    }
    out["random_split_by_device"] = {
        str(d): error_metrics(data.latency_ms[test][m], pred[m])
        for d in np.unique(data.device[test]) for m in [data.device[test] == d]
    }
    out["random_split_by_backend"] = {
        str(b): error_metrics(data.latency_ms[test][m], pred[m])
        for b in np.unique(data.backend[test]) for m in [data.backend[test] == b]
    }
    gpu = {str(d): (data.latency_ms[test][m], pred[m]) for d in np.unique(data.device[test])
           for m in [(data.device[test] == d) & (data.platform[test] == "gpu")] if m.any()}
    if gpu:
        out[MEASURED_LOG_SIGMA] = intervals.shared_sigma(gpu, seed=settings.seed)
    if settings.leave_one_device_out:
        loo: dict[str, Any] = {}
        probed: dict[str, Any] = {}
        held_out = leave_one_device_out(kernel, data, settings)
        for d, (held, pred_held) in held_out.items():
            loo[d] = error_metrics(data.latency_ms[held], pred_held)
            if len(held) > 2 * settings.probe_rows:
                probed[d] = _probe_metrics(data.latency_ms[held], pred_held,
                                           data.transfer_base_ms[held], rng, settings.probe_rows)
        if loo:
            out["leave_one_device_out"] = loo
            out[SHARED_LOG_SIGMA] = shared_log_sigma(data, held_out, settings.seed)
        if probed:
            out["leave_one_device_out_probe"] = probed
    return out


SHARED_LOG_SIGMA = "shared_log_sigma"
"""`validate_kernel`'s key for `shared_log_sigma`; `train_bundle` moves it out of the metrics
into the manifest's `intervals.MANIFEST_KEY`."""
MEASURED_LOG_SIGMA = "measured_log_sigma"
"""`validate_kernel`'s key for the shared log-error of a measured GPU: the random split's
held-out shapes of each GPU drawn into synthetic models (`intervals.shared_sigma`), what a
model of shapes the bundle never timed on a GPU it did time shares. Moved into the manifest
like `SHARED_LOG_SIGMA`."""


def leave_one_device_out(kernel: str, data: KernelData, settings: TrainSettings
                         ) -> dict[str, tuple[npt.NDArray[np.intp], FloatArray]]:
    """Per device with a sibling of its platform timed by one of its backends: (its row
    indices, their times predicted by the transfer model fitted on the platform's other
    devices), what an unseen device gets."""
    out: dict[str, tuple[npt.NDArray[np.intp], FloatArray]] = {}
    for d in np.unique(data.device):
        held = np.flatnonzero(data.device == d)
        platform = data.platform[held[0]]
        # Only devices with a sibling of their platform: a CPU is not a GPU left out.
        if len(np.unique(data.device[data.platform == platform])) < 2:
            continue
        rest = np.flatnonzero((data.device != d) & (data.platform == platform))
        # Left out, a device timed by a backend no other device was timed by measures how
        # that backend times (a bench's CUDA-graph replay against eager calls), not how well
        # the device is predicted: an unmeasured GPU is priced with the shared backend's rows.
        if not np.isin(data.backend[held], data.backend[rest]).any():
            continue
        out[str(d)] = (held, _fit_predict(kernel, data, rest, held, settings, transfer=True))
    return out


def shared_log_sigma(data: KernelData,
                     held_out: Mapping[str, tuple[npt.NDArray[np.intp], FloatArray]],
                     seed: int) -> intervals.SharedSigma:
    """The kernel family's shared log-error for an unseen device (`planning.intervals`): its
    left-out devices' rows drawn into synthetic models, pooled over the devices, over all
    sizes and per duration band."""
    return intervals.shared_sigma(
        {d: (data.latency_ms[held], pred) for d, (held, pred) in held_out.items()}, seed=seed)


def interval_sigma_table(sigmas: Mapping[str, intervals.SharedSigma],
                         measured: Mapping[str, intervals.SharedSigma] | None = None,
                         ) -> dict[str, dict[str, dict[str, object]]]:
    """The manifest's `intervals.MANIFEST_KEY` entry: the shared log-sigma per kernel for an
    extrapolated GPU and, the same, for a probed one (a probe lowers the bias, so the unseen
    GPU's figure is the conservative side), and a measured GPU's from the random split
    (`MEASURED_LOG_SIGMA`). Without that, measured GPUs keep their summed quantiles."""
    table = {k: s.to_manifest() for k, s in sigmas.items()}
    out = {basis.EXTRAPOLATED: table, basis.PROBED: dict(table)}
    if measured:
        out[basis.MEASURED] = {k: s.to_manifest() for k, s in measured.items()}
    return out


def _probe_metrics(actual_ms: FloatArray, predicted_ms: FloatArray, base: FloatArray,
                   rng: np.random.Generator, probe_rows: int) -> dict[str, float]:
    """Metrics on a left-out device after correcting by `probe_rows` of its own rows (spread
    over sizes as a bench run spreads them, `probes.spread_pick`; scored on the rest): what one
    short bench run on a new GPU type buys."""
    probe = probes.spread_pick(base, probe_rows, rng)
    rest = np.setdiff1d(np.arange(len(actual_ms)), probe)
    correction = probe_correction(actual_ms[probe], predicted_ms[probe], base[probe])
    corrected = predicted_ms[rest] * correction.factor(base[rest])
    return {**error_metrics(actual_ms[rest], corrected), "probe_rows": float(probe_rows)}


def probe_rows(rows: pd.DataFrame, per_kernel: int, seed: int,
               resolve: DeviceResolver | None = None) -> pd.DataFrame:
    """A probe of one device: `per_kernel` of its rows of every kernel (all of a smaller
    kernel), spread over the roofline time as `probes.spread_pick` draws them."""
    resolve = resolve if resolve is not None else devices.resolve_device
    rng = np.random.default_rng(seed)
    picked = []
    for kernel, group in rows.groupby("kernel", sort=True):
        base = kernel_data(group, str(kernel), resolve, sorted(group["backend"].unique())).base_ms
        picked.append(group.iloc[probes.spread_pick(base, per_kernel, rng)])
    return pd.concat(picked) if picked else rows.iloc[:0]


MAX_PROBE_SLOPE = 0.2  # a handful of rows cannot support more; unbounded fits did no better


def probe_correction(actual_ms: FloatArray, predicted_ms: FloatArray, base_ms: FloatArray
                     ) -> ProbeCorrection:
    """Fit a `ProbeCorrection` to probe rows' measured vs predicted times (ms).

    Least-squares slope (clipped to ±`MAX_PROBE_SLOPE`), then the median residual as the
    offset, which resists the odd algorithm switch among a few rows.
    """
    log_ratio = np.log(actual_ms / predicted_ms)
    log_base = np.log(base_ms)
    slope = 0.0
    if len(log_ratio) >= 3 and np.ptp(log_base) > 0:
        slope = float(np.polyfit(log_base, log_ratio, 1)[0])
    slope = float(np.clip(slope, -MAX_PROBE_SLOPE, MAX_PROBE_SLOPE))
    return ProbeCorrection(float(np.median(log_ratio - slope * log_base)), slope,
                           float(log_base.min()), float(log_base.max()))


@dataclass(frozen=True)
class _TrainingFrame:
    """The rows the trees learn from, after the filters `train_bundle` applies before fitting."""

    rows: pd.DataFrame  # capped per kernel, each platform apart
    probe_rows: pd.DataFrame
    kinds: Mapping[str, str]  # device -> platform ("gpu" | "cpu")
    kernelless_rows_dropped: int
    backward_factors: dict[str, Any]


@dataclass
class _FittedKernels:
    """What the per-(kernel, platform) loop of `train_bundle` produced."""

    models: dict[str, LayerLatencyModel] = field(default_factory=dict)
    transfer: dict[str, LayerLatencyModel] = field(default_factory=dict)
    cpu_models: dict[str, LayerLatencyModel] = field(default_factory=dict)
    metrics: dict[str, Any] = field(default_factory=dict)
    skipped: dict[str, int] = field(default_factory=dict)
    sigmas: dict[str, intervals.SharedSigma] = field(default_factory=dict)  # leave-one-GPU-out
    measured_sigmas: dict[str, intervals.SharedSigma] = field(default_factory=dict)
    kernel_devices: dict[str, list[str]] = field(default_factory=dict)  # GPUs timed, per kernel
    sub_wave: dict[str, Any] | None = None


def train_bundle(
    frame: pd.DataFrame, settings: TrainSettings, *, resolve: DeviceResolver | None = None,
    now: Callable[[], datetime] | None = None, command: str = "", commit: str = "",
    validate: bool = True, progress: Progress = silent,
) -> Bundle:
    """Fit every kernel with enough rows; the manifest carries held-out metrics and provenance.

    Each (kernel, platform) fit is one step reported to `progress`.
    """
    resolve = resolve if resolve is not None else devices.resolve_device
    training = _training_frame(frame, settings, resolve)
    fitted = _fit_kernels(training, settings, resolve, validate, progress)
    created = (now() if now is not None else datetime.now().astimezone()).isoformat()
    manifest = _manifest(training, fitted, settings,
                         {"created": created, "command": command, "commit": commit})
    bundle = Bundle(models=fitted.models, manifest=manifest, transfer_models=fitted.transfer,
                    cpu_models=fitted.cpu_models)
    return with_probes(bundle, training.probe_rows, resolve)


def _training_frame(frame: pd.DataFrame, settings: TrainSettings,
                    resolve: DeviceResolver) -> _TrainingFrame:
    _check_frame(frame)
    kinds = {d: resolve(d).platform for d in frame["device"].unique()}
    frame, kernelless = drop_kernelless_rows(frame, kinds)
    frame = drop_windowed_gpu_rows(frame, kinds)
    factors = backward_factors.fit(frame)  # from every row: the caps below are for the trees
    frame, probe_frame = split_probe_rows(frame, kinds, settings)
    # GPU and CPU rows are capped and fitted apart: one platform's rows must neither use up the
    # other's row budget nor move its predictions.
    frame = pd.concat([subsample(rows, settings.max_rows_per_kernel, settings.seed)
                       for _, rows in frame.groupby(frame["device"].map(kinds), sort=True)],
                      ignore_index=True)
    return _TrainingFrame(frame, probe_frame, kinds, kernelless, factors)


def _fit_kernels(training: _TrainingFrame, settings: TrainSettings, resolve: DeviceResolver,
                 validate: bool, progress: Progress) -> _FittedKernels:
    frame = training.rows
    backends = sorted(frame["backend"].unique())
    out = _FittedKernels()
    platform = frame["device"].map(training.kinds)
    counts = (frame.assign(platform=platform).groupby(["kernel", "platform"]).size()
              .reset_index(name="rows"))
    groups = list(counts.itertuples(index=False, name=None))
    for kernel_value, kind_value, count in track(groups, "fit kernels", progress,
                                                 label=lambda g: f"{g[0]} ({g[1]})"):
        kernel, kind = str(kernel_value), str(kind_value)
        if count < settings.min_rows_per_kernel or kernel not in features.KERNEL_DIMS:
            out.skipped[kernel if kind == "gpu" else f"{kernel} (cpu)"] = int(count)
            continue
        rows = frame[(frame["kernel"] == kernel) & (platform == kind)]
        data = kernel_data(rows, kernel, resolve, backends, settings.transfer_kind)
        own = settings if kind == "gpu" else dataclasses.replace(
            settings, kernel_params={}, model_params={**settings.model_params,
                                                      **settings.cpu_params})
        if validate:
            part = validate_kernel(kernel, data, own)
            sigma = part.pop(SHARED_LOG_SIGMA, None)
            if kind == "gpu" and sigma is not None:
                out.sigmas[kernel] = sigma
            measured = part.pop(MEASURED_LOG_SIGMA, None)
            if kind == "gpu" and measured is not None:
                out.measured_sigmas[kernel] = measured
            _merge_metrics(out.metrics.setdefault(kernel, {}), part)
        fitted = _model(own, kernel, quantiles=True).fit(data.x, data.y)
        if kind == "cpu":
            out.cpu_models[kernel] = fitted
            continue
        out.models[kernel] = fitted
        out.kernel_devices[kernel] = sorted(str(d) for d in np.unique(data.device))
        # From one GPU's rows a transfer model cannot learn what differs between GPUs, and no
        # GPU can be left out to size its interval: unmeasured GPUs keep the roofline.
        if len(out.kernel_devices[kernel]) < 2:
            continue
        out.transfer[kernel] = _model(settings, kernel, quantiles=True, transfer=True).fit(
            data.transfer_x, np.log(data.latency_ms / data.transfer_base_ms))
        if kernel == "gemm":
            out.sub_wave = fit_sub_wave(rows, resolve, backends)
    return out


def _manifest(training: _TrainingFrame, fitted: _FittedKernels, settings: TrainSettings,
              provenance: dict[str, str]) -> dict[str, Any]:
    frame, probe_frame, kinds = training.rows, training.probe_rows, training.kinds
    platform = frame["device"].map(kinds)
    learned = {"gpu": set(fitted.models), "cpu": set(fitted.cpu_models)}
    kernels = {*fitted.models, *fitted.cpu_models}
    device_backends = (frame.groupby("device")["backend"].agg(lambda s: s.value_counts().index[0]))
    manifest = {
        **provenance,
        "data_digest": data_digest(pd.concat([frame, probe_frame])), "rows": len(frame),
        # Only devices a fitted model learned from: a GPU whose few rows are all probe rows or
        # of kernels without a model (the H200 bench's batchnorm/pool/memcpy rows) is probed
        # or extrapolated, never "measured" (`basis.data_basis`, `Bundle.has_seen`).
        "devices": sorted(device_rows(frame.assign(platform=platform),
                                      probe_frame.iloc[:0].assign(platform=""), learned)),
        "backends": sorted(frame["backend"].unique()),
        "device_rows": device_rows(frame.assign(platform=platform), probe_frame.assign(
            platform=probe_frame["device"].map(kinds)), learned),
        "device_backends": {str(k): str(v) for k, v in device_backends.items()},
        "default_backends": _default_backends(frame, platform),
        "backward_factors": training.backward_factors,
        "skipped_kernels": fitted.skipped,
        "kernelless_rows_dropped": training.kernelless_rows_dropped, "metrics": fitted.metrics,
        bundles.KERNEL_DEVICES_KEY: fitted.kernel_devices,
        "kernel_platforms": {k: [kind for kind, models in (("cpu", fitted.cpu_models),
                                                           ("gpu", fitted.models))
                                 if k in models] for k in sorted(kernels)},
        "device_platforms": {str(d): kinds[d] for d in sorted(kinds)},
        "settings": {"seed": settings.seed, "max_rows_per_kernel": settings.max_rows_per_kernel,
                     "test_fraction": settings.test_fraction},
        "transfer_kind": settings.transfer_kind,
        "feature_names": {k: list(features.feature_names(k)) for k in kernels},
    }
    if fitted.sigmas:
        manifest[intervals.MANIFEST_KEY] = interval_sigma_table(fitted.sigmas,
                                                                fitted.measured_sigmas)
    if fitted.sub_wave is not None:
        manifest[bundles.SUB_WAVE_KEY] = fitted.sub_wave
    return manifest


def device_rows(fitted: pd.DataFrame, probes: pd.DataFrame,
                learned: Mapping[str, set[str]]) -> dict[str, int]:
    """Per device key: the rows the bundle learned it from, what `/v1/coverage` reports as
    ``bundle_rows``: fitted rows after the per-kernel cap plus probe rows, both with a
    ``platform`` column, counted only for the kernels `learned` has a model of on that platform
    (a kernel skipped for too few rows taught the bundle nothing about its devices)."""
    def used(rows: pd.DataFrame) -> pd.Series:
        keep = [k in learned.get(p, set()) for k, p in zip(rows["kernel"], rows["platform"],
                                                            strict=True)]
        return rows.loc[keep, "device"]

    counts = pd.concat([used(fitted), used(probes)]).value_counts()
    return {str(d): int(n) for d, n in sorted(counts.items())}


def with_probes(fitted: Bundle, probe_frame: pd.DataFrame,
                resolve: DeviceResolver | None = None) -> Bundle:
    """`fitted` plus a `ProbeCorrection` of its transfer model per (GPU, kernel) of the probes.

    Probe rows come from `split_probe_rows`; rows of kernels without a transfer model are
    ignored.
    """
    resolve = resolve if resolve is not None else devices.resolve_device
    manifest = fitted.manifest
    # A probed GPU has no backend of its own in the manifest: it is priced with the GPU
    # default, so the correction is fitted against those predictions.
    default = manifest.get("default_backends", {}).get("gpu")
    offsets: dict[str, dict[str, Any]] = {}
    for (kernel, device), rows in probe_frame.groupby(["kernel", "device"]):
        transfer = fitted.transfer_models.get(str(kernel))
        if transfer is None or default is None:
            continue
        kind = transfer_kind_of(manifest)
        probe = kernel_data(rows.assign(backend=default), str(kernel), resolve,
                            manifest["backends"], kind)
        predicted = probe.transfer_base_ms * np.exp(features.bounded_log_ratio(
            str(kernel), transfer.predict(probe.transfer_x), kind))
        fit = probe_correction(probe.latency_ms, predicted, probe.transfer_base_ms)
        offsets.setdefault(str(device), {})[str(kernel)] = {
            "log_offset": round(fit.log_offset, 6),
            "log_base_slope": round(fit.log_base_slope, 6),
            "log_base_min": round(fit.log_base_min, 6), "log_base_max": round(fit.log_base_max, 6),
            "rows": len(rows)}
    return dataclasses.replace(fitted, manifest={**manifest, "probe_offsets": offsets,
                                                 "probe_rows": len(probe_frame)})


def split_probe_rows(
    frame: pd.DataFrame, kinds: Mapping[str, str], settings: TrainSettings
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Split `frame` into (rows to fit, probe rows).

    A GPU's rows of a kernel are probe rows when it has fewer than `probe_max_rows` of them
    while the GPUs with more have enough to fit the kernel.
    """
    gpu = frame["device"].map(kinds) == "gpu"
    counts = frame[gpu].groupby(["kernel", "device"]).size()
    small = counts < settings.probe_max_rows
    fitted_rows = counts[~small].groupby(level="kernel").sum()
    probed = [(str(k), str(d)) for k, d in small[small].index
              if fitted_rows.get(k, 0) >= settings.min_rows_per_kernel]
    if not probed:
        return frame, frame.iloc[:0]
    pairs = pd.MultiIndex.from_frame(frame[["kernel", "device"]])
    mask = pairs.isin(probed)
    return frame[~mask], frame[mask]


def _merge_metrics(into: dict[str, Any], part: Mapping[str, Any]) -> None:
    """Held-out metrics of one platform's model into the kernel's entry: per platform and
    device side by side; the overall random split stays the GPU one when there is one."""
    for key in ("random_split_by_platform", "random_split_by_device", "random_split_by_backend",
                "leave_one_device_out", "leave_one_device_out_probe"):
        if key in part:
            into.setdefault(key, {}).update(part[key])
    if "random_split" not in into or "gpu" in part.get("random_split_by_platform", {}):
        into["random_split"] = part["random_split"]


def subsample(frame: pd.DataFrame, max_rows: int, seed: int) -> pd.DataFrame:
    """At most `max_rows` per kernel (deterministic), shared out evenly across devices: a device
    with fewer rows than its share keeps them all and leaves the rest to the others.

    A benchmark Job's few hundred rows of a new GPU sit beside tens of thousands of shared rows
    of others; thinned by the same fraction, the one GPU measured as it is priced would keep a
    handful, too few for the trees to fit it."""
    parts = []
    for _, rows in frame.groupby("kernel", sort=True):
        if len(rows) <= max_rows:
            parts.append(rows)
            continue
        quota = device_quotas({str(d): int(n) for d, n in rows["device"].value_counts().items()},
                              max_rows)
        for device, group in rows.groupby("device", sort=True):
            n = quota[str(device)]
            parts.append(group.sample(n=n, random_state=seed) if n < len(group) else group)
    return pd.concat(parts, ignore_index=True) if parts else frame


def device_quotas(counts: Mapping[str, int], max_rows: int) -> dict[str, int]:
    """Rows each device keeps of `max_rows`: smallest first, each up to an even share of what
    is left (water-filling)."""
    quota: dict[str, int] = {}
    left = max_rows
    for k, (device, count) in enumerate(sorted(counts.items(), key=lambda kv: (kv[1], kv[0]))):
        quota[device] = min(count, left // (len(counts) - k))
        left -= quota[device]
    return quota


def _model(
    settings: TrainSettings, kernel: str, *, quantiles: bool, transfer: bool = False
) -> LayerLatencyModel:
    params = {"random_state": settings.seed, **settings.model_params,
              **(settings.transfer_params if transfer else settings.kernel_params.get(kernel, {})),
              "quantiles": quantiles}
    return LayerLatencyModel(**params)


def transfer_kind_of(manifest: Mapping[str, Any]) -> str:
    """The transfer structure a bundle was trained with (bundles before it: "roofline")."""
    return str(manifest.get("transfer_kind", "roofline"))


def _fit_predict(
    kernel: str, data: KernelData, train: np.ndarray, test: np.ndarray, settings: TrainSettings,
    *, transfer: bool,
) -> FloatArray:
    if not transfer:
        model = _model(settings, kernel, quantiles=False)
        model.fit(data.x[train], data.y[train])
        return data.base_ms[test] * np.exp(model.predict(data.x[test]))
    x, base = data.transfer_x, data.transfer_base_ms
    model = _model(settings, kernel, quantiles=False, transfer=True)
    model.fit(x[train], np.log(data.latency_ms[train] / base[train]))
    log_ratio = features.bounded_log_ratio(kernel, model.predict(x[test]), settings.transfer_kind)
    return base[test] * np.exp(log_ratio)


def _default_backends(frame: pd.DataFrame, platform: pd.Series) -> dict[str, str]:
    """The most common backend per platform (`platform` holds each row's)."""
    return {str(k): str(rows.value_counts().index[0])
            for k, rows in frame["backend"].groupby(platform)}


MIN_GPU_KERNEL_MS = 0.0005
"""No GPU kernel completes in under 0.5 µs (a tiny kernel replayed from a CUDA graph took
0.84 µs on the H200, docs/gpu-steps/2026-11-27-h200b/host-probe.json): a faster GPU row timed
no kernel at all (a view PyTorch did not copy) and would teach the model a free kernel."""


def drop_windowed_gpu_rows(frame: pd.DataFrame, platforms: Mapping[str, str]) -> pd.DataFrame:
    """`frame` without its GPU elementwise rows of windowed ops (`features.WINDOWED_OPS`).

    The elementwise model reads its op as one ordinal code, and LRN's is beside the codes of
    casts, sqrt and every op without a code of its own. A GPU whose rows hold LRN (the H200
    run's 210 of 416) teaches the trees that everything on that side of the split costs what a
    windowed kernel does: the H200's AdamW `addcdiv` came out at 535 GB/s. Until LRN has a
    kernel model of its own, its items are priced as before any GPU timed it."""
    windowed = ((frame["device"].map(platforms) == "gpu") & (frame["kernel"] == "elementwise")
                & frame["op"].isin(features.WINDOWED_OPS))
    return frame[~windowed] if windowed.any() else frame


def drop_kernelless_rows(frame: pd.DataFrame, platforms: Mapping[str, str]
                         ) -> tuple[pd.DataFrame, int]:
    """`frame` without its GPU rows faster than `MIN_GPU_KERNEL_MS`, and how many went."""
    on_gpu = frame["device"].map(platforms) == "gpu"
    # Zero, negative and missing latencies stay in, for `_columns` to refuse as corrupt.
    kernelless = on_gpu & (frame["latency_ms"] > 0) & (frame["latency_ms"] < MIN_GPU_KERNEL_MS)
    dropped = int(kernelless.sum())
    if dropped == len(frame):
        raise errors.InvalidRequestError(
            "latency_ms", f"every row is faster than a GPU kernel ({MIN_GPU_KERNEL_MS} ms)")
    return (frame[~kernelless] if dropped else frame), dropped


def _check_frame(frame: pd.DataFrame) -> None:
    missing = [c for c in ("device", "backend", "kernel", "op", "dtype", "dims", "latency_ms")
               if c not in frame.columns]
    if missing:
        raise errors.InvalidRequestError("frame", f"measurement frame lacks {', '.join(missing)}")
    if frame.empty:
        raise errors.InvalidRequestError("frame", "no measurement rows to train on")


def metrics_json(bundle: Bundle) -> str:
    """The bundle manifest's held-out metrics as indented, key-sorted JSON."""
    return json.dumps(bundle.manifest.get("metrics", {}), indent=2, sort_keys=True)


# --- report: `python -m gpuplan_estimator.training.fitting --report` ------------------------------
