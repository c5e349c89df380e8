"""The estimate facade: graph + devices + predictor → step time, epoch time and memory per device.

The step's work items are built once (device independent), identical items (same family, kernel,
dims, dtype, op, attributes) are priced once, and the predictor is called once per device with
every distinct item: learned predictors batch by family inside that call.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from gpuplan_estimator.core import kernels, options
from gpuplan_estimator.core.errors import InvalidRequestError
from gpuplan_estimator.core.layers import ModelGraph, OpFamily
from gpuplan_estimator.core.quantiles import Z90
from gpuplan_estimator.core.workload import Phase, WorkItem
from gpuplan_estimator.cost import aligned_gemm, roofline, unrolled
from gpuplan_estimator.cost.predictors import LatencyPrediction, LatencyPredictor, predict_on_each
from gpuplan_estimator.devices import catalog
from gpuplan_estimator.devices.catalog import DeviceSpec
from gpuplan_estimator.latency import basis, learned
from gpuplan_estimator.planning import intervals
from gpuplan_estimator.step import backward, host
from gpuplan_estimator.step.decomposition import (
    KernelDimsFn,
    StepWork,
    TrainingSettings,
    build_step,
)
from gpuplan_estimator.step.memory import (
    MemoryBreakdown,
    training_memory,
    usable_memory_bytes,
)

ROOFLINE_PREFIX = "roofline"
TRAINING_FLOPS_PER_FORWARD_FLOP = 3
"""Model FLOPs of a training step per forward FLOP: backward is about twice the forward (the
convention of MFU, PaLM appendix B); the optimizer's FLOPs are not counted."""
SEQUENCE_DIM = "sequence"
"""The bound dim that makes throughput tokens/s (the name `graph.batching` binds)."""
_PHASE_CODE = {Phase.FORWARD: 0, Phase.BACKWARD: 1, Phase.OPTIMIZER: 2}


@dataclass(frozen=True)
class LayerTimeEstimate:
    """One layer's predicted forward and backward time (ms), interval and predictor."""
    name: str
    op_type: str
    family: str
    forward_ms: float
    backward_ms: float
    p10_ms: float  # forward + backward
    p90_ms: float
    predictor: str  # label of the predictor that priced most of this layer's time

    @property
    def total_ms(self) -> float:
        """Forward plus backward time of the layer in ms."""
        return self.forward_ms + self.backward_ms


@dataclass(frozen=True)
class DeviceStepEstimate:
    """Predicted step time split, epoch/total time and memory fit of a model on one device."""
    device: str  # canonical catalog key
    forward_ms: float
    backward_ms: float  # 0 for inference
    optimizer_ms: float
    step_time_ms: float
    interval_ms: tuple[float, float]  # (p10, p90) of the step (`planning.intervals`)
    steps_per_epoch: int | None
    epoch_seconds: float | None
    total_seconds: float | None
    memory: MemoryBreakdown
    memory_available_bytes: int
    fits: bool
    predictor: Mapping[str, float]  # predictor label → share of step time
    uncovered_ops: tuple[str, ...]
    layers: tuple[LayerTimeEstimate, ...]
    shape_only_layers: int
    data_basis: str  # latency.basis: measured, probed, extrapolated or roofline
    samples_per_step: int  # the global batch
    tokens_per_sample: int | None  # the sequence dim when bound, else None
    model_flops_per_step: float  # forward FLOPs x TRAINING_FLOPS_PER_FORWARD_FLOP in training
    peak_flops_per_s: float | None  # the device's datasheet peak at the precision
    price_per_hour_usd: float | None  # None: no known price (never "free")
    forward_backward_interval_ms: tuple[float, float]
    """(p10, p90) of forward + backward alone: what a label without the optimizer compares."""
    gpu_busy_ms: float = 0.0
    """The step's kernels alone, summed: what the step takes when the host keeps ahead."""
    host_ms: float | None = None
    """The host's time to issue the step (`step.host`); None where no host model applies
    (CPU devices, fused frameworks, a bundle without one)."""
    host_bound: bool = False
    """Whether issuing the step takes the host longer than its kernels take the GPU."""
    host_source: str = ""
    """The host model's probe: where its per-op costs were measured."""

    @property
    def samples_per_s(self) -> float:
        """Samples (batch elements) processed per second."""
        return self.samples_per_step * 1000.0 / self.step_time_ms if self.step_time_ms else 0.0

    @property
    def tokens_per_s(self) -> float | None:
        """Tokens per second for sequence models, else None."""
        if self.tokens_per_sample is None:
            return None
        return self.samples_per_s * self.tokens_per_sample

    @property
    def mfu(self) -> float | None:
        """Model FLOPs utilisation: achieved model FLOP/s over the datasheet peak."""
        if not self.peak_flops_per_s or not self.step_time_ms:
            return None
        return self.model_flops_per_step / (self.step_time_ms / 1000.0) / self.peak_flops_per_s

    def cost_usd(self, seconds: float | None) -> float | None:
        """What `seconds` on this device cost at its hourly price; None when either is unknown."""
        if seconds is None or self.price_per_hour_usd is None:
            return None
        return self.price_per_hour_usd * seconds / 3600.0

    def top_layers(self, n: int = 5) -> tuple[LayerTimeEstimate, ...]:
        """The `n` layers with the most forward+backward time, most expensive first."""
        return tuple(sorted(self.layers, key=lambda layer: -layer.total_ms)[: max(0, n)])


