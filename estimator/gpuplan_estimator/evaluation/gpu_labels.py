"""Whole-model GPU evaluation: predict every row of the model-labels set and pair it with the
measurement.

Each label row is one (GPU, model, mode, sequence, batch) iteration time of HF eager PyTorch at
fp32 (`../shared/data/model-labels/README.md`). The model is rebuilt structure-only by `zoo`
from its public config, parsed by `graph`, priced by `estimate` with each predictor given, and
compared with ``fw_ms`` (inference) or ``e2e_latency_ms`` = forward + backward (training; the
labels exclude the optimizer step, so the predicted optimizer time is left out too).
"""

from __future__ import annotations

import csv
import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from gpuplan_estimator import graph
from gpuplan_estimator.core import errors
from gpuplan_estimator.core.layers import ModelGraph
from gpuplan_estimator.core.progress import Progress, silent, track
from gpuplan_estimator.core.vocabulary import SEQUENCE_DIM
from gpuplan_estimator.cost.predictors import LatencyPredictor
from gpuplan_estimator.devices.catalog import Catalog, DeviceSpec
from gpuplan_estimator.graph import zoo
from gpuplan_estimator.planning import estimates
from gpuplan_estimator.step import frameworks
from gpuplan_estimator.step.decomposition import TrainingSettings

LABEL_COLUMNS = ("gpu", "model", "mode", "seq_len", "batch", "fusion", "e2e_latency_ms", "fw_ms",
                 "bw_ms")
MAX_LABEL_BYTES = 4 * 2**20
# Models the zoo cannot build, with the reason reported next to the skipped rows.
UNSUPPORTED_MODELS: Mapping[str, str] = {
    "switchxl4": "MoE switch_transformers: no structure-only builder (zoo)",
}
LABEL_MODES = {"inf": "inference", "train": "train"}


@dataclass(frozen=True)
class LabelRow:
    """One measured whole-model iteration (ms)."""

    gpu: str
    model: str
    mode: str  # "inference" | "train"
    seq_len: int
    batch: int
    fused: bool  # torch.compile run
    e2e_ms: float
    fw_ms: float
    bw_ms: float

    @property
    def measured_ms(self) -> float:
        """What a prediction of this row is compared with: forward, or forward + backward."""
        return self.e2e_ms if self.mode == "train" else self.fw_ms


@dataclass(frozen=True)
class RowResult:
    """A label row priced by one predictor (the whole iteration and its forward part)."""

    row: LabelRow
    device: str  # catalog key
    predictor: str
    predicted_ms: float
    p10_ms: float
    p90_ms: float
    forward_ms: float

    @property
    def ape(self) -> float:
        """Absolute error relative to the measured label, as a fraction (0.1 = 10 %)."""
        return abs(self.predicted_ms - self.row.measured_ms) / self.row.measured_ms

    @property
    def covered(self) -> bool:
        """Whether the measured label lies within the predicted p10..p90 interval."""
        return self.p10_ms <= self.row.measured_ms <= self.p90_ms


@dataclass(frozen=True)
class Skipped:
    """A label row that was not priced, with the reason."""
    row: LabelRow
    reason: str


def read_labels(path: str | os.PathLike[str]) -> tuple[LabelRow, ...]:
    """Parse labels.csv; errors name the file, line and column."""
    p = Path(path)
    if p.stat().st_size > MAX_LABEL_BYTES:
        raise errors.InvalidRequestError(str(p), f"larger than {MAX_LABEL_BYTES} bytes")
    with p.open(encoding="utf-8", newline="") as f:
        reader = csv.DictReader(f)
        missing = [c for c in LABEL_COLUMNS if c not in (reader.fieldnames or [])]
        if missing:
            raise errors.InvalidRequestError(str(p), f"missing columns {', '.join(missing)}")
        return tuple(_parse_row(rec, f"{p}:{n + 2}") for n, rec in enumerate(reader))


