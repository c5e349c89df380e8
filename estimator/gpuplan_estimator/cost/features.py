"""Pure feature building: kernel dims + device specs → numeric rows for the latency models.

Training rows (measurement frame) and inference rows (work items) both go through
`feature_matrix`, so the two can never disagree. Everything is vectorised over numpy columns:
pricing ~10k work items on 20 devices must stay well under a second.

The target the models learn is ``log(latency_ms / base_ms)`` where ``base_ms`` is a roofline
bound plus a launch floor (`base_ms`); efficiency transfers across GPUs, magnitudes do not.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType

import numpy as np
import numpy.typing as npt

from gpuplan_estimator.core import errors, kernels
from gpuplan_estimator.core.layers import DTYPE_BYTES
from gpuplan_estimator.core.vocabulary import CAST_OP
from gpuplan_estimator.core.workload import GRADIENT_OP_SUFFIX, WorkItem
from gpuplan_estimator.cost import roofline, tiling
from gpuplan_estimator.devices.catalog import DeviceSpec

FEATURE_SCHEMA_VERSION = "6"

FloatArray = npt.NDArray[np.float64]

KERNEL_DIMS: Mapping[str, tuple[str, ...]] = MappingProxyType(kernels.kernel_dims())
"""Canonical dims per kernel family (`core.kernels`); a missing key is an error, never a
silent 0."""

# Fixed vocabulary so op codes mean the same thing in every bundle of this schema version.
ELEMENTWISE_OPS: tuple[str, ...] = (
    "add", "sub", "mul", "div", "pow", "relu", "gelu", "tanh", "sigmoid", "exp", "log",
    "sqrt", "neg", "abs", "erf", "where", CAST_OP, "clip", "max", "min", "other", "lrn",
)
# Tensor-scalar variants of the shared gpu-ops data (addu = X + r) share the op's code; the
# `operands` dim tells them apart.
# A Concat (`opcost`: one contiguous copy) reads and writes each element once like Relu.
# The optimizer's fused arithmetic (`decomposition.OPTIMIZER_PASSES`) and a reduction's
# broadcast gradient ("expand") take the code of the arithmetic they do; their `operands` carry
# the extra reads. A gradient ("relu_grad") takes its op's code: it redoes the op's math on dY
# and the saved input. None of them falls to "other": codes are ordinal, "other" sits beside
# "lrn", and on a GPU whose rows hold LRN's windowed kernel the trees would price them alike.
_OP_ALIASES = {"addu": "add", "subu": "sub", "mulu": "mul", "divu": "div", "powu": "pow",
               "LRN": "lrn", "Concat": "relu", "lerp": "add", "addcmul": "mul",
               "addcdiv": "div", "expand": "relu", "fused_sgd": "add", "fused_adam": "div",
               "fused_adamw": "div", "fused_adagrad": "div"}
WINDOWED_OPS = frozenset({"lrn", "LRN"})
"""Elementwise ops that read a window of neighbours per element (`training.fitting` keeps
their GPU rows out of the elementwise model)."""
_OP_BASE_CODE = {op: float(i) for i, op in enumerate(ELEMENTWISE_OPS)} | {
    alias: float(ELEMENTWISE_OPS.index(op)) for alias, op in _OP_ALIASES.items()}
_OP_CODE = _OP_BASE_CODE | {
    f"{op}{GRADIENT_OP_SUFFIX}": code for op, code in _OP_BASE_CODE.items() if op != "other"}
# Pooling: onnxruntime's CPU AveragePool runs 30-100x slower per element than MaxPool (CPU rows
# of data/cpu-measurements), so the op must be a feature. Bench names and ONNX op types share codes.
_POOL_OP_CODE = {"maxpool": 0.0, "MaxPool": 0.0, "GlobalMaxPool": 0.0, "avgpool": 1.0,
                 "AveragePool": 1.0, "GlobalAveragePool": 1.0, "other": 2.0}
# Transcendentals cost several FLOPs per element; the rest one.
_OP_FLOPS = {"pow": 8.0, "powu": 8.0, "gelu": 8.0, "tanh": 6.0, "sigmoid": 4.0, "exp": 4.0,
             "log": 4.0, "erf": 6.0, "sqrt": 2.0, "lrn": 13.0, "LRN": 13.0}

# dtype → key of DeviceSpec.peak_tflops. Integer kernels run on the FP32 ALUs' issue slots.
PEAK_KEY = {"float64": "fp64", "float32": "fp32", "float16": "fp16", "bfloat16": "bf16",
             "float8": "fp8", "int64": "fp32", "int32": "fp32", "int16": "fp32",
             "int8": "fp32", "uint8": "fp32", "bool": "fp32"}

# One eager kernel launch + sync costs ~0.025 ms on every GPU of the shared data (its README);
# onnxruntime's CPU session.run overhead is a few microseconds.
LAUNCH_FLOOR_MS = {"gpu": 0.02, "cpu": 0.004}

# Output tile shapes of common SIMT sgemm kernels (the kernel names in the shared data).
_TILES = ((128, 64), (32, 32))
_THREADS_PER_SM = 2048.0

DEVICE_FEATURES: tuple[str, ...] = (
    "dev_log_peak_gflops", "dev_log_bw_gbps", "dev_sm_count", "dev_clock_mhz", "dev_l2_mb",
    "dev_log_mem_gb", "dev_cores_per_sm", "dev_log_ridge", "dev_is_cpu", "backend",
)
WORK_FEATURES: tuple[str, ...] = (
    "log_flops", "log_bytes", "log_intensity", "log_intensity_over_ridge", "log_compute_ms",
    "log_memory_ms", "log_base_ms", "dtype_bytes", "log_flops_per_sm", "log_bytes_per_l2",
)

# What a model for a GPU it never saw may use: shapes, device-relative cost and the base.
# Absolute spec features (and times on one device's scale) let trees memorise the training GPUs:
# leaving one GPU out, a model with them erred 2-5x more on softmax/elementwise/layernorm than
# one without (docs/latency-method.md), so unseen devices get this "transfer" model instead.
TRANSFER_EXCLUDED: frozenset[str] = frozenset({
    "dev_log_peak_gflops", "dev_log_bw_gbps", "dev_sm_count", "dev_clock_mhz", "dev_l2_mb",
    "dev_log_mem_gb", "dev_cores_per_sm", "dev_log_ridge", "log_compute_ms", "log_memory_ms",
    "log_intensity_over_ridge", "log_flops_per_sm", "log_bytes_per_l2", "log_rows_per_sm",
    "log_elems_per_thread",
})


def transfer_columns(kernel: str) -> npt.NDArray[np.intp]:
    """Column indices of `feature_names(kernel)` the transfer model sees."""
    names = feature_names(kernel)
    return np.array([i for i, n in enumerate(names) if n not in TRANSFER_EXCLUDED], dtype=np.intp)


# Transfer structures a bundle can be trained with (`TrainSettings.transfer_kind`):
# - "roofline": target over the device roofline + floor, on `transfer_columns`.
# - "tiled": target over the tile-and-wave time (`tiling`) + floor, i.e. the learned term is a
#   utilisation of the structure; features are shape and structure ratios only. Times in ms,
#   the L2 ratio and SM-dependent wave counts are left out too: with four training GPUs any
#   of them lets trees tell the GPUs apart and memorise them.
# - "tiled-gemm": "tiled" for gemm (matmuls and attention's batched matmuls), "roofline" for the
#   rest: per op family leaving one GPU out, the tiled structure lowered gemm's mean MAPE
#   (26.6 -> 25.6 %) but raised conv2d's (19.5 -> 21.0 %), softmax's and elementwise's
#   (docs/latency-method.md).
TRANSFER_KINDS: tuple[str, ...] = ("roofline", "tiled", "tiled-gemm")
_TILED_IN_TILED_GEMM: frozenset[str] = frozenset({"gemm"})
_TILED_EXCLUDED: frozenset[str] = frozenset({
    "log_base_ms", "log_waves_128x64", "tail_fill_128x64", "log_waves_32x32", "tail_fill_32x32",
    "log_waves_elem",
})
_TILED_PLAN_EXCLUDED: frozenset[str] = frozenset({"t_log_struct_ms", "t_log_ws_over_l2"})


def kernel_transfer_kind(kernel: str, kind: str) -> str:
    """The structure `kernel`'s transfer model has in a bundle of transfer `kind`."""
    if kind not in TRANSFER_KINDS:
        raise errors.InvalidRequestError(
            "transfer_kind",
            f"unknown transfer kind {kind!r}; one of {', '.join(TRANSFER_KINDS)}")
    if kind == "tiled-gemm":
        return "tiled" if kernel in _TILED_IN_TILED_GEMM else "roofline"
    return kind


