"""Single-layer PyTorch eager callables for benchmark plan items (`--backend torch`).

Each plan item becomes the ATen call PyTorch eager makes for that layer (``F.conv2d``,
``F.linear``, ``torch.matmul``, ...). Two callables are timed: the forward under
``torch.no_grad()`` (the forward-shaped kernel the estimator prices, as with onnxruntime) and
forward+backward with autograd, every floating input and parameter requiring a gradient, as in
a layer in the middle of a network being trained.

torch is imported lazily: it is an optional extra (``gpuplan[torch]``).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from gpuplan_estimator.bench import shapes, timing
from gpuplan_estimator.bench.sweep import PlanItem
from gpuplan_estimator.bench.units import MEMCPY_INNER
from gpuplan_estimator.core import errors, extras
from gpuplan_estimator.core.vocabulary import CAST_OP

_DTYPES = ("float32", "float16", "bfloat16", "float64")
_BINARY = {"add": "add", "sub": "sub", "mul": "mul", "div": "div", "pow": "pow"}
_SCALAR = {"addu": "add", "mulu": "mul", "divu": "div", "powu": "pow"}
_UNARY = {"relu": "relu", "tanh": "tanh", "sigmoid": "sigmoid", "exp": "exp", "sqrt": "sqrt",
          "erf": "erf", "neg": "neg"}
_POSITIVE_OPS = frozenset({"pow", "powu", "div", "divu", "sqrt"})


def import_torch() -> Any:
    """The torch module, or a clear error saying how to get it."""
    try:
        return extras.require("torch", "torch", needed_by="--backend torch")
    except extras.MissingExtraError:
        raise extras.MissingExtraError(
            f"--backend torch needs PyTorch, which is not importable here ({extras.hint('torch')}),"
            " or use --backend onnxruntime") from None


@dataclass(frozen=True)
class TorchUnit:
    """What one timed run executes, with and without autograd."""

    forward: Callable[[], Any]
    """The layer's forward on fixed inputs, no autograd graph recorded."""
    forward_backward: Callable[[], None]
    """Forward with autograd, then backward from a fixed output gradient."""


def build_unit(
    item: PlanItem, rng: np.random.Generator, device: str, *, device_init: bool = False
) -> TorchUnit:
    """The PyTorch eager layer that runs `item`'s kernel on `device` (``cpu``, ``cuda:N``).

    With `device_init` the random values are drawn by torch on the device (seeded from `rng`)
    instead of by numpy on the host and copied: a GB-sized GPU input then takes milliseconds.
    """
    torch = import_torch()
    if item.dtype not in _DTYPES:
        raise errors.GpuplanError(f"bench dtype {item.dtype!r} unsupported by the torch backend")
    try:
        builder = _KERNEL_BUILDERS[item.kernel]
    except KeyError:
        raise errors.GpuplanError(f"no torch unit builder for kernel {item.kernel!r}") from None
    tensors = _Tensors(torch, getattr(torch, item.dtype), device, rng, device_init)
    try:
        fn = builder(torch, tensors, item.op, item.dims)
    except KeyError as exc:
        raise errors.GpuplanError(
            f"{item.kernel} item lacks dim {exc.args[0]!r}: {dict(item.dims)}"
        ) from exc
    return _unit(torch, fn, tensors.leaves)


class _Tensors:
    """Random inputs and parameters on the device; all of them are autograd leaves."""

    def __init__(
        self, torch: Any, dtype: Any, device: str, rng: np.random.Generator,
        device_init: bool = False,
    ) -> None:
        self.torch, self.dtype, self.device, self.rng = torch, dtype, device, rng
        self.leaves: list[Any] = []
        self.generator: Any = None
        if device_init:
            self.generator = torch.Generator(device=device)
            self.generator.manual_seed(int(rng.integers(2**62)))

    def _uniform(self, shape: tuple[int, ...]) -> Any:
        if self.generator is not None:
            return self.torch.rand(shape, generator=self.generator, device=self.device,
                                   dtype=self.torch.float32)
        return self.torch.from_numpy(self.rng.random(shape, dtype=np.float32))

    def new(self, shape: Sequence[int], positive: bool = False, dtype: Any = None) -> Any:
        """A random leaf of `shape`, in the unit's dtype unless `dtype` names another."""
        values = self._uniform(tuple(shape))
        # Keep pow/div/sqrt away from 0 and negatives so no NaN/inf slow paths are timed.
        values = values + 0.5 if positive else values * 2.0 - 1.0
        tensor = values.to(device=self.device, dtype=self.dtype if dtype is None else dtype)
        tensor.requires_grad_(True)
        self.leaves.append(tensor)
        return tensor