def _parse_row(rec: Mapping[str, str], where: str) -> LabelRow:
    try:
        mode = LABEL_MODES[rec["mode"]]
    except KeyError:
        raise errors.InvalidRequestError(
            f"{where}: mode", f"unknown mode {rec['mode']!r}") from None
    if rec["fusion"] not in ("yes", "no"):
        raise errors.InvalidRequestError(f"{where}: fusion", f"want yes/no, got {rec['fusion']!r}")
    try:
        row = LabelRow(
            gpu=rec["gpu"], model=rec["model"], mode=mode, seq_len=int(rec["seq_len"]),
            batch=int(rec["batch"]), fused=rec["fusion"] == "yes",
            e2e_ms=float(rec["e2e_latency_ms"]), fw_ms=float(rec["fw_ms"]),
            bw_ms=float(rec["bw_ms"]),
        )
    except ValueError as exc:
        raise errors.InvalidRequestError(where, f"bad number: {exc}") from None
    if row.seq_len <= 0 or row.batch <= 0 or not row.measured_ms > 0:
        raise errors.InvalidRequestError(where, "seq_len, batch and the latency must be positive")
    return row


def label_device(row: LabelRow, catalog: Catalog) -> DeviceSpec:
    """The labels spell torch's device name with '_' for ' ' (e.g. Tesla_V100-PCIE-32GB)."""
    return catalog.resolve(row.gpu.replace("_", " "))


GraphBuilder = Callable[[str, int, int], ModelGraph]


def zoo_graph_builder(config_dir: Path) -> GraphBuilder:
    """(model, batch, seq_len) → parsed graph, built once from ``<config_dir>/<model>.json``."""
    cache: dict[tuple[str, int, int], ModelGraph] = {}

    def build(model: str, batch: int, seq_len: int) -> ModelGraph:
        key = (model, batch, seq_len)
        if key not in cache:
            config = zoo.load_hf_config(config_dir / f"{model}.json")
            proto = zoo.build_transformer(config, name=model)
            cache[key] = graph.load_model(proto.SerializeToString(), batch=batch,
                                          dim_bindings={SEQUENCE_DIM: seq_len}, name=model)
        return cache[key]

    return build


def evaluate_rows(
    rows: Iterable[LabelRow], *, predictors: Mapping[str, LatencyPredictor],
    catalog: Catalog, build_graph: GraphBuilder, optimizer: str = "adam",
    progress: Progress = silent, task: str = "eval: GPU label rows",
) -> tuple[tuple[RowResult, ...], tuple[Skipped, ...]]:
    """Price every supported row with every predictor; unsupported rows come back as skipped.

    Each row is one step of `task` reported to `progress`.
    """
    results: list[RowResult] = []
    skipped: list[Skipped] = []
    for row in track(list(rows), task, progress, label=lambda r: f"{r.model} b{r.batch}"):
        reason = UNSUPPORTED_MODELS.get(row.model)
        if reason is not None:
            skipped.append(Skipped(row, reason))
            continue
        device = label_device(row, catalog)
        g = build_graph(row.model, row.batch, row.seq_len)
        settings = TrainingSettings(batch_size=row.batch, mode=row.mode, optimizer=optimizer,
                                    precision="fp32", framework=row_framework(row))
        for label, predictor in predictors.items():
            (est,) = estimates.estimate(g, [device], settings, predictor=predictor)
            results.append(row_result(row, est, label))
    return tuple(results), tuple(skipped)


def row_framework(row: LabelRow) -> str:
    """torch.compile inference rows are priced with its fusions; everything else as eager."""
    if row.fused and row.mode == "inference":
        return frameworks.PYTORCH_COMPILED
    return frameworks.PYTORCH_EAGER


def row_result(row: LabelRow, est: estimates.DeviceStepEstimate, predictor: str) -> RowResult:
    """Forward (+ backward for training) and its interval (`planning.intervals`)."""
    return RowResult(
        row=row, device=est.device, predictor=predictor,
        predicted_ms=est.forward_ms + est.backward_ms,
        p10_ms=est.forward_backward_interval_ms[0],
        p90_ms=est.forward_backward_interval_ms[1],
        forward_ms=est.forward_ms,
    )


def devices_of(rows: Sequence[LabelRow], catalog: Catalog) -> tuple[str, ...]:
    """Sorted catalog keys of the devices the label rows were measured on."""
    return tuple(sorted({label_device(r, catalog).key for r in rows}))
