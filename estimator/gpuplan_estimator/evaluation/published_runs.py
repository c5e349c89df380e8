"""Published multi-GPU training throughputs next to gpuplan's estimate of the same layout (#34).

    python -m gpuplan_estimator.evaluation.published_runs [--bundle DIR]

Writes docs/published-runs.md (linked from docs/accuracy.md). The published numbers and their
setup live in `data/published_runs.yaml` with the citation; they are used only to check, never
to fit. Each run is priced as `gpuplan plan` prices a candidate: the single-GPU step of the
model at the run's micro-batch (`planning.estimates.estimate` with the default predictor
selection), then the run's layout and memory strategy by `parallel.setups.priced` with the
default `ScalingModel`.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
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
from gpuplan_estimator.parallel import layouts, setups
from gpuplan_estimator.parallel.scaling import ScalingModel
from gpuplan_estimator.parallel.strategies import MemoryStrategy
from gpuplan_estimator.planning import estimates, model_facts, parallel_inputs
from gpuplan_estimator.step.decomposition import TrainingSettings

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
    """A published run with the setup gpuplan prices for its layout and strategy."""

    run: PublishedRun
    setup: setups.Setup
    data_basis: str

    @property
    def tokens_per_s_per_gpu(self) -> float:
        """Predicted tokens per second per GPU: the global batch's tokens over the step."""
        r = self.run
        return r.global_batch * r.sequence / (self.setup.step_ms / 1000.0) / r.gpus

    @property
    def error_pct(self) -> float:
        """Signed error of the predicted throughput against the published one, in %."""
        return 100.0 * (self.tokens_per_s_per_gpu / self.run.tokens_per_s_per_gpu - 1.0)


def predict(run: PublishedRun, predictor: LatencyPredictor) -> Row:
    """gpuplan's setup for the run: its single-GPU step at the micro-batch, then the layout
    with FSDP full sharding and the run's accumulation, as the planner times a candidate."""
    device = devices.load_catalog().resolve(run.device)
    dims = {SEQUENCE_DIM: run.sequence}
    model = exporting.hf_config_graph(run.config, batch=run.micro_batch, sequence=run.sequence,
                                      label=run.model)
    settings = TrainingSettings(batch_size=run.micro_batch, precision=PRECISION,
                                optimizer=OPTIMIZER, attention=ATTENTION)
    (single,) = estimates.estimate(graph.load_at_batch(model, run.micro_batch, dims), [device],
                                   settings, predictor=predictor)
    split = parallel_inputs.split_from_estimate(single)
    facts = model_facts.model_facts(graph.load_at_batch(model, run.global_batch, dims),
                                    replace(settings, batch_size=run.global_batch))
    setup = setups.priced(
        run.layout, MemoryStrategy(fsdp=STRATEGY_FSDP, gradient_accumulation=run.grad_accum),
        run.micro_batch, GPUS_PER_NODE, device=device, facts=facts, split=split,
        scaling=ScalingModel(), comm_factor=1.0,
        step_at=lambda _micro: (split.forward_ms, split.backward_ms, split.optimizer_ms))
    return Row(run, setup, single.data_basis)


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
        f"(bf16, fused attention, AdamW; the {predictor} latency models), then the run's "
        "setup (data parallel over 8 GPUs, FSDP full sharding, its gradient accumulation) "
        "sized and timed as `gpuplan plan` sizes and times a candidate "
        "(`parallel.setups.priced`). Caveats:", "",
        "- The publication gives no memory figure, so the memory column is not compared; "
        "every run did fit in 80 GB, so a prediction above that is over by at least the "
        "difference.",
        "- No shipped measurement covers A100-SXM4-80GB or H100 (`extrapolated`): these rows "
        "are the spec-sheet transfer of the latency models.", "",
        "Reproduce: `python -m gpuplan_estimator.evaluation.published_runs --write "
        "docs/published-runs.md` (about 40 s on two CPU cores).", "",
        f"Provenance: computed {datetime.now(UTC).isoformat(timespec='seconds')} at commit "
        f"`{provenance.git_commit(short=True) or 'unknown'}` by that command.", ""])


if __name__ == "__main__":
    raise SystemExit(main())
