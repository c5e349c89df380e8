"""Published multi-GPU training throughputs next to gpuplan's estimate of the same layout (#34).

    python -m gpuplan_estimator.evaluation.published_runs [--bundle DIR]

Writes docs/published-runs.md (linked from docs/accuracy.md). The published numbers and their
setup live in `data/published_runs.yaml` with the citation; they are used only to check, never
to fit. Each run is priced as a user's named layout is: its layout (data parallel over every
GPU, FSDP full sharding, the run's micro-batch and accumulation) is an estimate request's
`layout`, answered by `planning.named_layouts.estimate_layout`, the one path `gpuplan estimate
--gpus`, `POST /v1/estimate` and a plan's pinned layout share (default predictor selection,
default `ScalingModel`, no calibration).
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml

from gpuplan_estimator import devices
from gpuplan_estimator.core import paths, provenance
from gpuplan_estimator.core.vocabulary import SEQUENCE_DIM
from gpuplan_estimator.latency import selection
from gpuplan_estimator.parallel import layouts, named, setups
from gpuplan_estimator.planning import named_layouts, planner, requests

DATA_FILE = paths.PACKAGE_DATA_DIR / "published_runs.yaml"
GPUS_PER_NODE = 8  # every run here is one node of 8 GPUs
PRECISION = "bf16"  # amp_bf16
OPTIMIZER = "adamw"  # decoupled AdamW: the same state and step work
ATTENTION = "fused"  # triton FlashAttention
STRATEGY_FSDP = "full"  # FSDP FULL_SHARD


@dataclass(frozen=True)
class PublishedRun:
    """One published run: model shape, GPU, layout and its measured tokens/s per GPU."""

    model: str
    config: Mapping[str, Any]  # a GPT-2-shaped Hugging Face config of the model
    device: str  # catalog key
    gpus: int
    sequence: int
    micro_batch: int
    grad_accum: int
    global_batch: int
    tokens_per_s_per_gpu: float
    mfu_pct: float

    @property
    def layout(self) -> layouts.ParallelLayout:
        """Data parallel over every GPU, the gradient accumulation as micro-batches."""
        return layouts.ParallelLayout(dp=self.gpus, tp=1, pp=1,
                                          micro_batches=self.grad_accum)


def gpt2_config(shape: Mapping[str, Any], sequence: int) -> dict[str, Any]:
    """The GPT-2 config of an MPT shape (learned positions, expansion 4, GELU)."""
    return {"model_type": "gpt2", "n_embd": shape["d_model"], "n_head": shape["n_heads"],
            "n_layer": shape["n_layers"], "n_positions": sequence,
            "vocab_size": shape["vocab_size"], "activation_function": "gelu_new",
            "layer_norm_epsilon": 1e-5}


def load_runs(document: Mapping[str, Any]) -> tuple[str, tuple[PublishedRun, ...]]:
    """(source, runs) of the data file's parsed document."""
    shapes = document["models"]
    runs = tuple(
        PublishedRun(model=r["model"], config=gpt2_config(shapes[r["model"]], r["sequence"]),
                     device=r["gpu"], gpus=r["gpus"], sequence=r["sequence"],
                     micro_batch=r["micro_batch"], grad_accum=r["grad_accum"],
                     global_batch=r["global_batch"],
                     tokens_per_s_per_gpu=float(r["tokens_per_s_per_gpu"]),
                     mfu_pct=float(r["mfu_pct"]))
        for r in document["runs"])
    for run in runs:  # the file's layout must be the one its global batch implies
        assert run.layout.micro_batch_size(run.global_batch) == run.micro_batch, run
    return str(document["source"]), runs


@dataclass(frozen=True)
class Row:
    """A published run with gpuplan's estimate of its named layout."""

    run: PublishedRun
    estimate: named_layouts.LayoutEstimate

    @property
    def setup(self) -> setups.Setup:
        """What the layout is priced as: memory and the step's parts."""
        return self.estimate.setup

    @property
    def data_basis(self) -> str:
        """What the device's latency rests on (measured, probed, extrapolated, roofline)."""
        return self.estimate.data_basis

    @property
    def tokens_per_s_per_gpu(self) -> float:
        """Predicted tokens per second per GPU, as the layout estimate reports it."""
        tokens = self.estimate.tokens_per_s_per_gpu
        assert tokens is not None  # the request binds the sequence dim
        return tokens

    @property
    def error_pct(self) -> float:
        """Signed error of the predicted throughput against the published one, in %."""
        return 100.0 * (self.tokens_per_s_per_gpu / self.run.tokens_per_s_per_gpu - 1.0)


def layout_request(run: PublishedRun) -> requests.EstimateRequest:
    """The run as a user would ask for it: its model's config, global batch and sequence, and
    its layout by name (data parallel over every GPU, FSDP full sharding, its micro-batch and
    accumulation)."""
    training = requests.TrainingRequest(
        batch_size=run.global_batch, dataset_size=run.global_batch, epochs=1,
        optimizer=OPTIMIZER, precision=PRECISION, mode="train", attention=ATTENTION,
        dims={SEQUENCE_DIM: run.sequence})
    layout = named.LayoutRequest(
        gpus=run.gpus, dp=run.gpus, tp=1, pp=1, gpus_per_node=GPUS_PER_NODE,
        fsdp=STRATEGY_FSDP, micro_batch=run.micro_batch, gradient_accumulation=run.grad_accum)
    return requests.EstimateRequest(model_onnx=b"", training=training, devices=(run.device,),
                                    model_hf_config=run.config, layout=layout)


