"""What "the shortcut prices like the full export" compares (tests of `graph.hf_blocks` and
`graph.hf_whisper`): the kernels a graph runs, and its priced estimates on two GPUs."""

from __future__ import annotations

import pytest

from gpuplan_estimator import devices, graph
from gpuplan_estimator.core.layers import OpFamily
from gpuplan_estimator.latency import selection
from gpuplan_estimator.planning import estimates
from gpuplan_estimator.step.decomposition import TrainingSettings

PARITY_DEVICES = ("t4", "h100-sxm-80gb")


def kernels(source: bytes, batch: int, sequence: int) -> list[tuple[object, ...]]:
    """Every kernel, in order: op, family, FLOPs, bytes moved, parameters (shape-only
    layers, which run nothing, left out)."""
    g = graph.load_model(source, batch=batch, dim_bindings={"sequence": sequence})
    return [(ly.op_type, ly.family, ly.flops, ly.bytes_read, ly.bytes_written,
             ly.parameter_count) for ly in g.layers if ly.family is not OpFamily.SHAPE_ONLY]


def priced(source: bytes, batch: int, sequence: int, mode: str = "train"
           ) -> tuple[estimates.DeviceStepEstimate, ...]:
    """The shipped predictor's fp32 AdamW eager estimates on `PARITY_DEVICES`."""
    predictor, _ = selection.select_predictor(None, None)
    catalog = devices.load_catalog()
    specs = [devices.resolve_device(d, catalog) for d in PARITY_DEVICES]
    settings = TrainingSettings(batch_size=batch, mode=mode, optimizer="adamw",
                                precision="fp32", framework="pytorch-eager", attention="eager")
    g = graph.load_at_batch(source, batch, {"sequence": sequence})
    return estimates.estimate(g, specs, settings, predictor=predictor, epochs=None,
                              dataset_size=None, host_probes=None)


def assert_priced_alike(full: bytes, written: bytes, batch: int, sequence: int,
                        mode: str = "train", total_rel: float = 1e-4) -> None:
    """The same GPU time to the last digit, the same weights, gradients and optimizer state;
    the total within `total_rel` (the export holds its folded buffers and shape constants as
    live tensors, a fixed few hundred KiB at most)."""
    for a, b in zip(priced(full, batch, sequence, mode), priced(written, batch, sequence, mode),
                    strict=True):
        assert b.gpu_busy_ms == pytest.approx(a.gpu_busy_ms, rel=1e-12)
        assert b.backward_ms == pytest.approx(a.backward_ms, rel=1e-12)
        assert b.optimizer_ms == pytest.approx(a.optimizer_ms, rel=1e-12)
        for part in ("parameters_bytes", "gradients_bytes", "optimizer_state_bytes"):
            assert getattr(b.memory, part) == getattr(a.memory, part)
        assert b.memory.total_bytes == pytest.approx(a.memory.total_bytes, rel=total_rel)