def transfer_feature_names(kernel: str, kind: str) -> tuple[str, ...]:
    """Column names of the transfer model of `kind` (`transfer_matrix`)."""
    kind = kernel_transfer_kind(kernel, kind)
    names = feature_names(kernel)
    if kind == "roofline":
        return tuple(names[i] for i in transfer_columns(kernel))
    return (*(n for n in names if n not in TRANSFER_EXCLUDED | _TILED_EXCLUDED),
            *(n for n in tiling.TRANSFER_FEATURES if n not in _TILED_PLAN_EXCLUDED))


@dataclass(frozen=True)
class WorkColumns:
    """Work items of ONE kernel as columns: ``dims[name]`` is an int array per canonical dim."""

    kernel: str
    dims: Mapping[str, npt.NDArray[np.int64]]
    dtype: npt.NDArray[np.str_]
    op: npt.NDArray[np.str_]
    math: npt.NDArray[np.str_] | None = None
    """Per row, the math mode asked of a float32 kernel ("tf32"; `step.backward.math_attributes`),
    "" for none; None when no row has one (every measurement row)."""

    def __len__(self) -> int:
        return len(self.dtype)


@dataclass(frozen=True)
class DeviceColumns:
    """Per-row device facts (one device broadcast, or many for cross-device training)."""

    peak_gflops: FloatArray  # for the row's dtype
    bw_gbps: FloatArray
    sm_count: FloatArray
    clock_mhz: FloatArray
    l2_mb: FloatArray
    mem_gb: FloatArray
    cores_per_sm: FloatArray
    is_cpu: FloatArray
    backend_code: FloatArray


