"""Predictor selection: bundle backends by name or prefix, CPU prices only from the CPU backend."""

from __future__ import annotations

import pytest

from gpuplan_estimator import devices
from gpuplan_estimator.core import layers
from gpuplan_estimator.core.errors import InvalidRequestError
from gpuplan_estimator.core.workload import Phase, WorkItem
from gpuplan_estimator.latency import selection


def test_cpu_backend_resolves_exact_names_and_unique_prefixes() -> None:
    manifest = {"backends": ["onnxruntime-1.23.2-cpu", "pytorch-2.1.0+cu121",
                             "torch-2.15.0-cpu", "torch-2.16.0-cpu"],
                "default_backends": {"cpu": "onnxruntime-1.23.2-cpu"}}
    assert selection.cpu_backend_name(manifest, "onnx") == "onnxruntime-1.23.2-cpu"
    assert selection.cpu_backend_name(manifest, "torch-2.16.0-cpu") == "torch-2.16.0-cpu"
    with pytest.raises(InvalidRequestError, match=r"cpu_backend.*several match"):
        selection.cpu_backend_name(manifest, "torch")
    with pytest.raises(InvalidRequestError, match=r"none matches.*onnxruntime-1\.23\.2-cpu"):
        selection.cpu_backend_name(manifest, "pytorch")  # a GPU backend does not price CPUs


def test_cpu_backend_changes_cpu_prices_only() -> None:
    item = WorkItem(layer="fc", family=layers.OpFamily.MATMUL, kernel="gemm",
                    phase=Phase.FORWARD, dims={"batch": 1, "m": 64, "k": 1024, "n": 1024,
                                               "bias": 1},
                    dtype="float32", flops=2 * 64 * 1024 * 1024, bytes_moved=4 * 1024 * 1200,
                    op="Gemm")
    cpu, t4 = devices.resolve_device("cpu"), devices.resolve_device("t4")
    default, _ = selection.select_predictor(None)
    torch_cpu, source = selection.select_predictor(None, "torch")
    assert source.endswith("CPU as " + selection.cpu_backend_name(
        default.bundle.manifest, "torch"))  # type: ignore[attr-defined]
    assert torch_cpu.predict([item], t4).median_ms == default.predict([item], t4).median_ms
    assert torch_cpu.predict([item], cpu).median_ms != default.predict([item], cpu).median_ms
