"""The CRD's enums and defaults are copies of `gpuplan_estimator.core.options`: test they agree."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from gpuplan_estimator.core import options
from gpuplan_operator.core import validation
from gpuplan_testing.paths import REPO_ROOT

CRD = REPO_ROOT / "crds" / "trainingjobs.gpuplan.io.yaml"


def spec_properties() -> dict[str, Any]:
    doc = yaml.safe_load(CRD.read_text(encoding="utf-8"))
    (version,) = [v for v in doc["spec"]["versions"] if v["name"] == "v1alpha1"]
    props: dict[str, Any] = version["schema"]["openAPIV3Schema"]["properties"]["spec"][
        "properties"]
    return props


@pytest.mark.parametrize(("section", "field", "choices", "default"), [
    ("training", "optimizer", options.OPTIMIZERS, options.DEFAULT_OPTIMIZER),
    ("training", "optimizerImpl", options.OPTIMIZER_IMPLS, options.DEFAULT_OPTIMIZER_IMPL),
    ("training", "precision", options.PRECISIONS, options.DEFAULT_PRECISION),
    ("training", "attention", options.ATTENTIONS, options.DEFAULT_ATTENTION),
    ("objective", "prefer", options.OBJECTIVES, options.DEFAULT_OBJECTIVE),
])
def test_crd_enums_and_defaults_are_the_options(section: str, field: str,
                                                choices: tuple[str, ...], default: str) -> None:
    schema = spec_properties()[section]["properties"][field]
    assert tuple(schema["enum"]) == choices
    assert schema["default"] == default


def test_crd_gpu_cap_is_the_options_cap() -> None:
    schema = spec_properties()["objective"]["properties"]["maxGpus"]
    assert schema["maximum"] == options.MAX_GPUS_CAP
    assert schema["default"] == options.DEFAULT_MAX_GPUS


def test_operator_validation_uses_the_options() -> None:
    assert frozenset(options.OPTIMIZERS) == validation.OPTIMIZERS
    assert frozenset(options.OPTIMIZER_IMPLS) == validation.OPTIMIZER_IMPLS
    assert frozenset(options.PRECISIONS) == validation.PRECISIONS
    assert frozenset(options.ATTENTIONS) == validation.ATTENTIONS
    assert frozenset(options.OBJECTIVES) == validation.PREFERENCES


@pytest.mark.parametrize(("field", "cap"), [
    ("batchSize", "MAX_BATCH_SIZE"), ("datasetSize", "MAX_DATASET_SIZE"),
    ("epochs", "MAX_EPOCHS"), ("sequenceLength", "MAX_DIM"),
])
def test_crd_bounds_fit_inside_the_estimators_caps(field: str, cap: str) -> None:
    """Whatever the API server admits the estimator must accept: a CRD maximum above
    `core.limits` would let a TrainingJob through only to be refused at planning."""
    from gpuplan_estimator.core import limits

    schema = spec_properties()["training"]["properties"][field]
    assert 1 <= schema["minimum"] <= schema["maximum"] <= getattr(limits, cap)


def test_crd_dims_fit_inside_the_estimators_caps() -> None:
    from gpuplan_estimator.core import limits

    schema = spec_properties()["training"]["properties"]["dims"]
    assert schema["maxProperties"] <= limits.MAX_DIMS
    assert schema["additionalProperties"]["maximum"] <= limits.MAX_DIM