def feature_names(kernel: str) -> tuple[str, ...]:
    """Column names of `kernel`'s feature matrix: device, work, then kernel-specific."""
    return DEVICE_FEATURES + WORK_FEATURES + _kernel_feature_names(kernel)


def transfer_matrix(
    cols: WorkColumns, dev: DeviceColumns, x: FloatArray, base: FloatArray, kind: str
) -> tuple[FloatArray, FloatArray]:
    """The transfer model's features (`transfer_feature_names`) and normaliser (ms) per row,
    from the full `feature_matrix` (`x`, `base`) of the same rows. For "tiled" the normaliser
    is the tile-and-wave time (`tiling`) plus the launch floor, so the learned term is a
    utilisation of that structure and a GPU no row was measured on enters through its SMs,
    per-SM peaks and L2."""
    names = feature_names(cols.kernel)
    kind = kernel_transfer_kind(cols.kernel, kind)
    if kind == "roofline":
        return x[:, transfer_columns(cols.kernel)], base
    wanted = transfer_feature_names(cols.kernel, kind)  # validates the kind
    flops, nbytes = work_cost(cols)
    roof_ms = np.maximum(flops / (dev.peak_gflops * 1e6), nbytes / (dev.bw_gbps * 1e6))
    plan = structure(cols, dev, flops, nbytes)
    by_name = dict(zip(tiling.TRANSFER_FEATURES,
                       tiling.plan_features(plan, dev.l2_mb, roof_ms), strict=True))
    index = {n: i for i, n in enumerate(names)}
    x_t = np.column_stack([x[:, index[n]] if n in index else by_name[n] for n in wanted])
    floor = np.where(dev.is_cpu > 0, LAUNCH_FLOOR_MS["cpu"], LAUNCH_FLOOR_MS["gpu"])
    return x_t.astype(np.float64), plan["time_ms"] + floor


# Utilisation of the tile-and-wave time is at most 1 by construction, except where the library
# does less work than the direct formula counts: cuDNN's Winograd/FFT convs run up to about 2x
# the direct-conv FLOP rate on the shared data (its README), so conv2d gets headroom.
MAX_UTILISATION: Mapping[str, float] = {"conv2d": 2.5}


def bounded_log_ratio(kernel: str, log_ratio: FloatArray, kind: str) -> FloatArray:
    """A transfer model's predicted log(latency / transfer base), kept where utilisation
    (base / latency) is at most `MAX_UTILISATION` (1 unless listed) for the "tiled" kind."""
    if kernel_transfer_kind(kernel, kind) != "tiled":
        return log_ratio
    return np.maximum(log_ratio, -np.log(MAX_UTILISATION.get(kernel, 1.0)))