@dataclass(frozen=True)
class _Plan:
    """Device-independent bookkeeping: items, their distinct representatives and indices."""

    step: StepWork
    unique: tuple[WorkItem, ...]
    unique_index: npt.NDArray[np.intp]
    counts: npt.NDArray[np.float64]
    layer_index: npt.NDArray[np.intp]  # -1 for optimizer items
    phase: npt.NDArray[np.intp]
    op_types: tuple[str, ...]  # per item: the ONNX op type it prices
    item_row: npt.NDArray[np.intp]
    """Per item of `step.items`: the row it is issued with (a free item's, the next row's)."""
    derived_kernel: tuple[str, ...]
    """Per row: its kernel when `step.backward` derived it (`backward.DERIVED_ROLES`), else ""
    (one representative in `unique` may price a forward row and a derived one alike)."""


def estimate(
    graph: ModelGraph,
    devices: Sequence[DeviceSpec],
    settings: TrainingSettings,
    *,
    predictor: LatencyPredictor,
    epochs: int | None = None,
    dataset_size: int | None = None,
    kernel_dims: KernelDimsFn | None = None,
    host_model: host.HostModel | None = None,
    host_probes: Mapping[str, host.HostProbe] | None = None,
    step_log_sigma: intervals.StepSigma | None = None,
) -> tuple[DeviceStepEstimate, ...]:
    """Estimate one step of `graph` on each device; epoch/total time when sizes are given.

    On a GPU in eager PyTorch the step is priced on two clocks (`step.host`): `host_model`,
    else the predictor bundle's, prices the host issuing the kernels; a device whose key is in
    `host_probes` (probes measured on its nodes, from the performance database) is priced with
    that probe and the same coefficients. A GPU step's interval also holds how whole steps
    scatter beyond their kernels (`intervals.STEP_SIGMA_KEY`): `step_log_sigma`, else the
    bundle's."""
    settings.check()
    _check_sizes(epochs, dataset_size)
    if not devices:
        raise InvalidRequestError("devices", "at least one device is required")
    for device in devices:
        catalog.check_precision(device, settings.precision)
    plan = _plan(build_step(graph, settings, kernel_dims=kernel_dims))
    memory = training_memory(graph, settings)
    hosts = _device_host_costs(graph, plan, settings, host_model or bundle_host_model(predictor),
                               devices, host_probes or {})
    spread = bundle_step_sigma(predictor) if step_log_sigma is None else step_log_sigma
    steps = math.ceil(dataset_size / settings.batch_size) if dataset_size else None
    preds: Sequence[LatencyPrediction | None] = (
        predict_on_each(predictor, plan.unique, devices) if plan.unique else [None] * len(devices))
    return tuple(
        _with_economics(_with_step_spread(_price(graph, plan, device, pred, predictor, memory,
                                                 steps, epochs, hosts[device.key]),
                                          device, settings, spread),
                        graph, device, settings, predictor, plan.step.items)
        for device, pred in zip(devices, preds, strict=True)
    )


