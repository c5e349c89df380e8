"""Single-op ONNX units run correctly on onnxruntime, and the timing protocol is as documented."""

from __future__ import annotations

import itertools
import math

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from gpuplan_estimator.bench import shapes, sweep, timing, units
from gpuplan_estimator.core import errors

CPU = "CPUExecutionProvider"
CONV = {"batch": 2, "c_in": 3, "c_out": 4, "h": 9, "w": 9, "kernel_h": 3, "kernel_w": 3,
        "stride_h": 2, "stride_w": 2, "pad_h": 1, "pad_w": 1, "dilation_h": 1, "dilation_w": 1,
        "groups": 1}
POOL = {"batch": 2, "channels": 3, "h": 8, "w": 8, "kernel_h": 2, "kernel_w": 2,
        "stride_h": 2, "stride_w": 2}
ITEMS = [
    ("gemm", "matmul", {"batch": 1, "m": 3, "k": 5, "n": 4, "bias": 0}, (3, 4)),
    ("gemm", "matmul", {"batch": 1, "m": 3, "k": 5, "n": 4, "bias": 1}, (3, 4)),
    ("gemm", "matmul", {"batch": 2, "m": 3, "k": 5, "n": 4, "bias": 0}, (2, 3, 4)),
    ("gemm", "matmul", {"batch": 2, "m": 3, "k": 5, "n": 4, "bias": 1}, (2, 3, 4)),
    ("conv2d", "conv", CONV, (2, 4, 5, 5)),
    ("pool", "maxpool", POOL, (2, 3, 4, 4)),
    ("pool", "avgpool", POOL, (2, 3, 4, 4)),
    ("layernorm", "layernorm", {"rows": 3, "cols": 7}, (3, 7)),
    ("softmax", "softmax", {"rows": 3, "cols": 7}, (3, 7)),
    *[("elementwise", op, {"rows": 3, "cols": 7, "operands": shapes.operands(op)}, (3, 7))
      for op in ("add", "mul", "div", "pow", "addu", "mulu", "divu", "powu", "relu", "gelu",
                 "tanh", "sigmoid")],
    ("memcpy", "transpose", {"elements": 128}, (64, 2)),
    ("memcpy", "transpose", {"elements": 7}, (1, 7)),
]


def run(unit: units.Unit) -> np.ndarray:
    sess = ort.InferenceSession(unit.model.SerializeToString(), providers=[CPU])
    return np.asarray(sess.run(None, dict(unit.feeds))[0])


@pytest.mark.parametrize(("kernel", "op", "dims", "shape"), ITEMS,
                         ids=[f"{k}-{o}-{i}" for i, (k, o, _, _) in enumerate(ITEMS)])
def test_every_unit_is_valid_onnx_and_runs(
    kernel: str, op: str, dims: dict[str, int], shape: tuple[int, ...]
) -> None:
    unit = units.build_unit(sweep.PlanItem(kernel, op, "float32", dims),
                            np.random.default_rng(0))
    onnx.checker.check_model(unit.model, full_check=True)
    out = run(unit)
    assert out.shape == shape
    assert np.isfinite(out).all()


def test_gemm_unit_computes_the_canonical_contraction() -> None:
    item = sweep.PlanItem("gemm", "matmul", "float32", {"batch": 2, "m": 3, "k": 5, "n": 4,
                                                         "bias": 0})
    unit = units.build_unit(item, np.random.default_rng(1))
    x, y = unit.feeds["x"], unit.feeds["x2"]
    assert x.shape == (2, 3, 5) and y.shape == (2, 5, 4)  # k=5 contracts
    np.testing.assert_allclose(run(unit), np.matmul(x, y), rtol=1e-5)


def test_softmax_unit_normalises_over_cols() -> None:
    unit = units.build_unit(sweep.PlanItem("softmax", "softmax", "float32",
                                           {"rows": 4, "cols": 6}), np.random.default_rng(2))
    np.testing.assert_allclose(run(unit).sum(axis=1), np.ones(4), rtol=1e-5)


def test_unknown_kernel_op_or_missing_dim_is_an_error() -> None:
    rng = np.random.default_rng(0)
    with pytest.raises(errors.GpuplanError, match="no ONNX unit builder"):
        units.build_unit(sweep.PlanItem("fft", "x", "float32", {}), rng)
    with pytest.raises(errors.GpuplanError, match="elementwise op 'erfc'"):
        units.build_unit(sweep.PlanItem("elementwise", "erfc", "float32",
                                        {"rows": 1, "cols": 1, "operands": 1}), rng)
    with pytest.raises(errors.GpuplanError, match="lacks dim 'cols'"):
        units.build_unit(sweep.PlanItem("softmax", "softmax", "float32", {"rows": 1}), rng)


