"""`gpuplan bench --backend torch`: PyTorch eager layers timed forward and forward+backward,
cross-checked against the ONNX units of the same plan items, with real torch and onnxruntime."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
import torch

from gpuplan_estimator.bench import runner, sweep, torch_units, units
from gpuplan_estimator.core import errors
from gpuplan_estimator.perfdb.store import PerfStore
from gpuplan_testing.bench_fixtures import TARGET, settings

CONV = {"batch": 2, "c_in": 4, "c_out": 6, "h": 9, "w": 9, "kernel_h": 3, "kernel_w": 3,
        "stride_h": 2, "stride_w": 2, "pad_h": 1, "pad_w": 1, "dilation_h": 1, "dilation_w": 1,
        "groups": 2}
POOL = {"batch": 2, "channels": 3, "h": 8, "w": 8, "kernel_h": 3, "kernel_w": 3, "stride_h": 2,
        "stride_w": 2}
ROWS = {"rows": 6, "cols": 10}


def shipped_ops() -> list[tuple[str, str]]:
    specs = sweep.load_specs([str(runner.DEFAULT_SWEEP_DIR)])
    return sorted({(s.kernel, op) for s in specs for op in s.ops})


def item_for(kernel: str, op: str, **override: int) -> sweep.PlanItem:
    dims: dict[str, int] = {
        "gemm": {"batch": 3, "m": 5, "k": 7, "n": 4, "bias": 1},
        "conv2d": CONV,
        "pool": POOL,
        "layernorm": ROWS,
        "batchnorm": ROWS,
        "softmax": ROWS,
        "elementwise": {**ROWS, "operands": 3 if op == "lrn" else
                        2 if op in ("add", "sub", "mul", "div", "pow") else 1},
        "memcpy": {"elements": 640},
    }[kernel]
    return sweep.PlanItem(kernel, op, "float32", {**dims, **override})


def onnx_output_shape(item: sweep.PlanItem) -> tuple[int, ...]:
    unit = units.build_unit(item, np.random.default_rng(0))
    session = ort.InferenceSession(unit.model.SerializeToString(),
                                   providers=["CPUExecutionProvider"])
    (out,) = session.run(None, dict(unit.feeds))
    return tuple(out.shape)


@pytest.mark.parametrize(("kernel", "op"), shipped_ops())
def test_every_shipped_op_has_a_torch_layer_shaped_like_its_onnx_unit(kernel: str,
                                                                      op: str) -> None:
    item = item_for(kernel, op)
    layer = torch_units.build_unit(item, np.random.default_rng(0), "cpu")
    out = layer.forward()
    assert not out.requires_grad  # the forward is timed without an autograd graph
    assert tuple(out.shape) == onnx_output_shape(item)
    layer.forward_backward()


def test_lrn_is_four_dimensional_like_a_cnn_layer() -> None:
    # PyTorch runs a 4-D LRN through avg_pool3d, a 3-D one through a faster avg_pool2d path.
    out = torch_units.build_unit(item_for("elementwise", "lrn"), np.random.default_rng(0),
                                 "cpu").forward()
    assert out.dim() == 4 and out.shape[1] == ROWS["rows"]


def test_torch_batchnorm_normalises_with_batch_statistics() -> None:
    rng = np.random.default_rng(0)
    tensors = torch_units._Tensors(torch, torch.float32, "cpu", rng)
    fn = torch_units._batchnorm(torch, tensors, "batchnorm", ROWS)
    _, scale, bias = tensors.leaves
    with torch.no_grad():
        out = fn()
    # Training mode: every channel comes out with its batch mean removed, i.e. mean = bias.
    assert torch.allclose(out.mean(dim=(0, 2, 3)), bias, atol=1e-5)
    assert scale.requires_grad and bias.requires_grad


def test_a_half_batchnorm_keeps_fp32_parameters_as_autocast_runs_it() -> None:
    tensors = torch_units._Tensors(torch, torch.bfloat16, "cpu", np.random.default_rng(0))
    fn = torch_units._batchnorm(torch, tensors, "batchnorm", ROWS)
    x, scale, bias = tensors.leaves
    assert x.dtype == torch.bfloat16
    assert scale.dtype == bias.dtype == torch.float32
    with torch.no_grad():
        assert fn().dtype == torch.bfloat16


@pytest.mark.parametrize(("dtype", "torch_source", "onnx_source"), [
    ("float32", torch.bfloat16, np.float16),  # a cast up: gradients back to fp32 weights
    ("bfloat16", torch.float32, None),  # autocast's casts down (no bf16 in onnxruntime)
    ("float16", torch.float32, np.float32),
])
def test_a_cast_row_writes_its_dtype_from_the_other_side_of_autocast(
        dtype: str, torch_source: torch.dtype, onnx_source: type[np.generic] | None) -> None:
    item = sweep.PlanItem("elementwise", "cast", dtype, {**ROWS, "operands": 1})
    tensors = torch_units._Tensors(torch, getattr(torch, dtype), "cpu", np.random.default_rng(0))
    cast = torch_units._elementwise(torch, tensors, "cast", item.dims)
    (x,) = tensors.leaves
    assert x.dtype == torch_source and cast().dtype == getattr(torch, dtype)
    if onnx_source is not None:
        unit = units.build_unit(item, np.random.default_rng(0))
        assert unit.feeds["x"].dtype == onnx_source
        session = ort.InferenceSession(unit.model.SerializeToString(),
                                       providers=["CPUExecutionProvider"])
        (out,) = session.run(None, dict(unit.feeds))
        assert out.dtype == np.dtype(dtype) and out.shape == (ROWS["rows"], ROWS["cols"])


def test_depthwise_conv_matches_onnx_shapes() -> None:
    item = item_for("conv2d", "conv", c_in=6, c_out=6, groups=6)
    layer = torch_units.build_unit(item, np.random.default_rng(2), "cpu")
    assert tuple(layer.forward().shape) == onnx_output_shape(item)
    layer.forward_backward()


@pytest.mark.parametrize("bias", [0, 1])
def test_gemm_with_and_without_bias_matches_onnx_shapes(bias: int) -> None:
    item = item_for("gemm", "matmul", bias=bias, batch=1)
    out = torch_units.build_unit(item, np.random.default_rng(1), "cpu").forward()
    assert tuple(out.shape) == onnx_output_shape(item)


def test_forward_backward_reaches_every_input_and_parameter() -> None:
    rng = np.random.default_rng(0)
    tensors = torch_units._Tensors(torch, torch.float32, "cpu", rng)
    fn = torch_units._conv(torch, tensors, "conv", CONV)
    layer = torch_units._unit(torch, fn, tensors.leaves)
    layer.forward_backward()
    first = [leaf.grad.clone() for leaf in tensors.leaves]
    assert len(first) == 2 and all(g.abs().sum() > 0 for g in first)
    layer.forward_backward()  # gradients are reset, not accumulated, between timed runs
    assert all(torch.equal(a, leaf.grad) for a, leaf in zip(first, tensors.leaves, strict=True))


def test_torch_run_records_forward_and_forward_backward(sweep_dir: Path,
                                                         store: PerfStore) -> None:
    report = runner.run_bench(settings(sweep_dir, backend="torch"), store, target=TARGET)
    assert (report.status, report.rows_added) == ("done", 8)
    assert report.backend == f"torch-{torch.__version__}-cpu"
    frame = store.measurements(run_id=report.run_id)
    assert (frame["latency_ms"] > 0).all() and (frame["fwd_bwd_latency_ms"] > 0).all()
    assert set(frame["backend"]) == {report.backend}
    (run,) = store.runs()
    assert run.backend_version == torch.__version__
    again = runner.run_bench(settings(sweep_dir, backend="torch"), store, target=TARGET)
    assert again.resumed and again.rows_added == 0


def test_onnxruntime_rows_have_no_forward_backward_time(sweep_dir: Path,
                                                        store: PerfStore) -> None:
    report = runner.run_bench(settings(sweep_dir, samples=2), store, target=TARGET)
    rows = store.measurements(run_id=report.run_id)
    assert report.rows_added > 0 and len(rows) == report.rows_added
    assert rows["fwd_bwd_latency_ms"].isna().all()


def test_missing_torch_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "torch", None)  # `import torch` raises ImportError
    with pytest.raises(errors.GpuplanError, match="needs PyTorch"):
        runner.backend_name("torch", "cpu")


@pytest.mark.parametrize(("kernel", "op", "match"), [
    ("elementwise", "cumsum", "no torch unit"),
    ("pool", "lppool", "not one of"),
    ("attention", "sdpa", "no torch unit builder"),
])
def test_unknown_items_are_refused_by_name(kernel: str, op: str, match: str) -> None:
    item = sweep.PlanItem(kernel, op, "float32", {**ROWS, **POOL, "operands": 1})
    with pytest.raises(errors.GpuplanError, match=match):
        torch_units.build_unit(item, np.random.default_rng(0), "cpu")


def test_missing_dim_names_the_dim() -> None:
    with pytest.raises(errors.GpuplanError, match="'cols'"):
        torch_units.build_unit(sweep.PlanItem("softmax", "softmax", "float32", {"rows": 2}),
                               np.random.default_rng(0), "cpu")