def _with_step_spread(r: DeviceStepEstimate, device: DeviceSpec, settings: TrainingSettings,
                      spread: intervals.StepSigma | None) -> DeviceStepEstimate:
    """`r` with its intervals under the step-level spread of its kind and math
    (`intervals.with_step_spread`; GPUs only: it was fitted on GPU steps, and a CPU's steps
    are its measured kernels run one after another)."""
    if spread is None or device.vendor == "cpu":
        return r
    kind = "train" if settings.training else "inference"
    value = spread[kind][intervals.step_math(settings.precision)]
    return dataclasses.replace(
        r, interval_ms=intervals.with_step_spread(r.interval_ms, r.step_time_ms, value),
        forward_backward_interval_ms=intervals.with_step_spread(
            r.forward_backward_interval_ms, r.forward_ms + r.backward_ms, value))


@dataclass(frozen=True)
class StreamRow:
    """One row of a step's plan on a device's stream: its representative item (rows of equal
    items share one), its phase, how many kernels it runs and their time (ms)."""

    item: WorkItem
    phase: Phase
    kernels: float
    ms: float


def stream_rows(graph: ModelGraph, device: DeviceSpec, settings: TrainingSettings, *,
                predictor: LatencyPredictor) -> list[StreamRow]:
    """Each row of the step's plan as `device`'s stream runs it, the host left out: what a
    profiler's kernels of one eager step read (`host.on_stream`)."""
    settings.check()
    plan = _plan(build_step(graph, settings))
    if not plan.unique:
        return []
    (pred,) = predict_on_each(predictor, plan.unique, [device])
    (per_run,) = _on_stream(predictor, device, pred.predictor,
                            np.asarray(pred.median_ms, dtype=np.float64))
    (per_run,) = unrolled.floored(plan.unique, device, per_run)
    per_row = per_run[plan.unique_index] * _row_scale(plan, predictor, device)
    phases = {code: phase for phase, code in _PHASE_CODE.items()}
    return [StreamRow(plan.unique[u], phases[int(code)], float(n), float(ms))
            for u, code, n, ms in zip(plan.unique_index, plan.phase, plan.counts, per_row,
                                      strict=True)]


def stream_busy_ms(graph: ModelGraph, device: DeviceSpec, settings: TrainingSettings, *,
                   predictor: LatencyPredictor) -> tuple[float, float, float]:
    """Forward, backward and optimizer kernel time on `device`'s stream (`stream_rows`)."""
    by_phase = dict.fromkeys(Phase, 0.0)
    for row in stream_rows(graph, device, settings, predictor=predictor):
        by_phase[row.phase] += row.ms
    return by_phase[Phase.FORWARD], by_phase[Phase.BACKWARD], by_phase[Phase.OPTIMIZER]


def model_flops_per_step(graph: ModelGraph, settings: TrainingSettings) -> float:
    """Model FLOPs of one step (the MFU numerator): the graph's forward FLOPs, times
    `TRAINING_FLOPS_PER_FORWARD_FLOP` when training."""
    forward = float(sum(layer.flops for layer in graph.layers))
    return forward * (TRAINING_FLOPS_PER_FORWARD_FLOP if settings.mode == "train" else 1)


