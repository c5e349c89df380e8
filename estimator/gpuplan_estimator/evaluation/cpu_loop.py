"""CPU closed loop: predict the forward time of ONNX's light test models on this machine and
measure it with onnxruntime in the same run.

The light models (``onnx/backend/test/data/light``) are structure-only (weights are
ConstantOfShape zeros), which is fine for timing. They are exported at batch 1;
`graph.batching.fixed_batch` rewrites the input's leading dim and the batch-major Reshape targets
so batch 8 runs too.
Timing follows the project's rule: one warm-up run, then the mean of runs 2..N+1.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx

from gpuplan_estimator import graph
from gpuplan_estimator.core import errors
from gpuplan_estimator.core.progress import Progress, Step, silent
from gpuplan_estimator.cost.predictors import LatencyPredictor
from gpuplan_estimator.devices.catalog import DeviceSpec
from gpuplan_estimator.graph import batching
from gpuplan_estimator.planning import estimates
from gpuplan_estimator.step.decomposition import TrainingSettings
from gpuplan_estimator.step.frameworks import ONNXRUNTIME

LIGHT_MODELS = ("resnet50", "vgg19", "bvlc_alexnet", "densenet121", "inception_v1",
                "inception_v2", "shufflenet", "squeezenet", "zfnet512")
BATCHES = (1, 8)
MAX_RUN_SECONDS = 120.0  # per model and batch: a cap so a slow machine cannot hang `make eval`


def light_dir() -> Path:
    """Directory of ONNX's light test models inside the installed onnx package."""
    return Path(onnx.__file__).parent / "backend" / "test" / "data" / "light"


@dataclass(frozen=True)
class CpuTimingSettings:
    """How the CPU loop times each light model with onnxruntime."""
    runs: int = 10
    """Timed runs after the warm-up (mean of runs 2..N+1)."""
    sessions: int = 3
    """Independent onnxruntime sessions per model; the median of their means is kept, so one
    slow session does not decide. On the 2-core VM single-session times of ResNet-50 at batch 1
    were 38.6, 57.8 and 44.0 ms in three eval runs, far more spread than runs within a session."""
    threads: int = 0
    """onnxruntime intra-op threads; 0 = its default (one per core)."""
    seed: int = 0
    """random_state of the input tensors."""


@dataclass(frozen=True)
class CpuResult:
    """Predicted vs measured forward time (ms) of one light model at one batch size."""
    model: str
    batch: int
    predictor: str  # label of the predictor that priced most of the time
    predicted_ms: float
    p10_ms: float
    p90_ms: float
    measured_ms: float
    runs: int
    mode: str = "inference"  # or "train": one SGD step in PyTorch (`torch_loop`)

    @property
    def ape(self) -> float:
        """Absolute error relative to the measurement, as a fraction (0.1 = 10 %)."""
        return abs(self.predicted_ms - self.measured_ms) / self.measured_ms

    @property
    def covered(self) -> bool:
        """Whether the measured time lies within the predicted p10..p90 interval."""
        return self.p10_ms <= self.measured_ms <= self.p90_ms


def measure_ms(model_bytes: bytes, settings: CpuTimingSettings,
               clock: Callable[[], float] = time.perf_counter) -> float:
    """Median over `settings.sessions` fresh sessions of the mean of runs 2..N+1."""
    if settings.sessions < 1:
        raise errors.InvalidRequestError("sessions", f"must be >= 1, got {settings.sessions}")
    return float(np.median([_session_mean_ms(model_bytes, settings, clock)
                            for _ in range(settings.sessions)]))


def _session_mean_ms(model_bytes: bytes, settings: CpuTimingSettings,
                     clock: Callable[[], float]) -> float:
    """Mean wall time of runs 2..N+1 of the model in one onnxruntime CPU session."""
    import onnxruntime as ort  # the only onnxruntime user in evaluation; imported at the edge

    opts = ort.SessionOptions()
    if settings.threads:
        opts.intra_op_num_threads = settings.threads
    session = ort.InferenceSession(model_bytes, opts, providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(settings.seed)
    feeds = {}
    for value in session.get_inputs():
        if not all(isinstance(d, int) for d in value.shape):
            raise errors.UnboundDimError([str(d) for d in value.shape], value.name)
        feeds[value.name] = rng.standard_normal(value.shape).astype(np.float32)
    return mean_run_ms(lambda: session.run(None, feeds), settings.runs, clock)


def mean_run_ms(run: Callable[[], object], runs: int, clock: Callable[[], float]) -> float:
    """Mean wall time in ms of up to `runs` calls of `run`, after one untimed warm-up call.

    The warm-up pays for allocations and kernel selection; timing stops early past
    `MAX_RUN_SECONDS`.
    """
    run()
    times = []
    deadline = clock() + MAX_RUN_SECONDS
    for _ in range(runs):
        start = clock()
        run()
        times.append(clock() - start)
        if clock() > deadline:
            break
    return 1000.0 * float(np.mean(times))


def evaluate_model(
    path: Path, batch: int, *, device: DeviceSpec, predictor: LatencyPredictor,
    settings: CpuTimingSettings,
) -> CpuResult:
    """Predict and measure one light model at one batch."""
    proto = batching.fixed_batch(onnx.load(os.fspath(path), load_external_data=False), batch)
    data = proto.SerializeToString()
    name = path.stem.removeprefix("light_")
    g = graph.load_model(data, name=name)
    (est,) = estimates.estimate(g, [device], TrainingSettings(
        batch_size=batch, mode="inference", framework=ONNXRUNTIME),
                               predictor=predictor)
    measured = measure_ms(data, settings)
    return CpuResult(name, batch, main_predictor(est.predictor), est.forward_ms,
                     est.interval_ms[0], est.interval_ms[1], measured, settings.runs)


def main_predictor(shares: Mapping[str, float]) -> str:
    """The label of the predictor that priced the largest share of the time."""
    return max(shares.items(), key=lambda kv: kv[1])[0] if shares else "none"


ModelEvaluator = Callable[..., CpuResult]
"""`evaluate_model` of this module or of `torch_loop`: (path, batch, *, device, predictor,
settings) -> CpuResult."""


def evaluate_light_models(
    *, device: DeviceSpec, predictor: LatencyPredictor, settings: CpuTimingSettings,
    models: Sequence[str] = LIGHT_MODELS, batches: Sequence[int] = BATCHES,
    directory: Path | None = None, progress: Progress = silent,
    evaluate: ModelEvaluator | None = None, task: str = "eval: CPU inference",
) -> tuple[CpuResult, ...]:
    """Every model at every batch, priced and measured by `evaluate` (default: inference).

    Each (model, batch) is one step of `task` reported to `progress`, naming the prediction
    and the measurement.
    """
    one = evaluate if evaluate is not None else evaluate_model
    root = directory if directory is not None else light_dir()
    files = {name: root / f"light_{name}.onnx" for name in models}
    for path in files.values():
        if not path.is_file():
            raise errors.InvalidRequestError("models", f"{path} does not exist")
    cases = [(name, batch) for name in models for batch in batches]
    out: list[CpuResult] = []
    progress(Step(task, 0, len(cases)))
    for done, (name, batch) in enumerate(cases, start=1):
        result = one(files[name], batch, device=device, predictor=predictor, settings=settings)
        out.append(result)
        progress(Step(task, done, len(cases), f"{name} b{batch}: predicted "
                      f"{result.predicted_ms:.1f} ms, measured {result.measured_ms:.1f} ms"))
    return tuple(out)