def _unit(torch: Any, fn: Callable[[], Any], leaves: Sequence[Any]) -> TorchUnit:
    with torch.no_grad():
        grad_out = torch.ones_like(fn())

    def forward() -> Any:
        with torch.no_grad():
            return fn()

    def forward_backward() -> None:
        for leaf in leaves:
            leaf.grad = None  # zero_grad(set_to_none=True): no kernel, no accumulation
        fn().backward(grad_out)

    return TorchUnit(forward, forward_backward)


Builder = Callable[[Any, _Tensors, str, Mapping[str, int]], Callable[[], Any]]


def _gemm(torch: Any, t: _Tensors, _op: str, d: Mapping[str, int]) -> Callable[[], Any]:
    batch, m, k, n = d["batch"], d["m"], d["k"], d["n"]
    lead = (batch,) if batch > 1 else ()
    x = t.new((*lead, m, k))
    if d["bias"]:
        # nn.Linear: weight [out, in] shared over the batch, bias fused (addmm).
        w, b = t.new((n, k)), t.new((n,))
        return lambda: torch.nn.functional.linear(x, w, b)
    y = t.new((*lead, k, n))
    return lambda: torch.matmul(x, y)


def _conv(torch: Any, t: _Tensors, _op: str, d: Mapping[str, int]) -> Callable[[], Any]:
    g = d["groups"]
    x = t.new((d["batch"], d["c_in"], d["h"], d["w"]))
    w = t.new((d["c_out"], d["c_in"] // g, d["kernel_h"], d["kernel_w"]))
    stride, pad = (d["stride_h"], d["stride_w"]), (d["pad_h"], d["pad_w"])
    dilation = (d["dilation_h"], d["dilation_w"])
    return lambda: torch.nn.functional.conv2d(x, w, None, stride, pad, dilation, g)


def _pool(torch: Any, t: _Tensors, op: str, d: Mapping[str, int]) -> Callable[[], Any]:
    fns = {"maxpool": torch.nn.functional.max_pool2d, "avgpool": torch.nn.functional.avg_pool2d}
    if op not in fns:
        raise errors.GpuplanError(f"pool op {op!r} not one of {sorted(fns)}")
    x = t.new((d["batch"], d["channels"], d["h"], d["w"]))
    kernel, stride = (d["kernel_h"], d["kernel_w"]), (d["stride_h"], d["stride_w"])
    return lambda: fns[op](x, kernel, stride)


def _layernorm(torch: Any, t: _Tensors, _op: str, d: Mapping[str, int]) -> Callable[[], Any]:
    x, scale, bias = t.new((d["rows"], d["cols"])), t.new((d["cols"],)), t.new((d["cols"],))
    return lambda: torch.nn.functional.layer_norm(x, (d["cols"],), scale, bias)


def _batchnorm(torch: Any, t: _Tensors, _op: str, d: Mapping[str, int]) -> Callable[[], Any]:
    # Training mode, as in the step the torch rows price: batch statistics, running stats
    # updated. rows are the channels, cols the N*H*W positions (see the ONNX unit). Parameters
    # and running stats stay fp32 whatever the input's dtype, as under autocast (batch norm
    # is on none of its lists): a half input with half parameters takes a slower kernel that
    # no autocast step runs.
    x = t.new((1, d["rows"], d["cols"], 1))
    scale, bias = (t.new((d["rows"],), dtype=torch.float32) for _ in range(2))
    mean = torch.zeros(d["rows"], dtype=torch.float32, device=t.device)
    var = torch.ones(d["rows"], dtype=torch.float32, device=t.device)
    return lambda: torch.nn.functional.batch_norm(x, mean, var, scale, bias, training=True)


def _softmax(torch: Any, t: _Tensors, _op: str, d: Mapping[str, int]) -> Callable[[], Any]:
    x = t.new((d["rows"], d["cols"]))
    return lambda: torch.softmax(x, dim=-1)


def _elementwise(torch: Any, t: _Tensors, op: str, d: Mapping[str, int]) -> Callable[[], Any]:
    shape = (d["rows"], d["cols"])
    positive = op in _POSITIVE_OPS
    if op in shapes.WINDOW_OPS:
        # rows play the channels the window slides over (see the ONNX unit). 4-D like a CNN's
        # LRN: PyTorch takes its avg_pool3d path then, 3-D inputs a faster avg_pool2d one.
        x = t.new((1, d["rows"], d["cols"], 1))
        return lambda: torch.nn.functional.local_response_norm(x, d["operands"], 1e-4, 0.75, 1.0)
    if op == "gelu":
        x = t.new(shape)
        return lambda: torch.nn.functional.gelu(x)
    if op == CAST_OP:
        source = shapes.cast_source(str(t.dtype).removeprefix("torch."), "bfloat16")
        x = t.new(shape, dtype=getattr(torch, source))
        return lambda: x.to(t.dtype)
    if op in _UNARY:
        x, fn = t.new(shape, positive), getattr(torch, _UNARY[op])
        return lambda: fn(x)
    if op in _SCALAR:
        x, fn = t.new(shape, positive), getattr(torch, _SCALAR[op])
        return lambda: fn(x, 1.5)  # tensor (op) python scalar
    if op in _BINARY and d["operands"] == 2:
        x, y, fn = t.new(shape, positive), t.new(shape, positive), getattr(torch, _BINARY[op])
        return lambda: fn(x, y)
    raise errors.GpuplanError(f"elementwise op {op!r} has no torch unit")


def _memcpy(torch: Any, t: _Tensors, op: str, d: Mapping[str, int]) -> Callable[[], Any]:
    if op != "transpose":
        raise errors.GpuplanError(f"memcpy op {op!r} unsupported (only transpose)")
    n = d["elements"]
    inner = MEMCPY_INNER if n % MEMCPY_INNER == 0 else 1
    x = t.new((n // inner, inner))
    if min(x.shape) == 1:
        # A transpose with a dim of 1 is a view PyTorch never copies (timed at 5 ns on the
        # H200): copy the same bytes instead.
        return lambda: x.clone()
    return lambda: x.t().contiguous()


_KERNEL_BUILDERS: Mapping[str, Builder] = {
    "gemm": _gemm,
    "conv2d": _conv,
    "pool": _pool,
    "layernorm": _layernorm,
    "batchnorm": _batchnorm,
    "softmax": _softmax,
    "elementwise": _elementwise,
    "memcpy": _memcpy,
}


def set_precision_flags(torch: Any, precision: str) -> None:
    """TF32 math for matmul and cuDNN on for ``tf32``, off otherwise (``fp32`` is IEEE float32
    math, for convolutions too, although PyTorch's own default lets cuDNN use TF32)."""
    on = precision == "tf32"
    torch.backends.cuda.matmul.allow_tf32 = on
    torch.backends.cudnn.allow_tf32 = on


def versions() -> dict[str, str]:
    """torch, CUDA and cuDNN versions of this process (provenance of torch-backend rows)."""
    torch = import_torch()
    cudnn = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
    return {"torch": str(torch.__version__), "cuda": str(torch.version.cuda or ""),
            "cudnn": str(cudnn or "")}


def time_unit(
    unit: TorchUnit, *, device: str, settings: timing.TimingSettings,
    clock: timing.Clock = time.perf_counter,
) -> tuple[timing.TimingResult, timing.TimingResult]:
    """(forward, forward+backward) timed with the bench protocol (`timing`)."""
    torch = import_torch()
    torch.set_num_threads(timing.resolved_threads(settings))
    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)

    def synced(fn: Callable[[], Any]) -> Callable[[], None]:
        def run() -> None:
            fn()
            sync()  # CUDA launches are asynchronous: the run ends when the kernels do

        return run

    forward = timing.time_runs([timing.timer(synced(unit.forward), clock)], settings)
    both = timing.time_runs([timing.timer(synced(unit.forward_backward), clock)], settings)
    return forward, both
