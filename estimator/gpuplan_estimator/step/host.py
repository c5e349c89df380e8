"""Pure: the host as a second timeline of the step (issue #30 part 1).

Eager PyTorch issues every kernel from one CPU thread (the autograd engine's thread in
backward). A kernel cannot start before the host has issued it, nor before the previous kernel
on its stream has ended:

    start_k = max(issued_k + launch_latency, end_{k-1}),   end_k = start_k + gpu_k

so a step of short kernels runs at the speed of the host however fast the GPU is, and a step of
long kernels lets the host run ahead. A phase's time is what CUDA events around it read: an
event recorded by the host at its phase boundary completes once the host has reached it and the
stream has drained what came before.

The recurrence is solved in closed form over prefix sums (`device_end_ms`), so pricing a step
of 10^4 kernels costs a few numpy passes. Per-item host costs come from `HostModel`: a node's
per-op issue costs (`bench.host_probe` figures, or the default measured on the H200 run's
host) times how many host operations each kind of work item stands for (`HostCoefficients`,
fitted leave-one-model-out on whole-model steps; `training.host_fit`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Any

import numpy as np
import numpy.typing as npt

from gpuplan_estimator.core import options, precisions
from gpuplan_estimator.core.errors import InvalidRequestError
from gpuplan_estimator.core.kernels import MIN_KERNEL_MS
from gpuplan_estimator.core.workload import Phase, WorkItem
from gpuplan_estimator.step import training_ops

FloatArray = npt.NDArray[np.float64]
MANIFEST_KEY = "host_model"
"""Where a model bundle's manifest holds its host model (`model_to_json`)."""
PROVENANCE_KEY = f"{MANIFEST_KEY}_provenance"
"""Where the manifest records how the host model was fitted (command, commit, rows, models)."""
FOLDED_OPS = frozenset({"Constant"})
"""Graph ops an exporter writes for values it computed while tracing (folded shape arithmetic,
literals): eager PyTorch issues nothing for them."""
HOST_FREE_ROLES = frozenset({"fused", "autocast_cast", "constant"})
"""Forward items the host issues no call for: a fused member runs inside its kernel, an
autocast cast is issued by the dispatcher inside the op it feeds (its host cost is that op's
`autocast_cast` term, not a call of its own), and a structure-only graph's weight or buffer
(`decomposition.CONSTANT_ROLE`) is a tensor eager PyTorch holds."""
OPTIONAL_FIGURES = frozenset({"optimizer_for_loop_us_per_tensor",
                              "optimizer_fused_us_per_tensor"})
"""Probe figures that may be absent: fused is measured with CUDA only (`bench.host_probe`),
and host models in bundles made before 2026-11-28 carry neither; an estimate that needs a
missing one says so (`HostProbe.optimizer_us_per_tensor`)."""
PROBE_VERSION = 1
"""The version of `bench.host_probe`'s figures `HostProbe` reads (the probe module runs on a
bare node with torch only, so it keeps its own copy; a test checks the two agree)."""



