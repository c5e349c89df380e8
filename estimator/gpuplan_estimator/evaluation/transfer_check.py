"""Leave-one-GPU-out of a transfer structure (`fitting.TrainSettings.transfer_kind`): per op
family on the op rows, and on the whole-model labels (spec sheet only, and with a 20-row probe).

``gpuplan eval transfer-check --kind tiled --max-rows 3000`` prints
both tables; the same refits as ``gpuplan eval``'s leave-one-GPU-out (`interfaces.cli.evaluation`)
but for any kind, and without the in-distribution pass, the calibration or the CPU loop.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from gpuplan_estimator import devices
from gpuplan_estimator.evaluation import gpu_labels
from gpuplan_estimator.evaluation.gpu_labels import RowResult
from gpuplan_estimator.latency import learned
from gpuplan_estimator.training import fitting, recipe, sources

SPEC_ONLY = "lightgbm"
PROBED = "lightgbm+probe"
OP_KERNELS = ("gemm", "conv2d", "elementwise", "layernorm", "softmax")


def op_logo(frame: pd.DataFrame, kernel: str, settings: fitting.TrainSettings
            ) -> dict[str, float]:
    """Held-out MAPE (%) of `kernel`'s transfer model per GPU left out of its fit."""
    rows = fitting.subsample(frame[frame["kernel"] == kernel], settings.max_rows_per_kernel,
                             settings.seed)
    data = fitting.kernel_data(rows, kernel, devices.resolve_device,
                               sorted(rows["backend"].unique()), settings.transfer_kind)
    out = fitting.validate_kernel(kernel, data, settings).get("leave_one_device_out", {})
    return {str(d): float(m["mape_pct"]) for d, m in out.items()}


def model_logo(
    rows: Sequence[gpu_labels.LabelRow], frame: pd.DataFrame, settings: fitting.TrainSettings,
    catalog: devices.Catalog, build: gpu_labels.GraphBuilder, probe_seed: int | None = None,
) -> tuple[RowResult, ...]:
    """Each labelled GPU's rows priced by models refitted without its op rows, spec sheet only
    and corrected by a probe of `probe_rows` op rows per kernel of it (`fitting.probe_rows`,
    drawn with `probe_seed`, else the settings' seed)."""
    out: list[RowResult] = []
    for key in gpu_labels.devices_of(rows, catalog):
        held = fitting.train_bundle(frame[frame["device"] != key], settings, validate=False)
        probe = fitting.probe_rows(frame[frame["device"] == key], settings.probe_rows,
                                   settings.seed if probe_seed is None else probe_seed)
        mine = [r for r in rows if gpu_labels.label_device(r, catalog).key == key]
        results, _ = gpu_labels.evaluate_rows(
            mine, predictors={SPEC_ONLY: learned.LearnedPredictor(held),
                              PROBED: learned.LearnedPredictor(fitting.with_probes(held, probe))},
            catalog=catalog, build_graph=build)
        out.extend(results)
    return tuple(out)


def model_table(results: Sequence[RowResult]) -> str:
    """Markdown: MAPE (%) and rows per GPU and mode, for each predictor, plus an 'all' row."""
    df = pd.DataFrame([{"gpu": r.device, "mode": r.row.mode, "predictor": r.predictor,
                        "ape": 100 * r.ape} for r in results])
    lines = ["| GPU | mode | rows | " + " | ".join(f"{p} MAPE %" for p in (SPEC_ONLY, PROBED))
             + " |", "|---|---|--:|--:|--:|"]
    groups = [*df.groupby(["gpu", "mode"]), *((("all", m), g) for m, g in df.groupby("mode")),
              (("all", "all"), df)]
    for (gpu, mode), g in groups:
        mape = g.groupby("predictor")["ape"].mean()
        lines.append(f"| {gpu} | {mode} | {len(g) // 2} | {mape.get(SPEC_ONLY, float('nan')):.1f}"
                     f" | {mape.get(PROBED, float('nan')):.1f} |")
    return "\n".join(lines)


def op_table(by_kernel: Mapping[str, Mapping[str, float]]) -> str:
    """Markdown: leave-one-GPU-out MAPE (%) per kernel and GPU, with mean and worst."""
    gpus = sorted({d for v in by_kernel.values() for d in v})
    lines = ["| kernel | " + " | ".join(gpus) + " | mean | worst |",
             "|---|" + "--:|" * (len(gpus) + 2)]
    for kernel, v in by_kernel.items():
        cells = [f"{v[g]:.1f}" if g in v else "–" for g in gpus]
        mean = sum(v.values()) / len(v)
        lines.append(f"| {kernel} | " + " | ".join(cells) + f" | {mean:.1f} | "
                     f"{max(v.values()):.1f} |")
    return "\n".join(lines)


@dataclass(frozen=True)
class TransferCheckSettings:
    """`gpuplan eval transfer-check`'s flags."""
    kind: str
    """The transfer structure (`features.TRANSFER_KINDS`)."""
    max_rows: int
    """Rows per kernel of the whole-model table's refits."""
    op_max_rows: int
    """Rows per kernel of the op-family table."""
    kernels: tuple[str, ...]
    """Op families of the op-family table."""
    ops: bool
    """Print the op-family table."""
    models: bool
    """Print the whole-model table."""
    probe_seed: int | None
    """Seed of the probe rows' draw (None: the training seed)."""


def run(settings: TransferCheckSettings) -> int:
    """Print the op-family and whole-model leave-one-GPU-out tables of one transfer kind."""
    shared = recipe.shared_data_dir()
    frame = sources.load_sources([str(shared / "gpu-ops")])
    if settings.ops:
        train = fitting.TrainSettings(max_rows_per_kernel=settings.op_max_rows,
                                      transfer_kind=settings.kind)
        print(op_table({k: op_logo(frame, k, train) for k in settings.kernels}))
    if settings.models:
        labels = Path(shared / "model-labels" / "labels.csv")
        rows = gpu_labels.read_labels(labels)
        build = gpu_labels.zoo_graph_builder(labels.parent / "model_configs")
        train = fitting.TrainSettings(max_rows_per_kernel=settings.max_rows,
                                      transfer_kind=settings.kind)
        print(model_table(model_logo(rows, frame, train, devices.load_catalog(), build,
                                     settings.probe_seed)))
    return 0
