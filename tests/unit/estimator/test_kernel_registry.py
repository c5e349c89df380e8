"""Every table keyed by a kernel family agrees with `core.kernels` (issue #31): feature dims,
the bench's sweeps (their shipped specs: test_sweep) and unit builders (onnxruntime and
torch), backward derivers and factors, the shipped bundle, and the kernels a real step
decomposes into."""

from __future__ import annotations

import json

import pytest

from gpuplan_estimator.bench import sweep, torch_units, units
from gpuplan_estimator.core import kernels
from gpuplan_estimator.core.layers import OpFamily
from gpuplan_estimator.cost import features
from gpuplan_estimator.graph import examples
from gpuplan_estimator.latency import bundles
from gpuplan_estimator.step import backward
from gpuplan_estimator.step.decomposition import TrainingSettings, build_step
from gpuplan_estimator.training import backward_factors

BENCHED = set(kernels.BENCHED_KERNELS)
ALL = set(kernels.KERNEL_NAMES)


def test_feature_dims_are_the_registry_dims() -> None:
    assert dict(features.KERNEL_DIMS) == kernels.kernel_dims()


@pytest.mark.parametrize("table", [sweep.KERNELS, units._KERNEL_BUILDERS,
                                   torch_units._KERNEL_BUILDERS],
                         ids=["sweep", "onnx-units", "torch-units"])
def test_the_bench_builds_exactly_the_benched_families(table: object) -> None:
    assert set(table) == BENCHED  # type: ignore[call-overload]


def test_every_family_has_a_backward_rule_and_a_factor_group() -> None:
    assert set(backward._DERIVERS) == ALL
    assert set(backward_factors.KERNEL_FAMILY) == ALL


def test_a_kernel_outside_the_registry_has_no_backward_passes() -> None:
    assert backward_factors.derived_passes("attention", "") == 0.0
    assert backward_factors.derived_passes("gemm", "") == 2.0


def test_op_families_cover_what_the_registry_names() -> None:
    priced = {f.op_family for f in kernels.KERNEL_FAMILIES.values()}
    unpriced = {OpFamily.EMBEDDING, OpFamily.SHAPE_ONLY, OpFamily.OTHER}
    assert priced | unpriced == set(OpFamily)
    assert {"gemm", "conv2d"} == kernels.MATRIX_KERNELS


def test_the_shipped_bundle_names_only_registry_kernels() -> None:
    manifest = json.loads((bundles.SHIPPED_BUNDLE / "manifest.json").read_text())
    assert set(manifest["kernels"]) <= BENCHED
    assert set(manifest["kernel_platforms"]) <= BENCHED


@pytest.mark.parametrize("model", ["resnet50", "gpt2_medium"])
def test_a_real_training_step_uses_only_registry_kernels(model: str) -> None:
    graph = getattr(examples, model)(2)
    step = build_step(graph, TrainingSettings(batch_size=2, mode="train"))
    items = [i for i in (*step.forward, *step.backward, *step.optimizer)
             if i.kernel != kernels.FREE_KERNEL]
    assert {i.kernel for i in items} <= ALL
    assert kernels.FREE_KERNEL not in ALL
    for item in items:
        family = kernels.KERNEL_FAMILIES[item.kernel]
        assert set(item.dims) >= set(family.dims), item