def _with_economics(r: DeviceStepEstimate, graph: ModelGraph, device: DeviceSpec,
                    settings: TrainingSettings, predictor: LatencyPredictor,
                    items: Sequence[WorkItem]) -> DeviceStepEstimate:
    """`r` with what decisions need beyond time: basis, throughput units, FLOPs, peak, price.
    The peak is that of the math the step's matrix FLOPs run in (`roofline.
    matrix_peak_flops_per_s`): PyTorch's default fp32 runs convolutions on TF32 tensor cores,
    so a CNN's MFU against the fp32 SIMT peak read over 100 %."""
    try:
        peak: float | None = roofline.matrix_peak_flops_per_s(device, items, settings.precision)
    except InvalidRequestError:  # a device without a rate at this precision: no MFU
        peak = None
    return dataclasses.replace(
        r, data_basis=basis.data_basis(predictor, device), samples_per_step=settings.batch_size,
        tokens_per_sample=graph.dim_bindings.get(SEQUENCE_DIM),
        model_flops_per_step=model_flops_per_step(graph, settings), peak_flops_per_s=peak,
        price_per_hour_usd=device.price_per_hour_usd if device.has_price else None)


def _check_sizes(epochs: int | None, dataset_size: int | None) -> None:
    for name, value in (("epochs", epochs), ("dataset_size", dataset_size)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)
                                  or value <= 0):
            raise InvalidRequestError(name, f"must be a positive integer, got {value!r}")
    if epochs is not None and dataset_size is None:
        raise InvalidRequestError("dataset_size", "is required when epochs is given")


def _item_key(item: WorkItem) -> Hashable:
    return (
        item.family, item.kernel, tuple(sorted(item.dims.items())), item.dtype, item.op,
        tuple(sorted(item.attributes.items())),
    )


def _plan(step: StepWork) -> _Plan:
    layers = step.layers  # the step's own: training adds dropout and the loss
    layer_pos = {layer.name: i for i, layer in enumerate(layers)}
    op_of = [layer.op_type for layer in layers]
    family_of = [layer.family for layer in layers]
    seen: dict[Hashable, int] = {}
    unique: list[WorkItem] = []
    uidx: list[int] = []
    counts: list[float] = []
    lidx: list[int] = []
    phase: list[int] = []
    ops: list[str] = []
    item_row: list[int] = []
    derived: list[str] = []
    for item in step.items:
        item_row.append(len(uidx))
        if item.kernel == kernels.FREE_KERNEL:
            continue
        key = _item_key(item)
        if key not in seen:
            seen[key] = len(unique)
            unique.append(item)
        uidx.append(seen[key])
        counts.append(item.count)
        pos = layer_pos.get(item.layer, -1) if item.phase is not Phase.OPTIMIZER else -1
        lidx.append(pos)
        phase.append(_PHASE_CODE[item.phase])
        ops.append(_op_type(item, op_of[pos] if pos >= 0 else None,
                            family_of[pos] if pos >= 0 else None))
        derived.append(item.kernel if item.phase is Phase.BACKWARD
                       and item.role in backward.DERIVED_ROLES else "")
    return _Plan(
        step=step,
        unique=tuple(unique),
        unique_index=np.asarray(uidx, dtype=np.intp),
        counts=np.asarray(counts, dtype=np.float64),
        layer_index=np.asarray(lidx, dtype=np.intp),
        phase=np.asarray(phase, dtype=np.intp),
        op_types=tuple(ops),
        item_row=np.minimum(np.asarray(item_row, dtype=np.intp), max(len(uidx) - 1, 0)),
        derived_kernel=tuple(derived),
    )


def _row_scale(plan: _Plan, predictor: LatencyPredictor, device: DeviceSpec
               ) -> npt.NDArray[np.float64]:
    """Per row, the count it runs times the backward factor `device` measured for a derived
    backward kernel (`learned.backward_factors`; 1 elsewhere)."""
    factors = learned.backward_factors(predictor, device)
    if not factors:
        return plan.counts
    measured = np.array([factors.get(kernel, 1.0) for kernel in plan.derived_kernel])
    return plan.counts * measured


