"""Shape arithmetic of benchmark kernels: output sizes, FLOPs/bytes caps, canonical dims."""

from __future__ import annotations

from collections.abc import Mapping

from gpuplan_estimator.core import errors
from gpuplan_estimator.core.layers import DTYPE_BYTES
from gpuplan_estimator.core.vocabulary import CAST_OP

BINARY_OPS = frozenset({"add", "sub", "mul", "div", "pow"})
SCALAR_OPS = frozenset({"addu", "mulu", "divu", "powu"})
UNARY_OPS = frozenset({"relu", "gelu", "tanh", "sigmoid", "exp", "sqrt", "erf", "neg", CAST_OP})
# A cast row's dtype is what it writes; it reads the other side of autocast's two casts: a half
# dtype is cast from fp32 (autocast's weight and activation casts down), fp32 from a half dtype
# (casts up into fp32 ops, and every gradient cast back to an fp32 weight). On the GPU the two
# run different kernels: PyTorch vectorises fp32 -> bf16, and casts up through its unrolled
# dynamic-casting loop (H200 profiles: 2-2.5x the time per byte).
_CAST_FROM = {"float16": "float32", "bfloat16": "float32"}


def cast_source(dtype: str, half: str) -> str:
    """The dtype a cast row of `dtype` reads: fp32 for a half dtype, else `half` (the half
    dtype the backend's runtime has: bfloat16 in PyTorch, float16 in onnxruntime)."""
    return _CAST_FROM.get(dtype, half)
# Local response normalisation sums `size` squared neighbours per output element; the window
# takes the place of `operands` (the estimator maps an ONNX LRN layer the same way).
WINDOW_OPS = frozenset({"lrn"})


def operands(op: str) -> int:
    """Number of input tensors an elementwise op reads (2 binary, 1 unary or scalar)."""
    if op in BINARY_OPS:
        return 2
    if op in SCALAR_OPS or op in UNARY_OPS:
        return 1
    raise errors.GpuplanError(f"elementwise op {op!r} unknown")


def cost(kernel: str, op: str, dims: Mapping[str, int], dtype: str) -> tuple[float, float]:
    """(FLOPs, bytes moved) of one forward kernel; used for sampling caps only."""
    eb = DTYPE_BYTES[dtype]
    d = dims
    if kernel == "gemm":
        b, m, k, n = d["batch"], d["m"], d["k"], d["n"]
        return 2.0 * b * m * k * n, float(eb * (b * m * k + b * k * n + b * m * n))
    if kernel == "conv2d":
        oh, ow = conv_out(d)
        cin_g = d["c_in"] // d["groups"]
        flops = 2.0 * d["batch"] * d["c_out"] * oh * ow * cin_g * d["kernel_h"] * d["kernel_w"]
        in_b = d["batch"] * d["c_in"] * d["h"] * d["w"]
        w_b = d["c_out"] * cin_g * d["kernel_h"] * d["kernel_w"]
        return flops, float(eb * (in_b + w_b + d["batch"] * d["c_out"] * oh * ow))
    if kernel == "pool":
        oh, ow = pool_out(d)
        out = d["batch"] * d["channels"] * oh * ow
        in_b = d["batch"] * d["channels"] * d["h"] * d["w"]
        return float(out * d["kernel_h"] * d["kernel_w"]), float(eb * (in_b + out))
    if kernel in ("layernorm", "batchnorm", "softmax"):
        n = d["rows"] * d["cols"]
        return 5.0 * n, float(eb * 2 * n)
    if kernel == "elementwise":
        n = d["rows"] * d["cols"]
        return float(n), float(eb * n * (d["operands"] + 1))
    if kernel == "memcpy":
        return 0.0, float(eb * 2 * d["elements"])
    raise errors.GpuplanError(f"kernel {kernel!r} has no cost formula")


def conv_out(d: Mapping[str, int]) -> tuple[int, int]:
    """Output (height, width) of a 2-D convolution with the padding, stride and dilation."""
    def one(size: int, k: int, s: int, p: int, dil: int) -> int:
        return (size + 2 * p - dil * (k - 1) - 1) // s + 1

    return (
        one(d["h"], d["kernel_h"], d["stride_h"], d["pad_h"], d["dilation_h"]),
        one(d["w"], d["kernel_w"], d["stride_w"], d["pad_w"], d["dilation_w"]),
    )


def pool_out(d: Mapping[str, int]) -> tuple[int, int]:
    """Output (height, width) of an unpadded pooling window."""
    return (
        (d["h"] - d["kernel_h"]) // d["stride_h"] + 1,
        (d["w"] - d["kernel_w"]) // d["stride_w"] + 1,
    )


def canonical(kernel: str, op: str, dims: dict[str, int]) -> dict[str, int]:
    """Map sampled dims onto the canonical dims of `workload.py`."""
    if kernel == "elementwise" and op in WINDOW_OPS:
        return {"rows": dims["rows"], "cols": dims["cols"], "operands": dims["size"]}
    if kernel == "elementwise":
        return {**dims, "operands": operands(op)}
    if kernel == "memcpy":
        # The spec samples a 2-D shape; the canonical memcpy dim is the element count only.
        return {"elements": dims["rows"] * dims["cols"]}
    return dims


def valid(kernel: str, dims: Mapping[str, int]) -> bool:
    """Whether `dims` describe a runnable kernel: no negatives, divisible groups, outputs >= 1."""
    if any(v < 0 for v in dims.values()):
        return False
    if kernel == "conv2d":
        g = dims["groups"]
        oh, ow = conv_out(dims)
        return g >= 1 and dims["c_in"] % g == 0 and dims["c_out"] % g == 0 and min(oh, ow) >= 1
    if kernel == "pool":
        return min(pool_out(dims)) >= 1
    return True