@dataclass(frozen=True)
class HostProbe:
    """A node's per-op issue costs in microseconds (`bench.host_probe`'s figures)."""

    eager_op_us: float
    """One small in-place op: the dispatcher plus one launch."""
    module_call_us: float
    """One `nn.Linear` module call (Python `__call__` plus addmm)."""
    autocast_linear_us: float
    """`F.linear` under autocast (its operand casts included)."""
    linear_us: float
    """`F.linear` outside autocast."""
    backward_node_us: float
    """The autograd engine's cost per node."""
    optimizer_foreach_us_per_tensor: float
    """AdamW's foreach step per parameter tensor."""
    optimizer_for_loop_us_per_tensor: float | None
    """AdamW's for-loop step (`foreach=False`) per parameter tensor; None in a bundle's host
    model written before estimates priced the implementation (2026-11-28)."""
    optimizer_fused_us_per_tensor: float | None
    """AdamW's fused step (`fused=True`) per parameter tensor; None from a probe that ran on
    a CPU (torch.optim's fused AdamW is CUDA's), or from an older bundle's host model."""
    launch_latency_us: float
    """Issue to completion of one tiny kernel, its synchronize included."""
    source: str = ""
    """Where the figures come from (node, date, command)."""

    @classmethod
    def from_figures(cls, figures: Mapping[str, float], source: str) -> HostProbe:
        """A probe from `bench.host_probe`'s `figures_us` (extra figures are ignored)."""
        names = [f.name for f in fields(cls) if f.name != "source"]
        missing = [n for n in names if n not in figures and n not in OPTIONAL_FIGURES]
        if missing:
            raise ValueError(f"host probe figures lack {missing}")
        values: dict[str, Any] = {n: float(figures[n]) if n in figures else None
                                  for n in names}
        return cls(**values, source=source)

    def optimizer_us_per_tensor(self, optimizer_impl: str) -> float:
        """The optimizer step's host cost per parameter tensor as `optimizer_impl` runs it."""
        by_impl = {options.FOREACH_OPTIMIZER: self.optimizer_foreach_us_per_tensor,
                   options.FUSED_OPTIMIZER: self.optimizer_fused_us_per_tensor,
                   options.FOR_LOOP_OPTIMIZER: self.optimizer_for_loop_us_per_tensor}
        figure = by_impl[optimizer_impl]
        if figure is None:
            where = self.source or "unnamed"
            raise InvalidRequestError(
                "optimizer_impl", f"the host probe pricing this device ({where}) has no "
                f"{optimizer_impl} optimizer figure (fused needs a probe run with CUDA; a "
                "bundle made before 2026-11-28 has foreach only)")
        return figure

    @property
    def autocast_extra_us(self) -> float:
        """What autocast adds to one lowered op: its operand casts' dispatch and launches."""
        return max(0.0, self.autocast_linear_us - self.linear_us)


@dataclass(frozen=True)
class HostCoefficients:
    """Host operations per work item, in units of the probe's figures (dimensionless)."""

    forward_kernel: float
    """Per forward kernel item, in `eager_op_us`: the op and the Python (module calls, views,
    shape arithmetic) the model runs around it."""
    forward_view: float
    """Per shape-only forward item (Reshape, Transpose, ...), in `eager_op_us`."""
    autocast_cast: float
    """Per forward item autocast lowers or keeps in fp32, in `autocast_extra_us`."""
    backward_kernel: float
    """Per backward item, in `backward_node_us` (more under autocast: `autocast_backward`)."""
    autocast_backward: float
    """Multiplier on `backward_kernel` under autocast (the casts' own backward nodes)."""
    optimizer_tensor: float
    """Per parameter tensor, in the probe's figure for the step's optimizer implementation
    (`HostProbe.optimizer_us_per_tensor`; fitted on foreach steps), step plus zero_grad."""
    no_grad_forward: float = 1.0
    """Multiplier on forward costs without autograd (inference under `no_grad`: no graph to
    record)."""
    no_grad_autocast: float | None = None
    """Multiplier on the `autocast_cast` term without autograd (None: `no_grad_forward`'s, as
    bundles made before 2026-11-29 priced it). Autocast casts as many tensors under `no_grad`
    (its weight cache keys on `requires_grad`, not on grad mode), so its share shrinks less
    than the ops' own, whose autograd nodes are gone."""
    log_sigma: float = 0.0
    """Spread of the host time's log error, left-out models' (sizes the interval)."""