def _op_type(item: WorkItem, layer_op: str | None, layer_family: OpFamily | None) -> str:
    """What an uncovered item is reported as: its layer's op, or the derived kernel's op."""
    if layer_op is None:
        return f"optimizer:{item.op}"
    return layer_op if item.family is layer_family else item.op


def _price(
    graph: ModelGraph, plan: _Plan, device: DeviceSpec, pred: LatencyPrediction | None,
    predictor: LatencyPredictor, memory: MemoryBreakdown, steps: int | None, epochs: int | None,
    hosts: _HostCosts | None = None,
) -> DeviceStepEstimate:
    n = len(plan.unique)
    med_u = _checked(pred.median_ms if pred else None, n, "median_ms", predictor)
    p10_u = _checked(pred.p10_ms if pred else None, n, "p10_ms", predictor)
    p90_u = _checked(pred.p90_ms if pred else None, n, "p90_ms", predictor)
    labels_u = tuple(pred.predictor) if pred else ()
    if len(labels_u) != n:
        raise ValueError(f"predictor {predictor.name!r} returned {len(labels_u)} labels for {n}")
    if _on_two_clocks(device, hosts):  # the host model prices each call's dispatch
        med_u, p10_u, p90_u = _on_stream(predictor, device, labels_u, med_u, p10_u, p90_u)
    med_u, p10_u, p90_u = unrolled.floored(plan.unique, device, med_u, p10_u, p90_u)
    runs = _row_scale(plan, predictor, device)
    med = med_u[plan.unique_index] * runs
    p10 = p10_u[plan.unique_index] * runs
    p90 = p90_u[plan.unique_index] * runs
    by_phase = np.bincount(plan.phase, weights=med, minlength=3)
    sigmas = _shared_sigmas(predictor, device)
    families = [item.kernel for item in plan.unique]
    shape_sd = None if sigmas is None else intervals.shape_log_sigmas(sigmas, families, med_u)
    shape_sd, families = _stream_fit_shared(predictor, labels_u, shape_sd, families)
    no_optimizer = plan.phase != _PHASE_CODE[Phase.OPTIMIZER]
    step_ms = float(med.sum())
    label_names, label_of_item = _labels(labels_u, plan.unique_index)
    share = np.bincount(label_of_item, weights=med, minlength=len(label_names))
    shares = {name: (float(s) / step_ms if step_ms > 0 else 0.0)
              for name, s in zip(label_names, share, strict=True)}
    uncovered = _uncovered(graph, plan, predictor, label_names, label_of_item)
    epoch_s = steps * step_ms / 1000.0 if steps is not None else None
    return _on_host(DeviceStepEstimate(
        device=device.key,
        forward_ms=float(by_phase[0]),
        backward_ms=float(by_phase[1]),
        optimizer_ms=float(by_phase[2]),
        step_time_ms=step_ms,
        interval_ms=_around(_interval(plan, med, p10, p90, np.ones(len(med), dtype=bool),
                                      shape_sd, families), step_ms),
        forward_backward_interval_ms=_around(_interval(plan, med, p10, p90, no_optimizer,
                                                       shape_sd, families),
                                             float(by_phase[:2].sum())),
        steps_per_epoch=steps,
        epoch_seconds=epoch_s,
        total_seconds=epoch_s * epochs if epoch_s is not None and epochs is not None else None,
        memory=memory,
        memory_available_bytes=usable_memory_bytes(device),
        fits=memory.fits(device),
        predictor=shares,
        uncovered_ops=uncovered,
        layers=_layers(plan, med, p10, p90, label_names, label_of_item),
        shape_only_layers=len(plan.step.shape_only),
        data_basis=basis.ROOFLINE, samples_per_step=0, tokens_per_sample=None,
        model_flops_per_step=0.0, peak_flops_per_s=None, price_per_hour_usd=None,
    ), plan, med, device, hosts)