def columns_from_items(kernel: str, items: Sequence[WorkItem]) -> WorkColumns:
    """Gather the dims of same-kernel items into arrays; names the item with a missing dim."""
    keys = _dim_keys(kernel)
    rows = np.empty((len(items), len(keys)), dtype=np.int64)
    for i, item in enumerate(items):
        try:
            rows[i] = [item.dims[k] for k in keys]
        except KeyError as exc:
            raise errors.InvalidRequestError(
                f"{item.layer}.dims", f"{kernel} work item lacks dim {exc.args[0]!r}"
            ) from None
    dims = {k: rows[:, j] for j, k in enumerate(keys)}
    dtype = np.array([it.dtype for it in items], dtype=np.str_)
    op = np.array([it.op for it in items], dtype=np.str_)
    math = np.array([str(it.attributes.get("math", "")) for it in items], dtype=np.str_)
    return WorkColumns(kernel, dims, dtype, op, math)


def device_columns(
    specs: Sequence[DeviceSpec], dtypes: Sequence[str] | npt.NDArray[np.str_],
    backend_codes: Sequence[int] | FloatArray, kernel: str = "",
    math: npt.NDArray[np.str_] | None = None,
) -> DeviceColumns:
    """Row-aligned device facts: ``specs[i]`` ran row i of `kernel` in ``dtypes[i]`` (with
    ``math[i]``, "" for none, as `broadcast_device` reads it)."""
    return DeviceColumns(
        peak_gflops=_peak_column(specs, dtypes, math, kernel),
        bw_gbps=np.array([s.mem_bandwidth_gbps for s in specs], dtype=np.float64),
        sm_count=np.array([s.sm_count for s in specs], dtype=np.float64),
        clock_mhz=np.array([s.boost_clock_mhz for s in specs], dtype=np.float64),
        l2_mb=np.array([s.l2_cache_mb for s in specs], dtype=np.float64),
        mem_gb=np.array([s.memory_bytes / 1e9 for s in specs], dtype=np.float64),
        cores_per_sm=np.array([s.cores_per_sm for s in specs], dtype=np.float64),
        is_cpu=np.array([1.0 if s.vendor == "cpu" else 0.0 for s in specs]),
        backend_code=np.asarray(backend_codes, dtype=np.float64),
    )


def broadcast_device(
    spec: DeviceSpec, dtypes: npt.NDArray[np.str_], backend_code: int, kernel: str = "",
    math: npt.NDArray[np.str_] | None = None,
) -> DeviceColumns:
    """One device for all rows of `kernel` (the peak column as `device_columns` builds it)."""
    n = len(dtypes)
    peaks = _peak_column([spec] * n, dtypes, math, kernel)

    def full(v: float) -> FloatArray:
        return np.full(n, float(v))

    return DeviceColumns(
        peak_gflops=peaks.reshape(n), bw_gbps=full(spec.mem_bandwidth_gbps),
        sm_count=full(spec.sm_count), clock_mhz=full(spec.boost_clock_mhz),
        l2_mb=full(spec.l2_cache_mb), mem_gb=full(spec.memory_bytes / 1e9),
        cores_per_sm=full(spec.cores_per_sm), is_cpu=full(1.0 if spec.vendor == "cpu" else 0.0),
        backend_code=full(backend_code),
    )


def _peak_column(specs: Sequence[DeviceSpec], dtypes: Sequence[str] | npt.NDArray[np.str_],
                 math: npt.NDArray[np.str_] | None, kernel: str) -> FloatArray:
    """`peak_gflops` per row, looked up once per distinct (device, dtype, math)."""
    maths = [""] * len(specs) if math is None else np.asarray(math).tolist()
    by_id = {id(spec): spec for spec in specs}  # a spec holds dicts, so it is keyed by identity
    keys = list(zip(map(id, specs), np.asarray(dtypes).tolist(), maths, strict=True))
    looked = {k: peak_gflops(by_id[k[0]], k[1], k[2], kernel=kernel) for k in set(keys)}
    return np.array([looked[k] for k in keys], dtype=np.float64).reshape(len(keys))


def peak_gflops(spec: DeviceSpec, dtype: str, math: str = "", *, kernel: str = "") -> float:
    """The device's peak GFLOP/s for `dtype` (from its spec sheet, or its measured CPU peak).

    float32 reads what the roofline reads (`roofline.item_peak_flops_per_s`): the tf32 tensor
    cores for gemm/conv under ``math == "tf32"``, AMD's vector rate off the matrix units. Every
    measured fp32 row without a math mode keeps its inputs; a tf32 row of the bench (dim
    `math_tf32` = 1, `training.fitting`) is normalised by the tf32 peak, so `--precision tf32`
    moves the learned estimate as it moves the roofline, as fp16 does."""
    if dtype == "float32":
        return roofline.item_peak_flops_per_s(spec, dtype, kernel, math) / 1e9
    key = PEAK_KEY.get(dtype)
    if key is None:
        raise errors.InvalidRequestError("dtype", f"unknown dtype {dtype!r}")
    tflops = spec.peak_tflops.get(key) or spec.peak_tflops.get("fp32")
    if not tflops:
        raise errors.InvalidRequestError(
            "device.peak_tflops", f"{spec.key} has no peak for {key} (nor fp32)"
        )
    return float(tflops) * 1000.0