@dataclass(frozen=True)
class HostModel:
    """What prices the host timeline: a node's probe and the fitted coefficients."""

    probe: HostProbe
    coefficients: HostCoefficients

    def item_host_us(self, items: Sequence[WorkItem], precision: str,
                     parameter_tensors: int, *, optimizer_impl: str,
                     training: bool = True) -> FloatArray:
        """Issue cost of each item of a step, in microseconds (optimizer items share the
        per-tensor cost of `optimizer_impl`; a forward without autograd costs `no_grad_forward`
        times as much, its autocast term `no_grad_autocast` times; a folded constant costs
        nothing: the exporter computed it, eager PyTorch never issues it; a training-only op,
        dropout or the loss, one module call forward and one autograd node backward)."""
        autocast = precisions.precision(precision).autocast
        p, c = self.probe, self.coefficients
        out = np.zeros(len(items))
        cast = np.zeros(len(items))  # the autocast term, apart: `no_grad_autocast` scales it
        optimizer_rows = [i for i, item in enumerate(items) if item.phase is Phase.OPTIMIZER]
        for i, item in enumerate(items):
            if item.phase is Phase.OPTIMIZER:
                continue
            if item.role == training_ops.ROLE:  # a dropout or the loss: priced as it is
                out[i] = (p.backward_node_us if item.phase is Phase.BACKWARD
                          else p.module_call_us) * item.count
                continue
            if item.phase is Phase.BACKWARD:
                out[i] = c.backward_kernel * p.backward_node_us * (
                    c.autocast_backward if autocast else 1.0) * item.count
                continue
            if item.role in HOST_FREE_ROLES or item.op in FOLDED_OPS:  # no call of its own
                continue
            if item.kernel == "none":
                out[i] = c.forward_view * p.eager_op_us
                continue
            out[i] = c.forward_kernel * p.eager_op_us * item.count
            if autocast and _autocast_touches(item):
                cast[i] = c.autocast_cast * p.autocast_extra_us
        if not training:
            out *= c.no_grad_forward
            cast *= c.no_grad_forward if c.no_grad_autocast is None else c.no_grad_autocast
        out += cast
        if optimizer_rows:
            total = (c.optimizer_tensor * p.optimizer_us_per_tensor(optimizer_impl)
                     * parameter_tensors)
            out[optimizer_rows] = total / len(optimizer_rows)
        return out


def _autocast_touches(item: WorkItem) -> bool:
    """Whether autocast casts this forward op's operands (lowered or kept-in-fp32 ops)."""
    return item.op in precisions.AUTOCAST_LOWER_OPS or item.op in precisions.AUTOCAST_FP32_OPS


@dataclass(frozen=True)
class Timeline:
    """One step priced on two clocks: per phase, what the events read and the host's time."""

    device_ms: tuple[float, float, float]
    """Forward, backward, optimizer as CUDA events around each phase read them."""
    gpu_busy_ms: tuple[float, float, float]
    """The kernels' own time per phase (the sum a kernel-only model gives)."""
    host_ms: tuple[float, float, float]
    """The host's time to issue each phase."""

    @property
    def step_ms(self) -> float:
        """The whole step as the events read it."""
        return float(sum(self.device_ms))

    @property
    def idle_share(self) -> float:
        """Share of the step the GPU waits for the host."""
        step = self.step_ms
        return 1.0 - sum(self.gpu_busy_ms) / step if step > 0 else 0.0

    @property
    def host_bound(self) -> bool:
        """Whether the host's clock is the longer one: issuing the step takes longer than
        running its kernels, so a faster GPU would not shorten it (a faster host would)."""
        return sum(self.host_ms) > sum(self.gpu_busy_ms)


EAGER_CALL_TIMING = "eager-call"
"""A bundle's kernel rows timed one eager call at a time, events around each call (the shared
gpu-ops data): a row holds the host's dispatch of that call as well as its kernels."""
STREAM_TIMING = "stream"
"""Kernel rows timed back to back (`bench.batched`: CUDA graphs or K calls per event pair):
what the kernels take on the stream, nothing of the host."""
KERNEL_TIMINGS = (EAGER_CALL_TIMING, STREAM_TIMING)
EAGER_CALL_DISPATCH_MS = 0.0235
"""What one eager call's timing adds to its kernels: the gpu-ops floor (the median over its
five GPUs of the fastest tiny-shape elementwise call, 0.0255 ms: A100 0.0252, T4 0.0250,
P4 0.0255, P100 0.0302, V100 0.0317) less a tiny kernel's own time (`MIN_KERNEL_MS`). On the
host timeline the host model prices that dispatch, so a stream that kept it would pay it twice
(issue #30: profiled bf16 forwards on the H200 ran 2-5x fewer kernel-ms than their rows
summed)."""