def _stream_fit_shared(predictor: LatencyPredictor, labels: Sequence[str],
                       shape_sd: npt.NDArray[np.float64] | None, families: list[str]
                       ) -> tuple[npt.NDArray[np.float64] | None, list[str]]:
    """Rows priced by the utilisations fitted on profiled steps (`cost.aligned_gemm`) err
    together, by the fit's held-out spread: they are one family of their own with that shared
    sigma (the bundle's GEMM sigma describes how bench shapes scatter, not these)."""
    fit = getattr(predictor, "aligned_fit", None)
    if shape_sd is None or not isinstance(fit, aligned_gemm.AlignedGemmFit):
        return shape_sd, families
    mine = np.array([label == aligned_gemm.LABEL for label in labels], dtype=bool)
    if not mine.any():
        return shape_sd, families
    return (np.where(mine, fit.log_sigma, shape_sd),
            [aligned_gemm.LABEL if m else k for k, m in zip(families, mine, strict=True)])


def _shared_sigmas(predictor: LatencyPredictor, device: DeviceSpec
                   ) -> Mapping[str, intervals.SharedSigma] | None:
    """The bundle's shared log-error per kernel family for this device's basis, if it has one."""
    bundle = getattr(predictor, "bundle", None)
    manifest = getattr(bundle, "manifest", None)
    if not isinstance(manifest, Mapping):
        return None
    return intervals.manifest_sigmas(manifest, basis.data_basis(predictor, device))


def _around(interval: tuple[float, float], median_ms: float) -> tuple[float, float]:
    """`interval` holding `median_ms`: the two are summed in different orders (an ulp apart)."""
    return min(interval[0], median_ms), max(interval[1], median_ms)