def work_cost(cols: WorkColumns) -> tuple[FloatArray, FloatArray]:
    """FLOPs and bytes moved per row, from dims (the same formula for training and inference)."""
    d = {k: v.astype(np.float64) for k, v in cols.dims.items()}
    b = _map_str(cols.dtype, DTYPE_BYTES, None)
    k = cols.kernel
    if k == "gemm":
        flops = 2 * d["batch"] * d["m"] * d["k"] * d["n"] + d["bias"] * d["batch"] * d["m"] * d["n"]
        elems = d["batch"] * (d["m"] * d["k"] + d["k"] * d["n"] + d["m"] * d["n"])
    elif k == "conv2d":
        oh, ow = _conv_out(d)
        cin_g = d["c_in"] / np.maximum(d["groups"], 1)
        flops = 2 * d["batch"] * d["c_out"] * oh * ow * cin_g * d["kernel_h"] * d["kernel_w"]
        elems = (d["batch"] * d["c_in"] * d["h"] * d["w"]
                 + d["c_out"] * cin_g * d["kernel_h"] * d["kernel_w"]
                 + d["batch"] * d["c_out"] * oh * ow)
    elif k == "pool":
        oh = np.floor((d["h"] - d["kernel_h"]) / np.maximum(d["stride_h"], 1)) + 1
        ow = np.floor((d["w"] - d["kernel_w"]) / np.maximum(d["stride_w"], 1)) + 1
        out = d["batch"] * d["channels"] * np.maximum(oh, 1) * np.maximum(ow, 1)
        flops = out * d["kernel_h"] * d["kernel_w"]
        elems = d["batch"] * d["channels"] * d["h"] * d["w"] + out
    elif k in ("layernorm", "batchnorm", "softmax", "reduce"):
        n = d["rows"] * d["cols"]
        flops = {"layernorm": 8.0, "batchnorm": 4.0, "softmax": 5.0, "reduce": 1.0}[k] * n
        elems = n + (d["rows"] if k == "reduce" else n) + 2 * d["cols"] * (k != "softmax")
    elif k == "elementwise":
        n = d["rows"] * d["cols"]
        flops = _map_str(cols.op, _OP_FLOPS, 1.0) * n
        elems = n * (d["operands"] + 1)
    elif k == "memcpy":
        flops = np.zeros(len(cols))
        elems = 2 * d["elements"]
    else:
        raise errors.InvalidRequestError("kernel", f"no feature definition for kernel {k!r}")
    return np.maximum(flops, 0.0), np.maximum(elems * b, 1.0)


def base_ms(cols: WorkColumns, dev: DeviceColumns) -> FloatArray:
    """Roofline bound plus launch floor: the normaliser of the learned target."""
    flops, nbytes = work_cost(cols)
    return _base_from_cost(flops, nbytes, dev)


def feature_matrix(cols: WorkColumns, dev: DeviceColumns) -> tuple[FloatArray, FloatArray]:
    """Features (rows × `feature_names(kernel)`) and base_ms per row."""
    flops, nbytes = work_cost(cols)
    compute_ms = flops / (dev.peak_gflops * 1e6)
    memory_ms = nbytes / (dev.bw_gbps * 1e6)
    base = _base_from_cost(flops, nbytes, dev)
    ridge = dev.peak_gflops / dev.bw_gbps
    intensity = np.maximum(flops, 1.0) / nbytes
    sms = np.maximum(dev.sm_count, 1.0)
    device_part = [
        np.log2(dev.peak_gflops), np.log2(dev.bw_gbps), dev.sm_count, dev.clock_mhz,
        dev.l2_mb, np.log2(np.maximum(dev.mem_gb, 1e-3)), dev.cores_per_sm, np.log2(ridge),
        dev.is_cpu, dev.backend_code,
    ]
    work_part = [
        _log(flops), _log(nbytes), np.log2(intensity), np.log2(intensity / ridge),
        _log(compute_ms), _log(memory_ms), _log(base),
        _map_str(cols.dtype, DTYPE_BYTES, None),
        _log(flops / sms), _log(nbytes / (np.maximum(dev.l2_mb, 1e-3) * 1e6)),
    ]
    kernel_part = _kernel_features(cols, dev)
    x = np.column_stack([*device_part, *work_part, *kernel_part]).astype(np.float64)
    return x, base