def on_stream(latency_ms: FloatArray, learned: npt.NDArray[np.bool_], timing: str) -> FloatArray:
    """Per-execution latencies as the stream spends them: rows a model learned from eager-call
    timings (`learned`, under `timing` EAGER_CALL_TIMING) less the dispatch those timings held,
    never below `MIN_KERNEL_MS` nor above what they were; other rows (the roofline's,
    stream-timed models') as they are."""
    if timing not in KERNEL_TIMINGS:
        raise ValueError(f"kernel timing must be one of {KERNEL_TIMINGS}, got {timing!r}")
    if timing == STREAM_TIMING:
        return latency_ms
    lowered = np.minimum(latency_ms, np.maximum(latency_ms - EAGER_CALL_DISPATCH_MS,
                                                MIN_KERNEL_MS))
    return np.where(learned, lowered, latency_ms)


def device_end_ms(issued_ms: FloatArray, gpu_ms: FloatArray, latency_ms: float) -> FloatArray:
    """When each kernel ends on one stream: end_k = max(issued_k + latency, end_{k-1}) + gpu_k,
    from an idle stream at 0. Closed form: end_k = S_k + max_{j<=k}(issued_j + latency -
    S_{j-1}) with S the prefix sums of `gpu_ms`."""
    if len(gpu_ms) == 0:
        return np.zeros(0)
    prefix = np.cumsum(gpu_ms)
    before = prefix - gpu_ms
    slack = np.maximum.accumulate(np.maximum(issued_ms + latency_ms - before, 0.0))
    return prefix + slack


def timeline(gpu_ms: FloatArray, host_us: FloatArray, phase: npt.NDArray[np.intp],
             latency_ms: float) -> Timeline:
    """Price a step whose items (in issue order, phases contiguous: 0 forward, 1 backward,
    2 optimizer) take `gpu_ms` on the GPU and `host_us` on the host."""
    if not (len(gpu_ms) == len(host_us) == len(phase)):
        raise ValueError("gpu_ms, host_us and phase must have one entry per item")
    # A zero-length marker at each phase's end: the event the host records there.
    order = np.concatenate([np.flatnonzero(phase == code) for code in range(3)])
    marks = [int(np.sum(phase <= code)) for code in range(3)]  # items before each phase's end
    g = np.insert(gpu_ms[order], marks, 0.0)
    h = np.insert(host_us[order] / 1000.0, marks, 0.0)
    ends = device_end_ms(np.cumsum(h), g, latency_ms)
    positions = [m + i for i, m in enumerate(marks)]
    event_ms = [0.0, *(float(ends[p]) for p in positions)]
    host_marks = [0.0, *(float(np.cumsum(h)[p]) for p in positions)]
    busy = np.bincount(phase, weights=gpu_ms, minlength=3)
    return Timeline(device_ms=_three(np.diff(event_ms)), gpu_busy_ms=_three(busy.astype(float)),
                    host_ms=_three(np.diff(host_marks)))


def _three(values: FloatArray) -> tuple[float, float, float]:
    return float(values[0]), float(values[1]), float(values[2])


def model_to_json(model: HostModel) -> dict[str, object]:
    """A host model as a manifest's JSON object."""
    return {"probe": {f.name: getattr(model.probe, f.name) for f in fields(HostProbe)},
            "coefficients": {f.name: getattr(model.coefficients, f.name)
                             for f in fields(HostCoefficients)}}


def model_from_json(doc: Mapping[str, object]) -> HostModel:
    """The inverse of `model_to_json`; ValueError naming the field that is missing or wrong."""
    probe, coefficients = doc.get("probe"), doc.get("coefficients")
    if not isinstance(probe, Mapping) or not isinstance(coefficients, Mapping):
        raise ValueError("host_model: needs objects 'probe' and 'coefficients'")
    try:
        figures = {k: float(v) for k, v in probe.items() if k != "source" and v is not None}
        made = HostProbe.from_figures(figures, str(probe.get("source", "")))
        coeffs = HostCoefficients(**{f.name: float(coefficients[f.name])
                                     for f in fields(HostCoefficients)
                                     if coefficients.get(f.name) is not None})
    except (TypeError, ValueError) as exc:
        raise ValueError(f"host_model: {exc}") from exc
    return HostModel(made, coeffs)
