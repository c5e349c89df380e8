"""Published multi-GPU training throughputs next to gpuplan's estimate of the same layout (#34).

    python -m gpuplan_estimator.evaluation.published_runs [--bundle DIR]

Prints the markdown table of docs/accuracy.md ("Published multi-GPU runs"). The published
numbers and their setup live in `data/published_runs.yaml` with the citation; they are used
only to check, never to fit. Each run is priced as `gpuplan plan` prices a candidate: the
single-GPU step of the model at the run's micro-batch (`planning.estimates.estimate` with the
default predictor selection), then the run's layout by `planning.parallelism.step_time` with
the default `ScalingModel`.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml

from gpuplan_estimator import devices, graph
from gpuplan_estimator.core import paths, provenance
from gpuplan_estimator.core.vocabulary import SEQUENCE_DIM
from gpuplan_estimator.cost.predictors import LatencyPredictor
from gpuplan_estimator.graph import exporting
from gpuplan_estimator.latency import selection
from gpuplan_estimator.planning import estimates, parallel_inputs, parallelism
from gpuplan_estimator.planning.scaling import ScalingModel
from gpuplan_estimator.step.decomposition import TrainingSettings

DATA_FILE = paths.PACKAGE_DATA_DIR / "published_runs.yaml"
GPUS_PER_NODE = 8  # every run here is one node of 8 GPUs
PRECISION = "bf16"  # amp_bf16
OPTIMIZER = "adamw"  # decoupled AdamW: the same state and step work
ATTENTION = "fused"  # triton FlashAttention


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
    def layout(self) -> parallelism.ParallelLayout:
        """Data parallel over every GPU, the gradient accumulation as micro-batches."""
        return parallelism.ParallelLayout(dp=self.gpus, tp=1, pp=1,
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
    """A published run with gpuplan's step for its layout."""

    run: PublishedRun
    step: parallelism.ParallelStep
    data_basis: str
    memory_bytes_per_gpu: int

    @property
    def tokens_per_s_per_gpu(self) -> float:
        """Predicted tokens per second per GPU: the global batch's tokens over the step."""
        r = self.run
        return r.global_batch * r.sequence / (self.step.total_ms / 1000.0) / r.gpus

    @property
    def error_pct(self) -> float:
        """Signed error of the predicted throughput against the published one, in %."""
        return 100.0 * (self.tokens_per_s_per_gpu / self.run.tokens_per_s_per_gpu - 1.0)


def predict(run: PublishedRun, predictor: LatencyPredictor) -> Row:
    """gpuplan's step for the run's layout, from its single-GPU step at the micro-batch."""
    device = devices.load_catalog().resolve(run.device)
    micro = run.micro_batch
    model = exporting.hf_config_graph(run.config, batch=micro, sequence=run.sequence,
                                      label=run.model)
    g = graph.load_at_batch(model, micro, {SEQUENCE_DIM: run.sequence})
    settings = TrainingSettings(batch_size=micro, precision=PRECISION, optimizer=OPTIMIZER,
                                attention=ATTENTION)
    (single,) = estimates.estimate(g, [device], settings, predictor=predictor)
    step = parallelism.step_time(
        run.layout, parallel_inputs.split_from_estimate(single),
        parallel_inputs.model_dims_from_graph(g, precision=PRECISION), device, ScalingModel(),
        gpus_per_node=GPUS_PER_NODE)
    return Row(run, step, single.data_basis, single.memory.total_bytes)


def table(rows: Sequence[Row]) -> str:
    """The markdown comparison table, with the mean absolute error."""
    lines = ["| model | GPUs | micro-batch x accum, global batch | published tokens/s/GPU "
             "(MFU) | predicted tokens/s/GPU | error | predicted step (ms): compute / DP "
             "all-reduce | predicted peak memory per GPU (DDP) |",
             "|---|---|---|---:|---:|---:|---|---:|"]
    for r in rows:
        p, s = r.run, r.step
        lines.append(
            f"| {p.model}, seq {p.sequence} | {p.gpus} x {p.device} ({r.data_basis}) | "
            f"{p.micro_batch} x {p.grad_accum}, {p.global_batch} | "
            f"{p.tokens_per_s_per_gpu:,.0f} ({p.mfu_pct:.1f} %) | {r.tokens_per_s_per_gpu:,.0f} "
            f"| {r.error_pct:+.1f} % | {s.total_ms:.0f}: {s.compute_ms:.0f} / "
            f"{s.dp_allreduce_ms:.0f} | {r.memory_bytes_per_gpu / 2**30:.1f} GiB |")
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
    predictor, predictor_source = selection.select_predictor(args.bundle)
    text = page(source, table([predict(r, predictor) for r in runs]),
                predictor_source.rsplit(" ", 1)[-1].strip("()"))
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
        "How each run is priced: the model's single-GPU step at the run's micro-batch "
        f"(bf16, fused attention, AdamW; the {predictor} latency models), then its layout "
        "(data parallel over 8 GPUs, gradient accumulation as micro-batches) by the planner's "
        "layout model (`planning.parallelism.step_time`), as `gpuplan plan` prices a "
        "candidate. Caveats:", "",
        "- The runs use FSDP FULL_SHARD; this branch has no FSDP layout, so each is priced as "
        "DDP (one gradient all-reduce, full replicas). FSDP adds a parameter all-gather per "
        "forward and backward, so the real communication is larger than priced here.",
        "- The memory column is gpuplan's estimate for one DDP replica at the micro-batch "
        "(nothing sharded). The publication gives no memory figure, so it is not compared; "
        "but every run did fit in 80 GB, and estimates above that are over by at least the "
        "difference (largely activations, which FSDP does not shard).",
        "- No shipped measurement covers A100-SXM4-80GB or H100 (`extrapolated`): these rows "
        "are the spec-sheet transfer of the latency models.", "",
        "Reproduce: `python -m gpuplan_estimator.evaluation.published_runs --write "
        "docs/published-runs.md` (about 40 s on two CPU cores).", "",
        f"Provenance: computed {datetime.now(UTC).isoformat(timespec='seconds')} at commit "
        f"`{provenance.git_commit(short=True) or 'unknown'}` by that command.", ""])


if __name__ == "__main__":
    raise SystemExit(main())
