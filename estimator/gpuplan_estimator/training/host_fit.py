"""Fit the host timeline's coefficients on measured whole-model steps (issue #30 part 1).

`step.host.HostModel` prices a step's host time as a linear function of its work items:
per forward kernel, per shape-only forward item, per op autocast casts, per backward item and
per parameter tensor, each in units of the node's probe figures (`bench.host_probe`). So the
coefficients are dimensionless counts of host operations per item, and carry to a node with
another CPU through its probe.

`fit` solves non-negative least squares on the host times `model_steps` measures (the wall time
each phase's Python call took to return), in relative terms (each row weighted by 1/measured,
so small and large steps count alike). Only phases where that time is the host's own issue
time enter: a phase where the GPU was busy all along may have blocked the host on a full
launch queue (`usable_phase`). `leave_one_group_out` refits without each model in turn: the
figures a report may quote are those of the left-out model.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
from scipy.optimize import lsq_linear

from gpuplan_estimator.step.host import HostCoefficients

FORWARD_TERMS = ("forward_kernel", "forward_view", "autocast_cast")
BACKWARD_TERMS = ("backward_kernel",)
OPTIMIZER_TERMS = ("optimizer_tensor",)
BLOCKED_BUSY_SHARE = 0.9
"""A phase whose kernels kept the GPU busy more than this share of its time may have blocked
the host (the launch queue holds ~1,000 kernels): its host time is not an issue time."""


@dataclass(frozen=True)
class HostRow:
    """One measured case's host regressors and host times, per phase.

    `*_us` are the phase's host cost with each coefficient at 1 (so the phase's host time is
    their dot product with the coefficients); `measured_host_ms` what the host took, and
    `usable` whether that time is an issue time (`usable_phase`)."""

    group: str  # the model: what leave-one-out leaves out
    autocast: bool
    forward_us: Mapping[str, float]
    backward_us: float
    optimizer_us: float
    measured_host_ms: tuple[float, float, float]
    usable: tuple[bool, bool, bool]
    inference_host_ms: float = 0.0
    """The inference forward's host time (no autograd); usable when `inference_usable`."""
    inference_usable: bool = False
    fixed_us: tuple[float, float] = (0.0, 0.0)
    """Forward and backward host cost no coefficient scales: the training-only ops the probe
    prices as they are (`training_ops.ROLE`)."""


def usable_phase(host_ms: float, device_ms: float, busy_ms: float | None) -> bool:
    """Whether a phase's host time measures issuing: the GPU idled a good share of the phase
    (the host was the bottleneck, not blocked), or the host finished well before the GPU."""
    if host_ms <= 0 or device_ms <= 0:
        return False
    if host_ms < 0.8 * device_ms:
        return True
    return busy_ms is not None and busy_ms < BLOCKED_BUSY_SHARE * device_ms


LOWER_BOUNDS = {"forward_kernel": 1.0, "backward_kernel": 1.0}
"""What a coefficient is at least: a forward kernel item is at least one dispatch
(`eager_op_us`) and a backward item at least one autograd node, so a model whose rows say
little about one term is not priced as free. Others are at least 0."""
UPPER_BOUNDS = {"forward_view": 1.0, "no_grad_forward": 1.0, "no_grad_autocast": 1.0}
"""What a coefficient is at most: a view (Reshape, Transpose: metadata only) costs at most one
dispatch, so the fit cannot load Python overhead onto the view count of the graphs it saw
(hand-written HF graphs and exported torchvision ones spell views very differently); a forward
without autograd costs at most what it costs with it."""


def _solve(columns: Sequence[Sequence[float]], target_ms: Sequence[float],
           terms: Sequence[str], fixed_us: Sequence[float] | None = None) -> np.ndarray:
    """Bounded least squares of target on columns (us) plus the rows' `fixed_us`, each row
    weighted by 1/target."""
    a = np.asarray(columns, dtype=float).T / 1000.0  # us -> ms
    b = np.asarray(target_ms, dtype=float)
    fixed = np.zeros(len(b)) if fixed_us is None else np.asarray(fixed_us, float) / 1000.0
    w = 1.0 / b
    lower = [LOWER_BOUNDS.get(t, 0.0) for t in terms]
    upper = [UPPER_BOUNDS.get(t, np.inf) for t in terms]
    result = lsq_linear(a * w[:, None], (b - fixed) * w, bounds=(lower, upper))
    return np.asarray(result.x)