def test_summarize_drops_first_run_and_keeps_median_of_repeat_means() -> None:
    got = timing.summarize([[100.0, 1.0, 3.0], [50.0, 2.0, 2.0], [70.0, 4.0, 6.0]])
    # repeat means of runs 2..N+1: 2, 2, 5
    assert got.latency_ms == 2.0
    assert got.latency_min_ms == 2.0
    assert got.latency_std_ms == pytest.approx(math.sqrt(3.0))
    assert (got.repeats, got.runs_per_repeat) == (3, 2)
    with pytest.raises(errors.GpuplanError, match="at least 2 runs"):
        timing.summarize([[1.0]])
    with pytest.raises(errors.GpuplanError, match="no timing repeats"):
        timing.summarize([])


@pytest.mark.parametrize(("estimate_ms", "expected"),
                         [(1.0, 40), (0.001, 50), (100.0, 2), (0.0, 50), (float("nan"), 50)])
def test_choose_runs_targets_repeat_length(estimate_ms: float, expected: int) -> None:
    assert timing.choose_runs(estimate_ms, timing.TimingSettings()) == expected


def test_time_unit_follows_the_protocol_on_real_onnxruntime() -> None:
    unit = units.build_unit(sweep.PlanItem("softmax", "softmax", "float32",
                                           {"rows": 8, "cols": 16}), np.random.default_rng(0))
    ticks = itertools.count()
    calls: list[int] = []

    def clock() -> float:  # every run takes exactly 2 ms on this clock
        n = next(ticks)
        calls.append(n)
        return n * 0.002

    settings = timing.TimingSettings(warmup_runs=2, repeats=3, min_runs=2, max_runs=4,
                                     target_repeat_ms=6.0)
    got = timing.time_unit(unit, provider=CPU, settings=settings, clock=clock)
    assert got.latency_ms == pytest.approx(2.0) and got.latency_std_ms == pytest.approx(0.0)
    assert got.runs_per_repeat == 3  # 6 ms target / 2 ms per run
    assert len(calls) == 2 * (2 + 3 * (3 + 1))  # warm-up + R x (N+1), two clock reads each


def test_time_unit_real_clock_gives_plausible_latency() -> None:
    unit = units.build_unit(sweep.PlanItem("gemm", "matmul", "float32",
                                           {"batch": 1, "m": 64, "k": 64, "n": 64, "bias": 0}),
                            np.random.default_rng(0))
    got = timing.time_unit(unit, provider=CPU, settings=timing.TimingSettings(repeats=3))
    assert 0.0 < got.latency_min_ms <= got.latency_ms < 100.0
    assert got.repeats == 3


def test_missing_provider_and_bad_settings_are_errors() -> None:
    unit = units.build_unit(sweep.PlanItem("softmax", "softmax", "float32",
                                           {"rows": 1, "cols": 2}), np.random.default_rng(0))
    if "CUDAExecutionProvider" not in ort.get_available_providers():
        with pytest.raises(errors.GpuplanError, match="has no CUDAExecutionProvider"):
            timing.time_unit(unit, provider="CUDAExecutionProvider",
                             settings=timing.TimingSettings())
    with pytest.raises(errors.InvalidRequestError, match="min_runs"):
        timing.time_unit(unit, provider=CPU,
                         settings=timing.TimingSettings(min_runs=9, max_runs=3))


def test_threads_default_to_all_cores() -> None:
    assert timing.resolved_threads(timing.TimingSettings()) == timing.available_cores() >= 1
    assert timing.resolved_threads(timing.TimingSettings(intra_op_threads=1)) == 1


def test_repeats_spread_over_fresh_sessions_each_warmed_up(monkeypatch: pytest.MonkeyPatch
                                                           ) -> None:
    unit = units.build_unit(sweep.PlanItem("softmax", "softmax", "float32",
                                           {"rows": 8, "cols": 16}), np.random.default_rng(0))
    made: list[ort.InferenceSession] = []
    real = timing.make_session

    def counting(*args: object, **kw: object) -> ort.InferenceSession:
        session = real(*args, **kw)  # type: ignore[arg-type]
        made.append(session)
        return session

    monkeypatch.setattr(timing, "make_session", counting)
    ticks = itertools.count()
    calls: list[int] = []

    def clock() -> float:
        n = next(ticks)
        calls.append(n)
        return n * 0.002

    settings = timing.TimingSettings(warmup_runs=2, repeats=5, min_runs=2, max_runs=4,
                                     target_repeat_ms=6.0, sessions=3)
    got = timing.time_unit(unit, provider=CPU, settings=settings, clock=clock)
    assert len(made) == 3 and got.repeats == 5 and got.latency_ms == pytest.approx(2.0)
    assert len(calls) == 2 * (3 * 2 + 5 * (3 + 1))  # each session warmed up, R x (N+1) timed
    with pytest.raises(errors.InvalidRequestError, match="sessions"):
        timing.time_unit(unit, provider=CPU, settings=timing.TimingSettings(sessions=0))