def _interval(plan: _Plan, med: npt.NDArray[np.float64], p10: npt.NDArray[np.float64],
              p90: npt.NDArray[np.float64], mask: npt.NDArray[np.bool_],
              shape_sd: npt.NDArray[np.float64] | None, families: Sequence[str]
              ) -> tuple[float, float]:
    """The interval of the masked items: identical shapes are totalled first (they err
    together), then combined by `intervals.step_interval` per error family (`families`, per
    distinct shape)."""
    n = len(plan.unique)
    idx = plan.unique_index[mask]

    def total(x: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
        return np.asarray(np.bincount(idx, weights=x[mask], minlength=n), dtype=np.float64)

    return intervals.step_interval(total(med), total(p10), total(p90), families, shape_sd)


def _checked(
    values: Any, n: int, name: str, predictor: LatencyPredictor
) -> npt.NDArray[np.float64]:
    arr = np.zeros(0) if values is None else np.asarray(values, dtype=np.float64)
    if arr.shape != (n,):
        raise ValueError(f"predictor {predictor.name!r}: {name} has shape {arr.shape}, want ({n},)")
    if n and not np.all(np.isfinite(arr) & (arr >= 0)):
        raise ValueError(f"predictor {predictor.name!r}: {name} has negative or non-finite values")
    return arr


def _labels(
    labels_u: tuple[str, ...], unique_index: npt.NDArray[np.intp]
) -> tuple[list[str], npt.NDArray[np.intp]]:
    names = sorted(set(labels_u))
    code = {name: i for i, name in enumerate(names)}
    codes_u = np.asarray([code[label] for label in labels_u], dtype=np.intp)
    return names, codes_u[unique_index] if len(codes_u) else np.zeros(0, dtype=np.intp)


def _uncovered(
    graph: ModelGraph, plan: _Plan, predictor: LatencyPredictor, label_names: list[str],
    label_of_item: npt.NDArray[np.intp],
) -> tuple[str, ...]:
    """OTHER-family op types, plus op types a learned predictor handed to its roofline fallback.

    When the predictor *is* the roofline every item is roofline-priced by choice, which the
    predictor share already says; listing every op type then would hide the OTHER ones.
    """
    ops = set(graph.unknown_op_types)
    if not predictor.name.startswith(ROOFLINE_PREFIX):
        fallback = [i for i, name in enumerate(label_names) if name.startswith(ROOFLINE_PREFIX)]
        for pos in np.flatnonzero(np.isin(label_of_item, fallback)):
            ops.add(plan.op_types[pos])
    return tuple(sorted(ops))


def _layers(
    plan: _Plan, med: npt.NDArray[np.float64], p10: npt.NDArray[np.float64],
    p90: npt.NDArray[np.float64], label_names: list[str], label_of_item: npt.NDArray[np.intp],
) -> tuple[LayerTimeEstimate, ...]:
    layers = plan.step.layers
    n = len(layers)
    mask = plan.layer_index >= 0
    idx = plan.layer_index[mask]
    fwd_mask = plan.phase[mask] == 0
    fwd = np.bincount(idx[fwd_mask], weights=med[mask][fwd_mask], minlength=n)
    bwd = np.bincount(idx[~fwd_mask], weights=med[mask][~fwd_mask], minlength=n)
    lo = np.bincount(idx, weights=p10[mask], minlength=n)
    hi = np.bincount(idx, weights=p90[mask], minlength=n)
    # The label of each layer's costliest item: sort by time, last write per layer wins.
    best = [""] * n
    order = np.argsort(med[mask], kind="stable")
    labels = label_of_item[mask]
    for pos in order:
        best[idx[pos]] = label_names[labels[pos]]
    return tuple(
        LayerTimeEstimate(
            name=layer.name, op_type=layer.op_type, family=layer.family.value,
            forward_ms=float(fwd[i]), backward_ms=float(bwd[i]), p10_ms=float(lo[i]),
            p90_ms=float(hi[i]), predictor=best[i] or "none",
        )
        for i, layer in enumerate(layers)
    )


def compiled_saving_ms(r: DeviceStepEstimate) -> float | None:
    """What a compiled step would save at most: the time the GPU waits for the host, which a
    step captured in CUDA graphs (torch.compile's "reduce-overhead") no longer issues op by op.
    Kernel fusion would save more; Inductor's default mode, which still launches each kernel
    from the host, less (GPT-2 small, batch 4, bf16 on an H200: 48.8 ms eager, 24.5 compiled
    with the host still issuing 23.8). None without a host model."""
    if r.host_ms is None:
        return None
    return max(0.0, r.step_time_ms - r.gpu_busy_ms)


def bound_of(r: DeviceStepEstimate) -> str:
    """"host", "gpu" or "unknown" (no host model priced the step)."""
    if r.host_ms is None:
        return "unknown"
    return "host" if r.host_bound else "gpu"


@dataclass(frozen=True)
class _HostCosts:
    """Each plan row's issue cost on the host, and what priced it."""

    row_us: npt.NDArray[np.float64]
    model: host.HostModel


def _on_two_clocks(device: DeviceSpec, hosts: _HostCosts | None) -> bool:
    """Whether the step is priced on the host's clock and the GPU stream's (`step.host`)."""
    return hosts is not None and device.vendor != "cpu"


def _on_stream(predictor: LatencyPredictor, device: DeviceSpec, labels: Sequence[str],
               *latencies_ms: npt.NDArray[np.float64]) -> list[npt.NDArray[np.float64]]:
    """Each per-row latency array as `device`'s stream spends it (`host.on_stream`): rows a
    bundle model priced (`labels`) less the dispatch their timing held."""
    priced = learned.model_priced(labels)
    timing = learned.kernel_timing(predictor, device)
    return [host.on_stream(values, priced, timing) for values in latencies_ms]


def bundle_host_model(predictor: LatencyPredictor) -> host.HostModel | None:
    """The host model the predictor's bundle ships (its manifest's `host_model`), if any."""
    manifest = getattr(getattr(predictor, "bundle", None), "manifest", None)
    doc = manifest.get(host.MANIFEST_KEY) if isinstance(manifest, Mapping) else None
    return host.model_from_json(doc) if isinstance(doc, Mapping) else None


def bundle_step_sigma(predictor: LatencyPredictor) -> intervals.StepSigma | None:
    """The step-level spread the predictor's bundle ships (`intervals.STEP_SIGMA_KEY`), if any."""
    manifest = getattr(getattr(predictor, "bundle", None), "manifest", None)
    return intervals.manifest_step_sigma(manifest) if isinstance(manifest, Mapping) else None


def _device_host_costs(graph: ModelGraph, plan: _Plan, settings: TrainingSettings,
                       model: host.HostModel | None, devices: Sequence[DeviceSpec],
                       probes: Mapping[str, host.HostProbe]) -> dict[str, _HostCosts | None]:
    """Issue costs per device key: `model`, with the device's own probe where one is given
    (a probe alone prices nothing: without `model` there are no coefficients to apply)."""
    by_model: dict[host.HostModel | None, _HostCosts | None] = {}
    out = {}
    for device in devices:
        probe = probes.get(device.key)
        own = model if model is None or probe is None else dataclasses.replace(model,
                                                                                probe=probe)
        if own not in by_model:  # devices sharing a probe share the per-item pass
            by_model[own] = _host_costs(graph, plan, settings, own)
        out[device.key] = by_model[own]
    return out


def _host_costs(graph: ModelGraph, plan: _Plan, settings: TrainingSettings,
                model: host.HostModel | None) -> _HostCosts | None:
    """Issue costs per plan row: a shape-only or folded item's cost goes to the next kernel
    (the host issues it on the way there)."""
    if model is None or settings.framework != options.PYTORCH_EAGER:
        return None
    items = plan.step.items
    per_item = model.item_host_us(items, settings.precision, graph.parameter_tensor_count,
                                  optimizer_impl=settings.optimizer_impl,
                                  training=settings.training)
    rows = np.bincount(plan.item_row, weights=per_item, minlength=len(plan.phase))
    return _HostCosts(rows.astype(np.float64), model)


def _on_host(r: DeviceStepEstimate, plan: _Plan, med: npt.NDArray[np.float64], device: DeviceSpec,
             hosts: _HostCosts | None) -> DeviceStepEstimate:
    """`r` priced on two clocks: phase times as events read them, its interval moved with
    them (the kernels' relative spread, and the host's at the same quantiles)."""
    busy = r.forward_ms + r.backward_ms + r.optimizer_ms
    if hosts is None or device.vendor == "cpu" or not len(plan.phase):
        return dataclasses.replace(r, gpu_busy_ms=busy)
    latency_ms = hosts.model.probe.launch_latency_us / 1000.0
    mid = host.timeline(med, hosts.row_us, plan.phase, latency_ms)
    spread = hosts.model.coefficients.log_sigma * Z90

    def moved(interval: tuple[float, float], total: float, phases: int) -> tuple[float, float]:
        low_ratio = interval[0] / total if total > 0 else 1.0
        high_ratio = interval[1] / total if total > 0 else 1.0
        low = host.timeline(med * low_ratio, hosts.row_us * np.exp(-spread), plan.phase,
                            latency_ms)
        high = host.timeline(med * high_ratio, hosts.row_us * np.exp(spread), plan.phase,
                             latency_ms)
        return (float(sum(low.device_ms[:phases])), float(sum(high.device_ms[:phases])))

    forward, backward, optimizer = mid.device_ms
    step_ms = mid.step_ms
    return dataclasses.replace(
        r, forward_ms=forward, backward_ms=backward, optimizer_ms=optimizer,
        step_time_ms=step_ms,
        interval_ms=_around(moved(r.interval_ms, busy, 3), step_ms),
        forward_backward_interval_ms=_around(
            moved(r.forward_backward_interval_ms, r.forward_ms + r.backward_ms, 2),
            forward + backward),
        epoch_seconds=(r.steps_per_epoch * step_ms / 1000.0
                       if r.steps_per_epoch is not None else None),
        total_seconds=(r.total_seconds * step_ms / r.step_time_ms
                       if r.total_seconds is not None and r.step_time_ms > 0 else None),
        gpu_busy_ms=busy, host_ms=float(sum(mid.host_ms)), host_bound=mid.host_bound,
        host_source=hosts.model.probe.source)