_ROW_WISE = frozenset({"layernorm", "batchnorm", "softmax", "reduce"})


def structure(cols: WorkColumns, dev: DeviceColumns, flops: FloatArray, nbytes: FloatArray
              ) -> dict[str, FloatArray]:
    """The tile-and-wave plan of each row (`tiling`): GEMM-shaped kernels (gemm, conv2d as
    implicit GEMM) by output tiles, the rest as streaming blocks or rows."""
    d = {k: v.astype(np.float64) for k, v in cols.dims.items()}
    sms = np.maximum(dev.sm_count, 1.0)
    common = {"peak_gflops": dev.peak_gflops, "bw_gbps": dev.bw_gbps, "sms": sms,
              "l2_mb": dev.l2_mb, "clock_mhz": dev.clock_mhz}
    k = cols.kernel
    if k in kernels.MATRIX_KERNELS:
        if k == "gemm":
            batch, m, kk, n = d["batch"], d["m"], d["k"], d["n"]
        else:
            oh, ow = _conv_out(d)
            groups = np.maximum(d["groups"], 1.0)
            batch, m = groups, d["batch"] * oh * ow
            kk = d["c_in"] / groups * d["kernel_h"] * d["kernel_w"]
            n = np.maximum(d["c_out"] / groups, 1.0)
        tensor_core = tiling.tensor_core_rows(cols.dtype, cols.math)
        return tiling.gemm_plan(batch, m, n, kk, tiling.dtype_bytes_of(cols.dtype), tensor_core,
                                nbytes, **common)
    if k in _ROW_WISE:
        return tiling.streaming_plan(d["rows"] * d["cols"], d["rows"], True, flops, nbytes,
                                     **common)
    if k == "pool":
        oh = np.floor((d["h"] - d["kernel_h"]) / np.maximum(d["stride_h"], 1)) + 1
        ow = np.floor((d["w"] - d["kernel_w"]) / np.maximum(d["stride_w"], 1)) + 1
        out = d["batch"] * d["channels"] * np.maximum(oh, 1) * np.maximum(ow, 1)
        return tiling.streaming_plan(out, out, False, flops, nbytes, **common)
    elements = d["elements"] if k == "memcpy" else d["rows"] * d["cols"]
    return tiling.streaming_plan(elements, elements, False, flops, nbytes, **common)


def one_wave_gemm(cols: WorkColumns, dev: DeviceColumns, log_scale: float
                  ) -> tuple[npt.NDArray[np.bool_], FloatArray]:
    """Which gemm rows fit one wave of the device's SMs (`tiling.sub_wave`), and each row's
    one-wave time (ms, `tiling.one_wave_ms`): SIMT tiles for float32, tensor-core tiles for
    16-bit floats and tf32 (`tiling.tensor_core_rows`), against the row's own peak."""
    if cols.kernel != "gemm":
        raise errors.InvalidRequestError("kernel", f"one-wave pricing is for gemm, not "
                                         f"{cols.kernel!r}")
    flops, nbytes = work_cost(cols)
    plan = structure(cols, dev, flops, nbytes)
    floor = np.where(dev.is_cpu > 0, LAUNCH_FLOOR_MS["cpu"], LAUNCH_FLOOR_MS["gpu"])
    return tiling.sub_wave(plan), tiling.one_wave_ms(plan, floor, log_scale)