def predict(run: PublishedRun, ctx: planner.PlannerContext) -> Row:
    """gpuplan's estimate of the run's named layout on its GPU: exactly what `gpuplan estimate
    --gpus 8 --fsdp full --micro-batch M --grad-accum A` answers for it."""
    (estimate,) = named_layouts.estimate_layout(layout_request(run), ctx)
    return Row(run, estimate)


def context(bundle_dir: str | None) -> planner.PlannerContext:
    """The shipped catalog and the predictor `gpuplan estimate` would select; no calibration
    (a published run is compared with the model, not with this cluster's outcomes)."""
    predictor, source = selection.select_predictor(bundle_dir)
    return planner.PlannerContext(catalog=devices.load_catalog(), predictor=predictor,
                                  predictor_source=source)


def table(rows: Sequence[Row]) -> str:
    """The markdown comparison table, with the mean absolute error."""
    lines = ["| model | GPUs | micro-batch x accum, global batch | published tokens/s/GPU "
             "(MFU) | predicted tokens/s/GPU | error | predicted step (ms): compute / exposed "
             "FSDP comm / optimizer | predicted memory per GPU |",
             "|---|---|---|---:|---:|---:|---|---:|"]
    for r in rows:
        p, parts = r.run, r.setup.parts_ms
        lines.append(
            f"| {p.model}, seq {p.sequence} | {p.gpus} x {p.device} ({r.data_basis}) | "
            f"{p.micro_batch} x {p.grad_accum}, {p.global_batch} | "
            f"{p.tokens_per_s_per_gpu:,.0f} ({p.mfu_pct:.1f} %) | {r.tokens_per_s_per_gpu:,.0f} "
            f"| {r.error_pct:+.1f} % | {r.setup.step_ms:.0f}: {parts['compute']:.0f} / "
            f"{parts['dp_comm']:.0f} / {parts['optimizer']:.0f} | "
            f"{r.setup.memory.total_bytes / 2**30:.1f} GiB |")
    mean = sum(abs(r.error_pct) for r in rows) / len(rows)
    worst = max(abs(r.error_pct) for r in rows)
    lines.append(f"\nMean absolute error {mean:.1f} % over {len(rows)} runs, worst {worst:.1f} %.")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """Print the comparison table."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--bundle", default=None, metavar="DIR",
                        help="model bundle to predict with (default: as `gpuplan estimate`)")
    parser.add_argument("--write", default=None, metavar="FILE",
                        help="write the page (docs/published-runs.md) instead of printing")
    args = parser.parse_args(argv)
    source, runs = load_runs(yaml.safe_load(DATA_FILE.read_text(encoding="utf-8")))
    ctx = context(args.bundle)
    text = page(source, table([predict(r, ctx) for r in runs]),
                ctx.predictor_source.rsplit(" ", 1)[-1].strip("()"))
    if args.write is None:
        print(text)
    else:
        Path(args.write).write_text(text, encoding="utf-8")
    return 0


def page(source: str, comparison: str, predictor: str) -> str:
    """docs/published-runs.md: the table with its source, setup, caveats and provenance."""
    return "\n".join([
        "# Published multi-GPU runs against gpuplan's estimate", "",
        f"Source of the published numbers: {source}; every row's setup and citation are in "
        "`estimator/gpuplan_estimator/data/published_runs.yaml`. They are used only to check: "
        "nothing is fitted to them.", "",
        comparison, "",
        "How each run is priced: as a user's named layout is. The run (bf16, fused "
        f"attention, AdamW; the {predictor} latency models) is an estimate request whose "
        "layout is data parallel over 8 GPUs with FSDP full sharding, the run's micro-batch "
        "and gradient accumulation, answered by `planning.named_layouts.estimate_layout`: "
        "the path `gpuplan estimate --gpus 8 --fsdp full --micro-batch M --grad-accum A`, "
        "`POST /v1/estimate` with a `layout` and a plan's pinned layout share. Caveats:", "",
        "- The publication gives no memory figure, so the memory column is not compared; "
        "every run did fit in 80 GB, so a prediction above that is over by at least the "
        "difference.",
        "- No shipped measurement covers A100-SXM4-80GB or H100 (`extrapolated`): these rows "
        "are the spec-sheet transfer of the latency models.", "",
        "Reproduce: `python -m gpuplan_estimator.evaluation.published_runs --write "
        "docs/published-runs.md` (about 15 s on two busy CPU cores).", "",
        f"Provenance: computed {datetime.now(UTC).isoformat(timespec='seconds')} at commit "
        f"`{provenance.git_commit(short=True) or 'unknown'}` by that command.", ""])


if __name__ == "__main__":
    raise SystemExit(main())
