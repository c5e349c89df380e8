"""Roofline baseline: a kernel takes max(FLOPs / peak, bytes / bandwidth) plus a launch floor.

The always-available predictor and the prior the learned models are measured against. It is an
optimistic bound: NeuSight (ASPLOS'25) reports plain roofline ~31 % off on GPT-class training.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType

import numpy as np
import numpy.typing as npt

from gpuplan_estimator.core import errors, kernels, workload
from gpuplan_estimator.core.workload import WorkItem
from gpuplan_estimator.cost.predictors import FloatArray, LatencyPrediction
from gpuplan_estimator.devices import catalog
from gpuplan_estimator.devices.catalog import DeviceSpec

# Peak to use per dtype, in order of preference. Why each fallback:
# - float32 uses the SIMT fp32 rate, not tf32: PyTorch leaves TF32 matmul off by default and the
#   shared gpu-ops data was measured that way. Ask for "tf32" explicitly to get tensor cores.
# - fp16/bf16 without a tensor-core path (P4, bf16 before Ampere) run at about the fp32 rate:
#   cuBLAS computes them with fp32 math (P4's native fp16 rate is 1/64 and is never used).
# - fp8 without fp8 tensor cores is upcast and runs as fp16 (or bf16) matmul.
# - Integer kernels (indices, masks) issue on the same ALUs as fp32 since Volta.
# - float64 has no fallback: an fp64 rate is 2x to 64x below fp32, so guessing would mislead.
_PEAK_ORDER: Mapping[str, tuple[str, ...]] = MappingProxyType({
    "float64": ("fp64",), "fp64": ("fp64",),
    "float32": ("fp32",), "fp32": ("fp32",),
    "tf32": ("tf32", "fp32"),
    "float16": ("fp16", "fp32"), "fp16": ("fp16", "fp32"),
    "bfloat16": ("bf16", "fp32"), "bf16": ("bf16", "fp32"),
    "float8": ("fp8", "fp16", "bf16", "fp32"), "fp8": ("fp8", "fp16", "bf16", "fp32"),
    **{t: ("fp32",) for t in ("int64", "int32", "int16", "int8", "uint8", "bool")},
})


@dataclass(frozen=True)
class RooflineSettings:
    """Knobs of the roofline; validated on construction."""

    launch_floor_ms: float = 0.005
    """Minimum time of one kernel. 5 us is the order of a CUDA or HIP kernel launch plus the
    shortest kernel's run (NVIDIA and AMD alike), and of onnxruntime's per-op dispatch on CPU.
    PyTorch eager adds its own ~20 us per op (the gpu-ops floor of ~0.025 ms); the learned models
    capture that, the roofline stays a lower bound."""
    efficiency: float = 1.0
    """Fraction of the peak FLOP/s and bandwidth assumed reachable (0 < efficiency <= 1)."""

    def __post_init__(self) -> None:
        if not self.launch_floor_ms >= 0.0:
            raise errors.InvalidRequestError("launch_floor_ms", "must be >= 0")
        if not 0.0 < self.efficiency <= 1.0:
            raise errors.InvalidRequestError("efficiency", "must be in (0, 1]")


def peak_flops_per_s(device: DeviceSpec, dtype: str) -> float:
    """Peak FLOP/s of `device` for a compute dtype (a `layers.DTYPE_BYTES` key or fp32/tf32/...).

    Falls back along `_PEAK_ORDER` when the device has no rate for the dtype; raises
    `InvalidRequestError` for an unknown dtype or when no fallback exists.
    """
    order = _PEAK_ORDER.get(dtype)
    if order is None:
        raise errors.InvalidRequestError("dtype", f"unknown dtype {dtype!r}")
    for key in order:
        tflops = device.peak_tflops.get(key)
        if tflops is not None and tflops > 0:
            return float(tflops) * 1e12
    raise errors.InvalidRequestError(
        "dtype", f"device {device.key!r} has no peak for {dtype!r} (tried {', '.join(order)})"
    )


_FP32_DTYPES = frozenset({"float32", "fp32"})


def item_peak_flops_per_s(device: DeviceSpec, dtype: str, kernel: str, math: str) -> float:
    """Peak FLOP/s one work item can reach: its dtype's, with two corrections.

    - ``math == "tf32"`` ("" for none; `step.backward.math_attributes`: float32 gemm/conv under
      ``--precision tf32``) uses the tf32 tensor-core peak.
    - Other float32 work off the matrix units (elementwise, reductions, norms; and every fp32
      kernel on NVIDIA, whose catalog fp32 is the SIMT rate) runs at the vector rate: on AMD CDNA
      that is half the MFMA figure in `peak_tflops.fp32` (`catalog.simt_fp32_tflops`).
    """
    if math == "tf32" and dtype in _FP32_DTYPES:
        return peak_flops_per_s(device, "tf32")
    if dtype in _FP32_DTYPES and kernel not in kernels.MATRIX_KERNELS and device.vendor != "cpu":
        return catalog.simt_fp32_tflops(device) * 1e12
    return peak_flops_per_s(device, dtype)


def matrix_peak_flops_per_s(device: DeviceSpec, items: Sequence[WorkItem],
                            precision: str) -> float:
    """The peak a step's matrix FLOPs can reach together: the FLOP-weighted harmonic mean of
    each GEMM's and convolution's own peak (`item_peak_flops_per_s`), so the step's matrix work
    at that rate takes as long as each item at its own; `precision`'s peak when the step has
    none (or runs where every item shares one rate)."""
    flops = 0.0
    seconds = 0.0
    peaks: dict[tuple[str, str, str], float] = {}
    for item in items:
        if item.kernel not in kernels.MATRIX_KERNELS or item.flops <= 0:
            continue
        key = (item.dtype, item.kernel, str(item.attributes.get("math", "")))
        if key not in peaks:
            peaks[key] = item_peak_flops_per_s(device, *key)
        flops += item.flops * item.count
        seconds += item.flops * item.count / peaks[key]
    return flops / seconds if seconds > 0 else peak_flops_per_s(device, precision)


def _bytes_per_s(device: DeviceSpec) -> float:
    if not device.mem_bandwidth_gbps > 0:
        raise errors.InvalidRequestError("device", f"{device.key!r} has no memory bandwidth")
    return device.mem_bandwidth_gbps * 1e9


def roofline_ms(
    flops: float, bytes_moved: float, dtype: str, device: DeviceSpec,
    *, settings: RooflineSettings = RooflineSettings(),
) -> float:
    """max(flops / peak(dtype), bytes / bandwidth) / efficiency + launch floor, in ms."""
    compute_s = flops / peak_flops_per_s(device, dtype)
    memory_s = bytes_moved / _bytes_per_s(device)
    return max(compute_s, memory_s) / settings.efficiency * 1e3 + settings.launch_floor_ms


def fused_io_factors(items: Sequence[WorkItem], device: DeviceSpec,
                     settings: RooflineSettings = RooflineSettings()
                     ) -> tuple[npt.NDArray[np.intp], FloatArray]:
    """Items that move fewer bytes inside a fused kernel (`workload.FUSED_IO_BYTES`): their
    indices and roofline(fused bytes) / roofline(their own bytes) on `device`, the factor a
    price of the unfused kernel takes (same efficiency against its own roofline)."""
    idx = [i for i, it in enumerate(items) if workload.FUSED_IO_BYTES in it.attributes]
    if not idx:
        return np.zeros(0, dtype=np.intp), np.zeros(0)
    chosen = [items[i] for i in idx]
    flops = np.array([float(it.flops) for it in chosen])
    own = np.array([float(it.bytes_moved) for it in chosen])
    fused = np.array([float(it.attributes[workload.FUSED_IO_BYTES]) for it in chosen])
    peak = np.array([item_peak_flops_per_s(device, it.dtype, it.kernel,
                                           str(it.attributes.get("math", ""))) for it in chosen])
    per_s = _bytes_per_s(device)
    factor = (roofline_ms_array(flops, np.minimum(fused, own), peak, per_s, settings)
              / roofline_ms_array(flops, own, peak, per_s, settings))
    return np.asarray(idx, dtype=np.intp), factor


def roofline_ms_array(
    flops: FloatArray, bytes_moved: FloatArray, peak_flops: FloatArray, bytes_per_s: float,
    settings: RooflineSettings,
) -> FloatArray:
    """Vectorised `roofline_ms` over items whose peaks are already looked up."""
    seconds = np.maximum(flops / peak_flops, bytes_moved / bytes_per_s) / settings.efficiency
    return seconds * 1e3 + settings.launch_floor_ms


class RooflinePredictor:
    """`predictors.LatencyPredictor` from spec-sheet peaks; no interval (p10 = p90 = median)."""

    name = "roofline"

    def __init__(self, settings: RooflineSettings = RooflineSettings()) -> None:
        self.settings = settings

    def predict(self, items: Sequence[WorkItem], device: DeviceSpec) -> LatencyPrediction:
        """max(FLOPs / peak, bytes / bandwidth) plus the launch floor, per item; P10 = P90."""
        n = len(items)
        flops = np.fromiter((it.flops for it in items), dtype=np.float64, count=n)
        # Inside a fused kernel an item moves only what leaves the chip.
        moved = np.fromiter((float(it.attributes.get(workload.FUSED_IO_BYTES, it.bytes_moved))
                             for it in items), dtype=np.float64, count=n)
        # Shape-only work (metadata reshapes, Shape ops) launches no kernel, whatever its dtype.
        shape_only = np.fromiter((it.kernel == kernels.FREE_KERNEL for it in items),
                                 dtype=bool, count=n)
        keys = [(it.dtype, it.kernel, str(it.attributes.get("math", ""))) for it in items]
        peaks = {  # few distinct (dtype, kernel, math), so look each up once
            key: item_peak_flops_per_s(device, *key)
            for key in {k for k, none in zip(keys, shape_only, strict=True) if not none}
        }
        peak = np.fromiter((peaks.get(k, 1.0) for k in keys), dtype=np.float64, count=n)
        median = roofline_ms_array(flops, moved, peak, _bytes_per_s(device), self.settings)
        median[shape_only] = 0.0
        return LatencyPrediction(
            median_ms=median, p10_ms=median.copy(), p90_ms=median.copy(),
            predictor=(self.name,) * n,
        )