def tensor_core_gemm(cols: WorkColumns, dev: DeviceColumns
                     ) -> tuple[npt.NDArray[np.str_], FloatArray]:
    """Per gemm row: the class of tensor-core kernel it runs (`tiling.tensor_core_class`: its
    mode, with the alignment when under a 16-byte vector), "" for none; and its tile-and-wave
    time (ms, no launch floor: what the kernel holds the SMs at their roofline share), planned
    over the tiles a GEMM library runs in that mode (`tiling.library_gemm_plan`).

    cuBLAS rasters its tiles so that neighbours share operand panels in L2: each operand
    crosses DRAM once (a GEMM of 12,608 ViT tokens does not re-read its panels, as
    `tiling.gemm_plan` prices a working set over L2), so the plan is the waves' compute at
    L2's bandwidth, and never less than the operands' one trip through DRAM."""
    if cols.kernel != "gemm":
        raise errors.InvalidRequestError("kernel", f"tensor-core class pricing is for gemm, "
                                         f"not {cols.kernel!r}")
    flops, nbytes = work_cost(cols)
    in_l2 = dataclasses.replace(dev, l2_mb=np.full_like(dev.l2_mb, np.inf))
    modes = tiling.tensor_core_mode(cols.dtype, cols.math)
    plan_ms = structure(cols, in_l2, flops, nbytes)["time_ms"]
    d = {k: v.astype(np.float64) for k, v in cols.dims.items()}
    width = tiling.dtype_bytes_of(cols.dtype)
    for mode in set(modes.tolist()) & tiling.LIBRARY_TILES.keys():
        library = tiling.library_gemm_plan(
            d["batch"], d["m"], d["n"], d["k"], width, mode, nbytes, in_l2.peak_gflops,
            in_l2.bw_gbps, np.maximum(in_l2.sm_count, 1.0), in_l2.l2_mb, in_l2.clock_mhz)
        plan_ms = np.where(modes == mode, library["time_ms"], plan_ms)
    time_ms = np.maximum(plan_ms, nbytes / (dev.bw_gbps * 1e6))
    elements = tiling.alignment_elements(d["m"], d["k"], d["n"], width)
    classes = [tiling.tensor_core_class(str(m), int(e), int(b))
               for m, e, b in zip(modes, elements, width, strict=True)]
    return np.array(classes, dtype=np.str_).reshape(len(cols)), time_ms


def _base_from_cost(flops: FloatArray, nbytes: FloatArray, dev: DeviceColumns) -> FloatArray:
    compute_ms = flops / (dev.peak_gflops * 1e6)
    memory_ms = nbytes / (dev.bw_gbps * 1e6)
    floor = np.where(dev.is_cpu > 0, LAUNCH_FLOOR_MS["cpu"], LAUNCH_FLOOR_MS["gpu"])
    return np.maximum(compute_ms, memory_ms) + floor


def _dim_keys(kernel: str) -> tuple[str, ...]:
    try:
        return KERNEL_DIMS[kernel]
    except KeyError:
        raise errors.InvalidRequestError(
            "kernel", f"no feature definition for kernel {kernel!r}") from None


def _map_str(
    values: npt.NDArray[np.str_], table: Mapping[str, float], default: float | None
) -> FloatArray:
    """Look strings up once per distinct value; ``default=None`` makes a miss an error."""
    uniq, inverse = np.unique(values, return_inverse=True)
    looked: list[float] = []
    for u in uniq:
        if str(u) in table:
            looked.append(float(table[str(u)]))
        elif default is None:
            raise errors.InvalidRequestError("dtype", f"unknown dtype {str(u)!r}")
        else:
            looked.append(default)
    return np.asarray(looked, dtype=np.float64)[inverse].reshape(len(values))


def _log(x: FloatArray) -> FloatArray:
    return np.log2(np.maximum(x, 1e-12))


def _conv_out(d: Mapping[str, FloatArray]) -> tuple[FloatArray, FloatArray]:
    oh = np.floor((d["h"] + 2 * d["pad_h"] - d["dilation_h"] * (d["kernel_h"] - 1) - 1)
                  / np.maximum(d["stride_h"], 1)) + 1
    ow = np.floor((d["w"] + 2 * d["pad_w"] - d["dilation_w"] * (d["kernel_w"] - 1) - 1)
                  / np.maximum(d["stride_w"], 1)) + 1
    return np.maximum(oh, 1.0), np.maximum(ow, 1.0)


def _wave_features(
    m: FloatArray, n: FloatArray, batch: FloatArray, sms: FloatArray
) -> list[FloatArray]:
    """Waves of output tiles over the SMs and the tail wave's fill, per tile shape."""
    out: list[FloatArray] = []
    for tm, tn in _TILES:
        tiles = batch * np.ceil(m / tm) * np.ceil(n / tn)
        waves = tiles / sms
        out += [_log(waves), waves / np.maximum(np.ceil(waves), 1.0)]
    return out


_CONV_ALIGN_NAMES = ("c_in_mod8", "c_out_mod8", "out_h_mod4", "c_in_mod32", "c_out_mod32")
_WINOGRAD_NAMES = ("log_wino_tiles_4x4", "log_wino_tiles_2x2", "log_wino_work_4x4",
                   "wino_pad_waste_4x4")


def _conv_align_features(d: Mapping[str, FloatArray], oh: FloatArray) -> list[FloatArray]:
    """Channel and row alignment: cuDNN's vectorised loads and its algorithm choice under
    `cudnn.benchmark` change with them (conv2d random split MAPE 10.7 -> 10.1 % with these)."""
    return [d["c_in"] % 8, d["c_out"] % 8, oh % 4, d["c_in"] % 32, d["c_out"] % 32]