def fit(rows: Sequence[HostRow]) -> HostCoefficients:
    """The coefficients that best explain the usable phases of `rows` (ValueError when a phase
    has no usable row to fit on)."""
    fwd = [r for r in rows if r.usable[0]]
    bwd_plain = [r for r in rows if r.usable[1] and not r.autocast]
    bwd_cast = [r for r in rows if r.usable[1] and r.autocast]
    opt = [r for r in rows if r.usable[2]]
    for name, chosen in (("forward", fwd), ("backward", bwd_plain + bwd_cast),
                         ("optimizer", opt)):
        if not chosen:
            raise ValueError(f"no usable {name} phase to fit the host model on")
    forward = _solve([[r.forward_us[t] for r in fwd] for t in FORWARD_TERMS],
                     [r.measured_host_ms[0] for r in fwd], FORWARD_TERMS,
                     [r.fixed_us[0] for r in fwd])
    backward_rows = bwd_plain or bwd_cast
    (backward,) = _solve([[r.backward_us for r in backward_rows]],
                         [r.measured_host_ms[1] for r in backward_rows], BACKWARD_TERMS,
                         [r.fixed_us[1] for r in backward_rows])
    autocast_backward = 1.0
    if bwd_plain and bwd_cast:
        (scaled,) = _solve([[r.backward_us * backward for r in bwd_cast]],
                           [r.measured_host_ms[1] for r in bwd_cast], ("autocast_backward",),
                           [r.fixed_us[1] for r in bwd_cast])
        autocast_backward = float(scaled)
    (optimizer,) = _solve([[r.optimizer_us for r in opt]], [r.measured_host_ms[2] for r in opt],
                          OPTIMIZER_TERMS)
    coefficients = HostCoefficients(
        forward_kernel=float(forward[0]), forward_view=float(forward[1]),
        autocast_cast=float(forward[2]), backward_kernel=float(backward),
        autocast_backward=autocast_backward, optimizer_tensor=float(optimizer))
    inference = [r for r in rows if r.inference_usable]
    if inference:
        coefficients = _fit_no_grad(inference, coefficients)
    return dataclasses.replace(coefficients, log_sigma=log_sigma(rows, coefficients))


OWN_FORWARD_TERMS = ("forward_kernel", "forward_view")
"""The forward terms of the ops themselves, which `no_grad_forward` scales; the autocast term
has `no_grad_autocast`."""


def _fit_no_grad(rows: Sequence[HostRow], c: HostCoefficients) -> HostCoefficients:
    """The multipliers without autograd, on inference forwards' host times: one on the ops'
    own terms and, where some inference ran under autocast, one on the autocast term."""
    own = [sum(getattr(c, t) * r.forward_us[t] for t in OWN_FORWARD_TERMS) for r in rows]
    cast = [c.autocast_cast * r.forward_us["autocast_cast"] for r in rows]
    target = [r.inference_host_ms for r in rows]
    if not any(r.autocast for r in rows):
        (no_grad,) = _solve([[a + b for a, b in zip(own, cast, strict=True)]], target,
                            ("no_grad_forward",))
        return dataclasses.replace(c, no_grad_forward=float(no_grad), no_grad_autocast=None)
    no_grad, no_grad_cast = _solve([own, cast], target, ("no_grad_forward", "no_grad_autocast"))
    return dataclasses.replace(c, no_grad_forward=float(no_grad),
                               no_grad_autocast=float(no_grad_cast))


def predicted_host_ms(row: HostRow, c: HostCoefficients) -> tuple[float, float, float]:
    """A row's host time per phase under coefficients `c`."""
    forward = (sum(getattr(c, t) * row.forward_us[t] for t in FORWARD_TERMS)
               + row.fixed_us[0]) / 1000.0
    backward = (c.backward_kernel * (c.autocast_backward if row.autocast else 1.0)
                * row.backward_us + row.fixed_us[1]) / 1000.0
    return forward, backward, c.optimizer_tensor * row.optimizer_us / 1000.0


def log_sigma(rows: Sequence[HostRow], c: HostCoefficients) -> float:
    """Spread (RMS) of log(predicted / measured) over the usable phases of `rows`."""
    errors = [math.log(p / m) for r in rows
              for p, m, ok in zip(predicted_host_ms(r, c), r.measured_host_ms, r.usable,
                                  strict=True) if ok and p > 0 and m > 0]
    return float(np.sqrt(np.mean(np.square(errors)))) if errors else 0.0


def leave_one_group_out(rows: Sequence[HostRow]) -> dict[str, HostCoefficients]:
    """Per group (model): the coefficients fitted on every other group's rows."""
    return {group: fit([r for r in rows if r.group != group])
            for group in sorted({r.group for r in rows})}


def held_out_log_sigma(rows: Sequence[HostRow], folds: Mapping[str, HostCoefficients]) -> float:
    """Spread of log(predicted / measured) host time, each group under the fold that left it
    out: the spread an unseen model's host time has."""
    errors = [math.log(p / m) for r in rows
              for p, m, ok in zip(predicted_host_ms(r, folds[r.group]), r.measured_host_ms,
                                  r.usable, strict=True) if ok and p > 0 and m > 0]
    return float(np.sqrt(np.mean(np.square(errors)))) if errors else 0.0


def fit_for_bundle(rows: Sequence[HostRow]) -> HostCoefficients:
    """The coefficients fitted on every row, with the held-out (leave-one-model-out) spread as
    their `log_sigma`, the figure intervals are sized by."""
    folds = leave_one_group_out(rows)
    return dataclasses.replace(fit(rows), log_sigma=held_out_log_sigma(rows, folds))
