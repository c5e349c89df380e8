"""One registry of what each precision means; every user agrees with it (issue #30 part 2)."""

from __future__ import annotations

import pytest

from gpuplan_estimator import devices
from gpuplan_estimator.core import options, precisions
from gpuplan_estimator.core.layers import DTYPE_BYTES
from gpuplan_estimator.devices import catalog
from gpuplan_estimator.evaluation import model_steps
from gpuplan_estimator.planning import parallel_inputs
from gpuplan_estimator.step import backward
from gpuplan_estimator.step.decomposition import TrainingSettings

NAMES = tuple(precisions.PRECISION_TABLE)


def test_options_list_the_registry_in_order() -> None:
    assert options.PRECISIONS == NAMES
    assert all(precisions.PRECISION_TABLE[n].name == n for n in NAMES)


@pytest.mark.parametrize("name", NAMES)
def test_training_settings_read_the_registry(name: str) -> None:
    entry = precisions.precision(name)
    s = TrainingSettings(batch_size=1, precision=name)
    assert s.compute_dtype == entry.compute_dtype
    assert s.activation_bytes == entry.activation_bytes == DTYPE_BYTES[entry.compute_dtype]
    assert s.mixed_precision == entry.autocast
    assert parallel_inputs.ELEMENT_BYTES[name] == entry.activation_bytes


@pytest.mark.parametrize("name", NAMES)
def test_math_attributes_follow_the_registry(name: str) -> None:
    entry = precisions.precision(name)
    for kernel in ("gemm", "conv2d", "elementwise"):
        want = "" if entry.autocast else entry.math_of(kernel)
        assert dict(backward.math_attributes(kernel, name)) == ({"math": want} if want else {})


def test_fp32_is_pytorchs_default_matmul_fp32_convolutions_tf32() -> None:
    fp32 = precisions.precision("fp32")
    assert (fp32.gemm_math, fp32.conv_math) == ("", precisions.TF32_MATH)
    assert precisions.precision("tf32").gemm_math == precisions.TF32_MATH
    # model_steps measures with the same switches: (matmul, cuDNN) TF32 per precision
    for name, (matmul, cudnn) in model_steps.TF32_SWITCHES.items():
        entry = precisions.precision(name)
        assert matmul == (entry.gemm_math == precisions.TF32_MATH)
        assert cudnn == (entry.conv_math == precisions.TF32_MATH)


def test_catalog_support_reads_needs_peak() -> None:
    v100 = devices.resolve_device("v100-sxm2-32gb")
    h100 = devices.resolve_device("h100-sxm-80gb")
    for name in NAMES:
        needed = precisions.precision(name).needs_peak
        assert catalog.supports_precision(h100, name)
        assert catalog.supports_precision(v100, name) == (
            needed is None or v100.peak_tflops.get(needed, 0.0) > 0)
    assert not catalog.supports_precision(v100, "bf16")


def test_autocast_op_lists_are_disjoint() -> None:
    assert not precisions.AUTOCAST_LOWER_OPS & precisions.AUTOCAST_FP32_OPS