def _winograd_features(
    d: Mapping[str, FloatArray], oh: FloatArray, ow: FloatArray
) -> list[FloatArray]:
    """Work of Winograd F(4x4,3x3) / F(2x2,3x3), which cuDNN picks for many 3x3 shapes: output
    tiles, the transformed-domain GEMM work (6x6 points per tile) and the tile padding waste."""
    tiles4 = d["batch"] * np.ceil(oh / 4) * np.ceil(ow / 4)
    tiles2 = d["batch"] * np.ceil(oh / 2) * np.ceil(ow / 2)
    cin_g = d["c_in"] / np.maximum(d["groups"], 1)
    work4 = tiles4 * 36.0 * cin_g * d["c_out"]
    waste4 = (np.ceil(oh / 4) * 4 - oh) / oh
    return [_log(tiles4), _log(tiles2), _log(work4), waste4]


def _kernel_feature_names(kernel: str) -> tuple[str, ...]:
    waves = tuple(f"{p}_{tm}x{tn}" for tm, tn in _TILES for p in ("log_waves", "tail_fill"))
    names: dict[str, tuple[str, ...]] = {
        "gemm": ("log_batch", "log_m", "log_k", "log_n", "bias", "m_mod4", "k_mod4", "n_mod4",
                 "log_k_over_mn", *waves),
        "conv2d": ("log_batch", "log_c_in", "log_c_out", "log_h", "kernel_h", "kernel_w",
                   "stride_h", "groups", "log_gemm_m", "log_gemm_k", "log_out_hw", *waves,
                   *_CONV_ALIGN_NAMES, *_WINOGRAD_NAMES),
        "pool": ("log_batch", "log_channels", "log_h", "kernel_h", "stride_h", "log_waves_elem",
                 "pool_op"),
        "elementwise": ("log_rows", "log_cols", "operands", "op", "log_elems_per_thread",
                        "cols_mod4"),
        "memcpy": ("log_elements", "log_elems_per_thread"),
    }
    rows_cols = ("log_rows", "log_cols", "log_rows_per_sm", "log_elems_per_thread", "cols_mod4")
    return names.get(kernel, rows_cols)


def _kernel_features(cols: WorkColumns, dev: DeviceColumns) -> list[FloatArray]:
    d = {k: v.astype(np.float64) for k, v in cols.dims.items()}
    sms = np.maximum(dev.sm_count, 1.0)
    threads = sms * _THREADS_PER_SM
    k = cols.kernel
    if k == "gemm":
        m, kk, n, b = d["m"], d["k"], d["n"], d["batch"]
        return [_log(b), _log(m), _log(kk), _log(n), d["bias"], m % 4, kk % 4, n % 4,
                _log(kk / (m * n)), *_wave_features(m, n, b, sms)]
    if k == "conv2d":
        oh, ow = _conv_out(d)
        gm = d["batch"] * oh * ow
        gk = d["c_in"] / np.maximum(d["groups"], 1) * d["kernel_h"] * d["kernel_w"]
        return [_log(d["batch"]), _log(d["c_in"]), _log(d["c_out"]), _log(d["h"]),
                d["kernel_h"], d["kernel_w"], d["stride_h"], d["groups"], _log(gm), _log(gk),
                _log(oh * ow), *_wave_features(gm, d["c_out"], np.ones_like(gm), sms),
                *_conv_align_features(d, oh), *_winograd_features(d, oh, ow)]
    if k == "pool":
        elems = d["batch"] * d["channels"] * d["h"] * d["w"]
        return [_log(d["batch"]), _log(d["channels"]), _log(d["h"]), d["kernel_h"],
                d["stride_h"], _log(elems / threads),
                _map_str(cols.op, _POOL_OP_CODE, _POOL_OP_CODE["other"])]
    if k == "elementwise":
        codes = _map_str(cols.op, _OP_CODE, _OP_CODE["other"])
        n = d["rows"] * d["cols"]
        return [_log(d["rows"]), _log(d["cols"]), d["operands"], codes, _log(n / threads),
                d["cols"] % 4]
    if k == "memcpy":
        return [_log(d["elements"]), _log(d["elements"] / threads)]
    n = d["rows"] * d["cols"]
    return [_log(d["rows"]), _log(d["cols"]), _log(d["rows"] / sms), _log(n / threads),
            d["cols"] % 4]
