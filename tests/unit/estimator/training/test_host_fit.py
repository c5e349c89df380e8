"""Fitting the host model: recovers known coefficients, leaves each model out, skips blocked
phases."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from gpuplan_estimator.step.host import HostCoefficients
from gpuplan_estimator.training import host_fit

TRUE = HostCoefficients(forward_kernel=2.0, forward_view=0.3, autocast_cast=1.5,
                        backward_kernel=1.2, autocast_backward=1.8, optimizer_tensor=0.9)


def rows(seed: int = 0, noise: float = 0.0) -> list[host_fit.HostRow]:
    rng = np.random.default_rng(seed)
    out = []
    for m in range(6):
        for autocast in (False, True):
            fwd = {"forward_kernel": rng.uniform(2e3, 2e4), "forward_view": rng.uniform(1e3, 1e4),
                   "autocast_cast": rng.uniform(1e3, 5e3) if autocast else 0.0}
            bwd, opt = rng.uniform(3e3, 3e4), rng.uniform(200, 2000)
            row = host_fit.HostRow(f"m{m}", autocast, fwd, bwd, opt, (1.0, 1.0, 1.0),
                                   (True, True, True))
            clean = host_fit.predicted_host_ms(row, TRUE)
            measured = tuple(v * float(np.exp(rng.normal(0, noise))) for v in clean)
            out.append(host_fit.HostRow(f"m{m}", autocast, fwd, bwd, opt,
                                        measured, (True, True, True)))  # type: ignore[arg-type]
    return out


def test_fit_recovers_coefficients_without_noise() -> None:
    got = host_fit.fit(rows())
    for name in ("forward_kernel", "forward_view", "autocast_cast", "backward_kernel",
                 "autocast_backward", "optimizer_tensor"):
        assert getattr(got, name) == pytest.approx(getattr(TRUE, name), rel=1e-6)
    assert got.log_sigma == pytest.approx(0.0, abs=1e-9)


def test_leave_one_out_folds_never_see_their_model_and_size_the_spread() -> None:
    data = rows(noise=0.1)
    folds = host_fit.leave_one_group_out(data)
    assert sorted(folds) == [f"m{m}" for m in range(6)]
    # Changing a model's rows changes every fold but its own.
    spoiled = [host_fit.HostRow(r.group, r.autocast, r.forward_us, r.backward_us,
                                r.optimizer_us, tuple(3 * v for v in r.measured_host_ms),  # type: ignore[arg-type]
                                r.usable) if r.group == "m0" else r for r in data]
    again = host_fit.leave_one_group_out(spoiled)
    assert again["m0"] == folds["m0"]
    assert again["m1"] != folds["m1"]
    final = host_fit.fit_for_bundle(data)
    assert 0.03 < final.log_sigma < 0.3


def test_blocked_phases_are_not_issue_times() -> None:
    assert host_fit.usable_phase(host_ms=5.0, device_ms=20.0, busy_ms=19.5)  # host ran ahead
    assert host_fit.usable_phase(host_ms=20.0, device_ms=20.5, busy_ms=8.0)  # GPU waited
    assert not host_fit.usable_phase(host_ms=20.0, device_ms=20.5, busy_ms=20.0)  # blocked
    assert not host_fit.usable_phase(host_ms=20.0, device_ms=20.5, busy_ms=None)
    with pytest.raises(ValueError, match="forward"):
        host_fit.fit([host_fit.HostRow("m", False, dict.fromkeys(host_fit.FORWARD_TERMS, 1.0),
                                       1.0, 1.0, (1.0, 1.0, 1.0), (False, True, True))])


def with_inference(data: list[host_fit.HostRow], no_grad: float, no_grad_cast: float,
                   autocast_rows: bool = True) -> list[host_fit.HostRow]:
    """`data` with each row's inference forward timed as `no_grad` times its ops' own forward
    terms and `no_grad_cast` times its autocast term."""
    out = []
    for r in data:
        own = sum(getattr(TRUE, t) * r.forward_us[t] for t in host_fit.OWN_FORWARD_TERMS)
        cast = TRUE.autocast_cast * r.forward_us["autocast_cast"]
        usable = autocast_rows or not r.autocast
        out.append(dataclasses.replace(
            r, inference_host_ms=(no_grad * own + no_grad_cast * cast) / 1000.0,
            inference_usable=usable))
    return out


def test_without_autograd_the_autocast_term_has_a_multiplier_of_its_own() -> None:
    got = host_fit.fit(with_inference(rows(), no_grad=0.6, no_grad_cast=0.9))
    assert got.no_grad_forward == pytest.approx(0.6, rel=1e-6)
    assert got.no_grad_autocast == pytest.approx(0.9, rel=1e-6)
    # No inference under autocast to fit it on: the autocast term takes the ops' multiplier.
    plain = host_fit.fit(with_inference(rows(), 0.6, 0.9, autocast_rows=False))
    assert plain.no_grad_forward == pytest.approx(0.6, rel=1e-6)
    assert plain.no_grad_autocast is None


def test_what_the_probe_prices_alone_is_an_offset_the_coefficients_do_not_scale() -> None:
    fixed = [dataclasses.replace(r, fixed_us=(500.0 + 100 * i, 300.0))
             for i, r in enumerate(rows())]
    timed = [dataclasses.replace(r, measured_host_ms=host_fit.predicted_host_ms(r, TRUE))
             for r in fixed]
    assert timed[3].measured_host_ms[0] == pytest.approx(
        rows()[3].measured_host_ms[0] + 0.8)  # 500 + 300 us on top
    got = host_fit.fit(timed)
    for name in ("forward_kernel", "forward_view", "autocast_cast", "backward_kernel",
                 "autocast_backward"):
        assert getattr(got, name) == pytest.approx(getattr(TRUE, name), rel=1e-6)
