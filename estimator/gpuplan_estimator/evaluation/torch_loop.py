"""CPU closed loop, training step: light models converted to PyTorch, one SGD step timed on this
machine and predicted by the estimator's training-step decomposition (PyTorch eager).

The light models keep their weights as ConstantOfShape outputs (structure only); `with_weights`
turns them into random initializers so onnx2torch can convert the graph into an ``nn.Module``.
Five of the nine convert with onnx2torch 1.5: the others use Dropout-7 or asymmetric average
pool padding, which it refuses; `CONVERTIBLE` lists the ones that do.
Timing follows the project's rule: one warm-up step, then the mean of steps 2..N+1.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import numpy_helper

from gpuplan_estimator import graph
from gpuplan_estimator.core import errors
from gpuplan_estimator.core.progress import Progress, silent
from gpuplan_estimator.cost.predictors import LatencyPredictor
from gpuplan_estimator.devices.catalog import DeviceSpec
from gpuplan_estimator.evaluation.cpu_loop import (
    BATCHES,
    CpuResult,
    CpuTimingSettings,
    evaluate_light_models,
    main_predictor,
    mean_run_ms,
)
from gpuplan_estimator.graph import batching
from gpuplan_estimator.planning import estimates
from gpuplan_estimator.step.decomposition import TrainingSettings
from gpuplan_estimator.step.frameworks import PYTORCH_EAGER

CONVERTIBLE = ("resnet50", "densenet121", "inception_v2", "shufflenet", "zfnet512")
OPTIMIZER = "sgd"
LEARNING_RATE = 1e-3
MIN_IR_VERSION = 4  # IR 3 needs every initializer listed as a graph input too


def with_weights(model: onnx.ModelProto, rng: np.random.Generator) -> onnx.ModelProto:
    """A copy of `model` with random weights, so onnx2torch can convert it.

    Constant-shaped weights become random initializers (fan-in scaled) and the graph inputs
    are only the free inputs (IR >= 4).
    """
    out = onnx.ModelProto()
    out.CopyFrom(model)
    inits = {t.name: t for t in out.graph.initializer}
    kept = []
    for node in out.graph.node:
        shape_init = inits.get(node.input[0]) if node.op_type == "ConstantOfShape" else None
        if shape_init is None:
            kept.append(node)
            continue
        shape = tuple(int(v) for v in numpy_helper.to_array(shape_init))
        fan_in = int(np.prod(shape[1:])) if len(shape) > 1 else 1
        values = (rng.standard_normal(shape) / np.sqrt(max(fan_in, 1))).astype(np.float32)
        out.graph.initializer.append(numpy_helper.from_array(values, node.output[0]))
    del out.graph.node[:]
    out.graph.node.extend(kept)
    names = {t.name for t in out.graph.initializer}
    free = [value for value in out.graph.input if value.name not in names]
    del out.graph.input[:]
    out.graph.input.extend(free)
    out.ir_version = max(out.ir_version, MIN_IR_VERSION)
    return out


def to_torch(model: onnx.ModelProto) -> Any:
    """The ``nn.Module`` onnx2torch builds from `model` (which needs real initializers)."""
    try:
        from onnx2torch import convert  # type: ignore[import-not-found, unused-ignore]
    except ImportError:
        raise errors.GpuplanError(
            "the CPU training step needs PyTorch and onnx2torch (pip install 'gpuplan[torch]'), "
            "or run `gpuplan eval --no-torch`") from None
    try:
        return convert(model)
    except NotImplementedError as exc:
        raise errors.InvalidModelError(f"{model.graph.name}: onnx2torch cannot convert: {exc}"
                                       ) from exc


def measure_train_step_ms(
    module: Any, input_shape: Sequence[int], settings: CpuTimingSettings,
    clock: Callable[[], float] = time.perf_counter,
) -> float:
    """Mean wall time of steps 2..N+1 of forward, mean loss, backward and an SGD step."""
    import torch  # type: ignore[import-not-found, unused-ignore]

    if settings.threads:
        torch.set_num_threads(settings.threads)
    generator = torch.Generator().manual_seed(settings.seed)
    x = torch.randn(*input_shape, generator=generator)
    module.train()
    optimizer = torch.optim.SGD(module.parameters(), lr=LEARNING_RATE)

    def step() -> None:
        optimizer.zero_grad(set_to_none=True)
        module(x).float().mean().backward()
        optimizer.step()

    return mean_run_ms(step, settings.runs, clock)  # the warm-up also creates oneDNN primitives


def evaluate_model(
    path: Path, batch: int, *, device: DeviceSpec, predictor: LatencyPredictor,
    settings: CpuTimingSettings,
) -> CpuResult:
    """Predict and measure one SGD training step of one light model at one batch."""
    proto = batching.fixed_batch(onnx.load(str(path), load_external_data=False), batch)
    name = path.stem.removeprefix("light_")
    g = graph.load_model(proto.SerializeToString(), name=name)
    (est,) = estimates.estimate(g, [device], TrainingSettings(
        batch_size=batch, mode="train", optimizer=OPTIMIZER, framework=PYTORCH_EAGER),
        predictor=predictor)
    weighted = with_weights(proto, np.random.default_rng(settings.seed))
    (free,) = weighted.graph.input
    shape = [d.dim_value for d in free.type.tensor_type.shape.dim]
    measured = measure_train_step_ms(to_torch(weighted), shape, settings)
    return CpuResult(name, batch, main_predictor(est.predictor), est.step_time_ms,
                     est.interval_ms[0], est.interval_ms[1], measured, settings.runs, mode="train")


def evaluate_training_steps(
    *, device: DeviceSpec, predictor: LatencyPredictor, settings: CpuTimingSettings,
    models: Sequence[str] = CONVERTIBLE, batches: Sequence[int] = BATCHES,
    progress: Progress = silent,
) -> tuple[CpuResult, ...]:
    """Predict and measure one SGD training step of each convertible light model."""
    return evaluate_light_models(device=device, predictor=predictor, settings=settings,
                                 models=models, batches=batches, progress=progress,
                                 task="eval: CPU training step",
                                 evaluate=evaluate_model)
