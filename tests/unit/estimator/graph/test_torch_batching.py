"""Issue #35: a `--torch` factory estimated at another batch than its example's.

A TransformerEncoderLayer with 4 heads exported at batch 4 keeps its batch in Reshape targets
next to the head count, so re-batching the fixed export was refused. The factory is now
exported at the asked batch (or, failing that, with a symbolic batch)."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import onnx
import pytest

from gpuplan_estimator import graph
from gpuplan_estimator.core import errors
from gpuplan_estimator.graph import exporting
from gpuplan_estimator.interfaces.cli import main

torch = pytest.importorskip("torch")  # the gpuplan[torch] extra; CI installs it


def _encoder_layer(batch: int) -> Callable[[], tuple[Any, tuple[Any, ...]]]:
    def build() -> tuple[Any, tuple[Any, ...]]:
        layer = torch.nn.TransformerEncoderLayer(d_model=64, nhead=4, dim_feedforward=128,
                                                 batch_first=True)
        return layer, (torch.zeros(batch, 16, 64),)
    return build


class _FixedBatch(torch.nn.Module):  # type: ignore[misc]
    """Code that writes its batch down: no other batch can be exported."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(8, 8)

    def forward(self, x: Any) -> Any:
        return self.linear(x).reshape(4, 2, 8)


def _flops(model: bytes, batch: int) -> int:
    return sum(layer.flops for layer in graph.load_at_batch(model, batch, {}).layers)


def test_the_fixed_export_of_the_example_cannot_be_rebatched() -> None:
    """The failure the issue reports, kept as the reason for the change below."""
    at_four = exporting.from_torch_factory(_encoder_layer(4))
    with pytest.raises(errors.InvalidRequestError, match="re-batching it to 16 failed"):
        graph.load_at_batch(at_four, 16, {})


def test_another_batch_is_exported_at_that_batch() -> None:
    asked = exporting.from_torch_factory(_encoder_layer(4), batch=16)
    native = exporting.from_torch_factory(_encoder_layer(16))
    assert asked == native
    # Per-sample work scales with the batch; a few scalar ops do not (hence approx).
    assert _flops(asked, 16) == pytest.approx(
        4 * _flops(exporting.from_torch_factory(_encoder_layer(4)), 4), rel=1e-5)


def test_a_symbolic_batch_binds_to_the_same_graph_as_a_fixed_one() -> None:
    build = _encoder_layer(4)
    with torch.device("meta"):
        module, args = build()
    dynamic = exporting.export_module(module.to("meta").eval(),
                                      tuple(a.to("meta") for a in args), label="t",
                                      dynamic_batch=True)
    leading = onnx.load_from_string(dynamic).graph.input[0].type.tensor_type.shape.dim[0]
    assert leading.dim_param == exporting.BATCH_DIM
    for batch in (1, 16, 48):
        assert _flops(dynamic, batch) == _flops(
            exporting.from_torch_factory(_encoder_layer(batch)), batch)


def test_a_module_that_fixes_its_batch_falls_back_to_its_example() -> None:
    fixed = exporting.from_torch_factory(lambda: (_FixedBatch(), (torch.zeros(4, 2, 8),)),
                                         batch=16)
    assert fixed == exporting.from_torch_factory(
        lambda: (_FixedBatch(), (torch.zeros(4, 2, 8),)))


FACTORY = """
import torch


def build():
    layer = torch.nn.TransformerEncoderLayer(d_model=64, nhead=4, dim_feedforward=128,
                                             batch_first=True)
    return layer, (torch.zeros({batch}, 16, 64),)
"""


def test_cli_estimates_a_factory_at_another_batch(tmp_path: Any, monkeypatch: pytest.MonkeyPatch,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "at_four.py").write_text(FACTORY.format(batch=4))
    (tmp_path / "at_sixteen.py").write_text(FACTORY.format(batch=16))
    monkeypatch.chdir(tmp_path)
    docs = []
    for argv in (["--torch", "at_four:build", "--batch", "16"], ["--torch", "at_sixteen:build"]):
        code = main.main(["estimate", *argv, "--device", "t4", "--mode", "train", "--json"])
        out, err = capsys.readouterr()
        assert code == 0, err
        docs.append(json.loads(out))
    rebatched, native = docs
    assert rebatched["settings"]["batch_size"] == native["settings"]["batch_size"] == 16
    assert rebatched["devices"] == native["devices"]
