"""Issue #30 part 7: many kernels per timed launch (the CPU path of the batched protocol)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch

from gpuplan_estimator.bench import batched, sweep, torch_units
from gpuplan_estimator.core import errors

SETTINGS = batched.BatchSettings(batch_size=4, repeats=3, target_launch_ms=0.5, max_reps=8,
                                 max_item_bytes=100.0, max_batch_bytes=250.0, backward_every=2)


def test_reps_per_launch_fills_the_target_within_bounds() -> None:
    assert batched.reps_per_launch(0.1, SETTINGS) == 5
    assert batched.reps_per_launch(0.001, SETTINGS) == 8  # capped at max_reps
    assert batched.reps_per_launch(3.0, SETTINGS) == 1  # a long kernel runs once per launch
    assert batched.reps_per_launch(0.0, SETTINGS) == 8


def test_take_batch_caps_count_and_bytes_and_skips_oversized_items() -> None:
    queue = list("abcdefg")
    take, skip = batched.take_batch(queue, [50, 500, 60, 70, 80, 10, 10], SETTINGS)
    # b is over max_item_bytes; a+c+d = 180 fits, + e = 260 would pass max_batch_bytes.
    assert (take, skip) == ([0, 2, 3], [1])
    take, _ = batched.take_batch(queue, [10] * 7, SETTINGS)
    assert take == [0, 1, 2, 3]  # batch_size


def test_take_batch_always_takes_the_first_item_that_fits() -> None:
    wide = batched.BatchSettings(max_item_bytes=300.0, max_batch_bytes=300.0)
    assert batched.take_batch(["a", "b"], [300.0, 1.0], wide) == ([0], [])


def test_summarize_launches_divides_by_reps() -> None:
    result = batched.summarize_launches([4.0, 2.0, 3.0], reps=2)
    assert (result.latency_ms, result.latency_min_ms, result.repeats,
            result.runs_per_repeat) == (1.5, 1.0, 3, 2)
    with pytest.raises(errors.GpuplanError):
        batched.summarize_launches([], reps=2)


def test_fitting_prefix() -> None:
    assert batched.fitting_prefix([1.0, 2.0, 3.0], 3.5) == 2
    assert batched.fitting_prefix([5.0], 1.0) == 0
    assert batched.fitting_prefix([], 1.0) == 0


@pytest.mark.parametrize(("field", "kw"), [
    ("batch_size", {"batch_size": 0}), ("timing", {"mode": "cupti"}), ("repeats", {"repeats": 0}),
    ("max_batch_bytes", {"max_item_bytes": 10.0, "max_batch_bytes": 5.0}),
    ("backward_every", {"backward_every": -1}),
])
def test_bad_settings_name_their_field(field: str, kw: dict[str, object]) -> None:
    with pytest.raises(errors.InvalidRequestError) as info:
        batched.BatchSettings(**kw).validate()  # type: ignore[arg-type]
    assert info.value.field == field


def units(n: int) -> list[torch_units.TorchUnit]:
    items = [sweep.PlanItem("softmax", "softmax", "float32", {"rows": 8 * (i + 1), "cols": 16})
             for i in range(n)]
    return [torch_units.build_unit(it, np.random.default_rng(i), "cpu", device_init=True)
            for i, it in enumerate(items)]


def test_cpu_batch_times_every_unit_and_backward_on_every_nth() -> None:
    out = batched.time_batch(units(4), torch=torch, device="cpu", settings=SETTINGS)
    assert len(out) == 4
    assert all(t.forward.latency_ms > 0 and t.forward.repeats == 3 for t in out)
    assert all(t.method == "perf_counter" for t in out)
    assert [t.forward_backward is not None for t in out] == [True, False, True, False]


def test_a_batch_never_outlives_its_budget() -> None:
    # A fake clock advancing 1 ms per read: every launch "takes" at least 1 ms.
    ticks = itertools.count()
    out = batched.time_batch(units(4), torch=torch, device="cpu", settings=SETTINGS,
                             budget_s=0.03, clock=lambda: next(ticks) / 1000.0)
    assert 0 < len(out) < 4  # a prefix: the items whose launches fit what was left


@pytest.mark.parametrize(("precision", "on"), [("tf32", True), ("fp32", False), ("bf16", False)])
def test_tf32_math_is_on_exactly_for_tf32_rows(precision: str, on: bool) -> None:
    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    try:
        torch_units.set_precision_flags(torch, precision)
        assert (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32) == (on, on)
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved
