"""Issue #30 part 7: fp32/tf32/bf16 versions of every float32 plan item."""

from __future__ import annotations

import pytest

from gpuplan_estimator.bench import precisions, sweep
from gpuplan_estimator.core import errors
from gpuplan_estimator.step.backward import math_attributes

GEMM = sweep.PlanItem("gemm", "matmul", "float32", {"batch": 1, "m": 8, "k": 4, "n": 2, "bias": 0})
SOFTMAX = sweep.PlanItem("softmax", "softmax", "float32", {"rows": 4, "cols": 8})
HALF = sweep.PlanItem("softmax", "softmax", "float16", {"rows": 4, "cols": 8})


def test_parse_keeps_the_given_order() -> None:
    assert precisions.parse_precisions("bf16, fp32") == ("bf16", "fp32")


@pytest.mark.parametrize(("text", "match"), [("", "empty"), ("fp32,fp8", "unknown fp8"),
                                             ("fp32,fp32", "repeated")])
def test_parse_refuses_bad_lists_by_field(text: str, match: str) -> None:
    with pytest.raises(errors.InvalidRequestError, match=match) as info:
        precisions.parse_precisions(text)
    assert info.value.field == "precisions"


def test_gemm_gets_three_rows_softmax_two_other_dtypes_one() -> None:
    out = precisions.expand([GEMM, SOFTMAX, HALF], ("fp32", "tf32", "bf16"))
    assert [(it.kernel, it.dtype, precisions.precision_of(it)) for it in out] == [
        ("gemm", "float32", "fp32"), ("gemm", "float32", "tf32"), ("gemm", "bfloat16", "bf16"),
        ("softmax", "float32", "fp32"), ("softmax", "bfloat16", "bf16"),
        ("softmax", "float16", "float16"),
    ]
    assert len({it.key() for it in out}) == len(out)  # fp32 and tf32 rows stay two rows
    assert out[1].dims[precisions.TF32_DIM] == 1 and precisions.TF32_DIM not in out[0].dims


def test_tf32_rows_are_exactly_where_the_estimator_prices_tf32_math() -> None:
    for kernel in sweep.KERNELS:
        priced = math_attributes(kernel, "tf32").get("math") == "tf32"
        assert precisions.applies(kernel, "tf32") is priced, kernel


def test_with_precision_round_trips_and_names_the_family() -> None:
    tf32 = precisions.with_precision(GEMM, "tf32")
    back = precisions.with_precision(tf32, "fp32")
    assert back == GEMM
    assert precisions.family_of(tf32) == "gemm/tf32"
    assert precisions.family_of(precisions.with_precision(tf32, "bf16")) == "gemm/bf16"
