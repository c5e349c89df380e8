"""Every user of a name in `gpuplan_estimator.core.vocabulary` (and of the dims caps and the
memory breakdown) agrees with it: the estimator's stages, its HTTP schema and CLI, the
operator and the CRD (issue #31)."""

from __future__ import annotations

import argparse
import gzip
import hashlib
import lzma
from typing import Any

import pytest
import yaml
import zstandard

from gpuplan_estimator.core import errors, limits, vocabulary
from gpuplan_estimator.graph import batching, examples, loading
from gpuplan_estimator.interfaces.cli import main as cli_main
from gpuplan_estimator.interfaces.cli.plotting import documents
from gpuplan_estimator.interfaces.http import openapi, responses
from gpuplan_estimator.parallel import sharding, strategies
from gpuplan_estimator.planning import estimates, workloads
from gpuplan_estimator.step import memory
from gpuplan_estimator.step.decomposition import TrainingSettings
from gpuplan_operator import estimator_client, modelsource
from gpuplan_operator.core import resources, validation
from gpuplan_operator.core.errors import InvalidModelSourceError
from gpuplan_testing.paths import REPO_ROOT


def _crd_training_job_spec() -> dict[str, Any]:
    doc = yaml.safe_load((REPO_ROOT / "crds" / "trainingjobs.gpuplan.io.yaml").read_text())
    (version,) = [v for v in doc["spec"]["versions"] if v["name"] == "v1alpha1"]
    spec: dict[str, Any] = version["schema"]["openAPIV3Schema"]["properties"]["spec"]
    return spec["properties"]


def _openapi_property(schema: str, field: str) -> dict[str, Any]:
    prop: dict[str, Any] = openapi.document()["components"]["schemas"][schema]["properties"][
        field]
    (present,) = [s for s in prop.get("anyOf", [prop]) if s.get("type") != "null"]
    return present


def test_the_sequence_dim_has_one_spelling() -> None:
    assert batching.SEQUENCE_DIM is vocabulary.SEQUENCE_DIM
    assert estimator_client.SEQUENCE_DIM is vocabulary.SEQUENCE_DIM
    # planning.estimates keeps its own literal until its open work (#30) lands; it must agree.
    assert estimates.SEQUENCE_DIM == vocabulary.SEQUENCE_DIM
    description = _crd_training_job_spec()["training"]["properties"]["sequenceLength"][
        "description"]
    assert f"`{vocabulary.SEQUENCE_DIM}`" in description


def test_a_workload_id_as_issued_passes_the_one_check() -> None:
    issued = hashlib.sha256(b"any workload").hexdigest()  # what `workloads.encode` returns
    assert vocabulary.check_workload_id(issued) == issued
    assert len(issued) == vocabulary.WORKLOAD_ID_CHARS


@pytest.mark.parametrize("bad", ["A" * 64, "a" * 63, "a" * 65, "g" * 64, "", None, 7,
                                 "a" * 64 + "\n"])
def test_anything_else_is_refused_on_the_workload_id_field(bad: object) -> None:
    with pytest.raises(errors.InvalidRequestError) as caught:
        vocabulary.check_workload_id(bad)
    assert caught.value.field == "workload_id"


def test_every_workload_id_check_uses_the_pattern() -> None:
    assert estimator_client.WORKLOAD_ID_RE.pattern == vocabulary.WORKLOAD_ID_PATTERN
    assert _openapi_property("OutcomeBody", "workload_id")["pattern"] == (
        f"^{vocabulary.WORKLOAD_ID_PATTERN}$")
    assert not hasattr(workloads, "check_id")  # the dead copy stays gone


def _cli_choices(flag: str) -> set[tuple[str, ...]]:
    found: set[tuple[str, ...]] = set()

    def visit(parser: argparse.ArgumentParser) -> None:
        for action in parser._actions:
            if flag in action.option_strings and action.choices is not None:
                found.add(tuple(action.choices))
            if isinstance(action, argparse._SubParsersAction):
                for sub in action.choices.values():
                    visit(sub)

    visit(cli_main.build_parser(plugins=False))
    return found


def test_model_formats_are_listed_once() -> None:
    assert loading.COMPRESSIONS == vocabulary.MODEL_COMPRESSIONS
    assert frozenset(vocabulary.MODEL_FORMATS) == validation.FORMATS
    assert tuple(_crd_training_job_spec()["model"]["properties"]["format"]["enum"]) == (
        vocabulary.MODEL_FORMATS)
    # `gpuplan strip --compress` spells the choices in a file #30 owns; it must agree.
    assert _cli_choices("--compress") == {vocabulary.MODEL_COMPRESSIONS}


@pytest.mark.parametrize(("kind", "compress"), [
    ("gzip", gzip.compress), ("xz", lzma.compress),
    ("zstd", zstandard.ZstdCompressor().compress)])
def test_the_magic_bytes_are_what_the_compressors_write(kind: str, compress: Any) -> None:
    data = compress(b"\x08\x07onnx model bytes")
    assert data.startswith(vocabulary.MODEL_COMPRESSION_MAGIC[kind])
    assert loading.compression_of(data) == kind
    modelsource.check_format(data, kind)
    with pytest.raises(InvalidModelSourceError):
        modelsource.check_format(data, "raw")


def test_the_dims_caps_agree() -> None:
    """A TrainingJob carries at most the CRD's count, which fits inside what one estimator
    request may carry; the HTTP schema states the request's cap."""
    crd = _crd_training_job_spec()["training"]["properties"]["dims"]
    assert crd["maxProperties"] == validation.MAX_TRAINING_JOB_DIMS <= limits.MAX_DIMS
    assert _openapi_property("TrainingBody", "dims")["maxProperties"] == limits.MAX_DIMS


def _memory_breakdown() -> tuple[memory.MemoryBreakdown, sharding.ShardedMemory]:
    graph = examples.resnet50(2)
    settings = TrainingSettings(batch_size=2, mode="train")
    breakdown = memory.training_memory(graph, settings)
    strategy = strategies.MemoryStrategy(zero_stage=1)
    return breakdown, sharding.memory_under(breakdown, strategy, settings=settings,
                                            data_parallel=4, gpus_per_node=4)


def test_the_memory_breakdown_is_declared_once() -> None:
    total = vocabulary.MEMORY_TOTAL
    breakdown, sharded = _memory_breakdown()
    assert list(breakdown.as_dict()) == [*vocabulary.MEMORY_PARTS, total]
    assert list(sharded.as_dict()) == [*vocabulary.SHARDED_MEMORY_PARTS, total]
    assert list(responses.Memory.model_fields) == [*vocabulary.MEMORY_PARTS, total]
    assert list(responses.StrategyMemory.model_fields) == [
        *vocabulary.SHARDED_MEMORY_PARTS, total]
    assert [part for part, _ in documents.MEMORY_PARTS] == list(vocabulary.MEMORY_PARTS)
    assert sharded.total_bytes == sum(
        v for k, v in sharded.as_dict().items() if k not in (total, "host_bytes"))


def test_the_crd_describes_every_sharded_memory_part() -> None:
    doc = (REPO_ROOT / "crds" / "trainingjobs.gpuplan.io.yaml").read_text()
    at = doc.index("memoryBytesByPart:")
    description = " ".join(doc[at:doc.index("maxProperties", at)].split())
    for part in (*vocabulary.SHARDED_MEMORY_PARTS, vocabulary.MEMORY_TOTAL):
        assert resources.memory_part_key(part) in description, part
