"""Pure validation of TrainingJob specs: every error with its field path."""

from __future__ import annotations

import pytest

from gpuplan_operator.core import errors, validation
from gpuplan_testing.operator_builders import SpecBuilder


def test_valid_spec_parses_to_typed_view() -> None:
    spec = validation.parse_spec(SpecBuilder().set("objective.budget", 250).obj())
    assert spec.model.config_map_name == "resnet" and spec.model.url is None
    assert spec.model.format == "auto"
    assert spec.training.batch_size == 256 and spec.training.optimizer == "adamw"
    assert spec.objective.deadline_seconds == 4 * 3600
    assert spec.objective.budget_usd == 250.0


def test_a_hf_config_model_parses_to_its_config_map_key() -> None:
    ref = {"configMapKeyRef": {"name": "llama", "key": "config.json"}}
    spec = validation.parse_spec(SpecBuilder().set("model", {"hfConfig": ref}).obj())
    assert spec.model.hf_config
    assert (spec.model.config_map_name, spec.model.config_map_key) == ("llama", "config.json")


@pytest.mark.parametrize(("builder", "field"), [
    (SpecBuilder().drop("model"), "spec.model: required"),
    (SpecBuilder().set("model.onnx.url", "https://x/m.onnx"), "spec.model.onnx: set exactly one"),
    (SpecBuilder().set("model.onnx", {}), "spec.model.onnx: set exactly one"),
    (SpecBuilder().set("model.onnx", {"url": "file:///etc/passwd"}), "spec.model.onnx.url"),
    (SpecBuilder().set("model.format", "bzip2"), "spec.model.format"),
    (SpecBuilder().set("model.hfConfig", {"configMapKeyRef": {"name": "c", "key": "k"}}),
     "spec.model: set exactly one of onnx and hfConfig"),
    (SpecBuilder().set("model", {"hfConfig": {"configMapKeyRef": {"name": "c"}}}),
     "spec.model.hfConfig.configMapKeyRef.key"),
    (SpecBuilder().set("model", {"hfConfig": {}}), "spec.model.hfConfig.configMapKeyRef"),
    (SpecBuilder().set("training.batchSize", 0), "spec.training.batchSize: must be in"),
    (SpecBuilder().set("training.batchSize", "32"), "spec.training.batchSize: must be an integer"),
    (SpecBuilder().drop("training.epochs"), "spec.training.epochs: required"),
    (SpecBuilder().set("training.optimizer", "lbfgs"), "spec.training.optimizer"),
    (SpecBuilder().set("training.precision", "int8"), "spec.training.precision"),
    (SpecBuilder().set("training.attention", "flash"), "spec.training.attention"),
    (SpecBuilder().set("training.dims", {"seq": 0}), "spec.training.dims.seq"),
    (SpecBuilder().set("objective.maxGpus", 0), "spec.objective.maxGpus"),
    (SpecBuilder().set("objective.deadline", "4 hours"), "spec.objective.deadline"),
    (SpecBuilder().set("objective.deadline", "0h"), "spec.objective.deadline: must be longer"),
    (SpecBuilder().set("objective.budget", 0), "spec.objective.budget"),
    (SpecBuilder().set("objective.budget", True), "spec.objective.budget"),
    (SpecBuilder().set("objective.prefer", "cheap"), "spec.objective.prefer"),
    (SpecBuilder().set("gpuTypes", ["L4", "L4"]), "spec.gpuTypes: duplicate"),
    (SpecBuilder().set("template", {"spec": {"containers": []}}), "spec.template.spec.containers"),
    (SpecBuilder().set("template.spec.containers", [{"name": "x"}]),
     "spec.template.spec.containers[0]"),
    (SpecBuilder().set("template.spec.restartPolicy", "OnFailure"),
     "spec.template.spec.restartPolicy: must be Never"),
    (SpecBuilder().set("template.spec.serviceAccountName", ""),
     "spec.template.spec.serviceAccountName"),
])
def test_each_problem_names_its_field(builder: SpecBuilder, field: str) -> None:
    problems = validation.validate_spec(builder.obj())
    assert any(p.startswith(field) for p in problems), problems


def test_all_errors_are_reported_together() -> None:
    bad = (SpecBuilder().set("training.batchSize", -1).set("objective.maxGpus", 0)
           .set("objective.deadline", "soon").obj())
    with pytest.raises(errors.InvalidSpecError) as info:
        validation.parse_spec(bad)
    paths = [e.split(":")[0] for e in info.value.errors]
    assert paths == ["spec.training.batchSize", "spec.objective.maxGpus", "spec.objective.deadline"]


@pytest.mark.parametrize(("text", "seconds"), [
    ("4h", 14400), ("90m", 5400), ("1h30m", 5400), ("2d", 172800), ("45s", 45)])
def test_durations(text: str, seconds: int) -> None:
    assert validation.parse_duration_seconds(text) == seconds


@pytest.mark.parametrize("text", ["", "4", "h", "1.5h", "-1h", "4 h", "1w"])
def test_bad_durations(text: str) -> None:
    with pytest.raises(ValueError, match="duration"):
        validation.parse_duration_seconds(text)


def test_service_account_of_a_template() -> None:
    assert validation.service_account(SpecBuilder().obj()["template"]) is None
    named = SpecBuilder().set("template.spec.serviceAccountName", "trainer").obj()["template"]
    assert validation.service_account(named) == "trainer"
    legacy = SpecBuilder().set("template.spec.serviceAccount", "old").obj()["template"]
    assert validation.service_account(legacy) == "old"
