"""`make plans-report` (`gpuplan eval plans-report`): plans for GPT-class models at realistic
batches → docs/plans.md.

Each case is planned with the shipped latency models over 4 nodes x 8 GPUs of three types (the
CLI's default objective, cheapest, with a deadline); the page shows the choice, how it runs
(layout, memory strategy), its time, cost and memory by part, and the best alternatives. The
multi-GPU accuracy table lives in docs/parallelism.md (`parallel_check`).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from gpuplan_estimator import devices
from gpuplan_estimator.core import paths, provenance
from gpuplan_estimator.core.durations import format_duration
from gpuplan_estimator.core.vocabulary import SEQUENCE_DIM
from gpuplan_estimator.graph import exporting
from gpuplan_estimator.latency import selection
from gpuplan_estimator.planning import placement, planner, requests

GIB = 2**30
POOLS = (("a100-sxm4-80gb", 4, 8), ("h100-sxm-80gb", 4, 8), ("l4", 4, 8))
DEADLINE_SECONDS = 14 * 86400.0
"""Two weeks: a deadline a team would give a pre-training run of this size."""


@dataclass(frozen=True)
class PlanCase:
    """One model at a realistic batch, sequence and token budget."""

    title: str
    config: Mapping[str, Any]
    batch: int  # sequences per step
    sequence: int
    tokens: int  # the run's token budget

    @property
    def dataset_size(self) -> int:
        """Sequences in the run."""
        return self.tokens // self.sequence


GPT2_MEDIUM = {"model_type": "gpt2", "n_embd": 1024, "n_layer": 24, "n_head": 16,
               "n_positions": 1024, "vocab_size": 50257}
# GPT-3 2.7B (Brown et al. 2020, Table 2.1): 32 layers, d_model 2560, 32 heads, context 2048,
# batch 1M tokens.
GPT3_2_7B = {"model_type": "gpt2", "n_embd": 2560, "n_layer": 32, "n_head": 32,
             "n_positions": 2048, "vocab_size": 50257}
# LLaMA-7B (Touvron et al. 2023, Table 2): 32 layers, dim 4096, 32 heads, SwiGLU 11008.
LLAMA_7B = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 4096,
            "intermediate_size": 11008, "num_attention_heads": 32, "num_hidden_layers": 32,
            "num_key_value_heads": 32, "vocab_size": 32000, "max_position_embeddings": 2048,
            "rms_norm_eps": 1e-6, "hidden_act": "silu", "tie_word_embeddings": False}
CASES = (
    PlanCase("GPT-2 medium (355 M), batch 512 x 1024, 10 B tokens", GPT2_MEDIUM, 512, 1024,
         10 * 10**9),
    PlanCase("GPT-3 2.7B, batch 512 x 2048 (1 M tokens), 10 B tokens", GPT3_2_7B, 512, 2048,
         10 * 10**9),
    PlanCase("LLaMA-7B-shaped, batch 512 x 2048 (1 M tokens), 10 B tokens", LLAMA_7B, 512, 2048,
         10 * 10**9),
)


def plan_case(case: PlanCase, ctx: planner.PlannerContext) -> planner.PlannedRequest:
    """The plan of one case (every candidate: its document lists them all)."""
    # Batch 1, as `planner.with_graph` exports for plans: re-batched up to each batch needed.
    model = exporting.hf_config_graph(case.config, batch=1, sequence=case.sequence,
                                      label=case.title)
    request = requests.PlanRequest(
        model_onnx=model,
        training=requests.TrainingRequest(
            batch_size=case.batch, dataset_size=case.dataset_size, epochs=1, optimizer="adamw",
            precision="bf16", dims={SEQUENCE_DIM: case.sequence}),
        objective=placement.Objective(prefer="cheapest", max_gpus=32,
                                      deadline_seconds=DEADLINE_SECONDS),
        inventory=tuple(requests.InventoryEntry(gpu_type=t, gpus_per_node=g, nodes=n,
                                                free_gpus=n * g) for t, n, g in POOLS),
        gpu_types=())
    return planner.plan_request(request, ctx)


def _usd(c: Mapping[str, Any]) -> str:
    return f"${c['cost_usd']:,.0f}" if c["cost_usd"] is not None else "unknown"


def _layout(c: Mapping[str, Any]) -> str:
    p = c["parallelism"]
    return f"dp{p['dp']} tp{p['tp']} pp{p['pp']} m{p['micro_batches']}x{p['micro_batch']}"


def case_section(case: PlanCase, doc: Mapping[str, Any], seconds: float) -> list[str]:
    """The page section of one case: the choice in words, memory, alternatives."""
    c = doc["plan"]
    mem = c["memory"]
    parts = ", ".join(f"{k.removesuffix('_bytes').replace('_', ' ')} "
                      f"{v / GIB:.1f} GiB" for k, v in mem.items()
                      if k not in ("total_bytes", "host_bytes") and v)
    steps = ", ".join(f"{k.replace('_', ' ')} {v:,.0f} ms" for k, v in c["step_ms"].items() if v)
    lines = [
        f"## {case.title}", "",
        f"**Plan: {c['gpu_count']} x {c['gpu_type']}** on {c['nodes']} node(s), "
        f"{_layout(c)}, memory strategy **{c['strategy']['label']}**: "
        f"{format_duration(c['estimated_seconds'])} "
        f"(P10-P90 {format_duration(c['interval_seconds'][0])} to "
        f"{format_duration(c['interval_seconds'][1])}), {_usd(c)}.", "",
        f"- step {c['step_time_ms']:,.0f} ms: {steps}",
        f"- memory per GPU {mem['total_bytes'] / GIB:.1f} GiB: {parts}"
        + (f"; {mem['host_bytes'] / GIB:.1f} GiB in host memory" if mem["host_bytes"] else ""),
        f"- {doc['candidates_total']} feasible candidates, {len(doc['rejected'])} rejected; "
        f"planned in {seconds:.1f} s", "",
        "| GPUs | layout | strategy | step ms | time | cost | memory/GPU |",
        "|---|---|---|---:|---:|---:|---:|",
    ]
    for cand in _alternatives(doc["candidates"]):
        lines.append(f"| {cand['gpu_count']} x {cand['gpu_type']} | {_layout(cand)} | "
                     f"{cand['strategy']['label']} | {cand['step_time_ms']:,.0f} | "
                     f"{format_duration(cand['estimated_seconds'])} | {_usd(cand)} | "
                     f"{cand['memory_bytes_per_gpu'] / GIB:.1f} GiB |")
    return [*lines, ""]


def _alternatives(candidates: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """The best candidate of each GPU type at 8, 16 and 32 GPUs (where feasible), best first."""
    wanted = {(c["gpu_type"], c["gpu_count"]) for c in candidates if c["gpu_count"] in (8, 16, 32)}
    seen: set[tuple[str, int]] = set()
    out = []
    for c in candidates:
        key = (c["gpu_type"], c["gpu_count"])
        if key in wanted and key not in seen:
            seen.add(key)
            out.append(c)
    return out


def page(sections: Sequence[str], command: str, source: str) -> str:
    """The whole page with its provenance."""
    head = [
        "# Plans for GPT-class training runs", "",
        "What `gpuplan plan` chooses for three models at realistic batches, over 4 nodes x 8 "
        "GPUs each of A100-SXM4-80GB, H100-SXM-80GB and L4, bf16 with AdamW, objective "
        f"`cheapest` with a deadline of {format_duration(DEADLINE_SECONDS)}. Every candidate is "
        "searched over data x tensor x pipeline layouts and memory strategies; the table lists "
        "the best plan of each type at 8, 16 and 32 GPUs. How good the multi-GPU step model is "
        "against published 4-GPU steps: [parallelism.md](parallelism.md); per-component memory "
        "against measured peaks: [memory.md](memory.md).", "",
        "The single-GPU step times come from the shipped latency models, which have no "
        "measurement of H100 or L4 (extrapolated from their spec sheets; see "
        "[accuracy.md](accuracy.md)). Prices are the catalog's indicative on-demand prices.", "",
        f"Generated {datetime.now(UTC).date().isoformat()} at commit "
        f"{provenance.git_commit(short=True) or 'unknown'} by `{command}`; predictor: "
        f"{source}.", "",
    ]
    return "\n".join(head + list(sections))


@dataclass(frozen=True)
class PlansReportSettings:
    """`gpuplan eval plans-report`'s flags."""
    out: Path
    """The page to write; the plan documents go beside it as JSON."""


DEFAULT_OUT = paths.REPO_ROOT / "docs" / "plans.md"
PlanDocument = Callable[[planner.PlannedRequest], dict[str, Any]]
"""Turns a case's plan into its JSON document (every candidate): the wire's shape, which the
interfaces own (`interfaces.json_documents.planned_json`), handed in by the command."""


def run(settings: PlansReportSettings, document: PlanDocument) -> int:
    """Plan every case and write the page (and the plan documents as JSON beside it)."""
    predictor, source = selection.select_predictor(None)
    ctx = planner.PlannerContext(catalog=devices.load_catalog(), predictor=predictor,
                                 predictor_source=source.split(":")[0])
    sections, documents = [], {}
    for case in CASES:
        start = time.perf_counter()
        doc = document(plan_case(case, ctx))
        sections += case_section(case, doc, time.perf_counter() - start)
        documents[case.title] = doc
        print(f"planned {case.title}", flush=True)
    settings.out.write_text(page(sections, "make plans-report", ctx.predictor_source) + "\n")
    settings.out.with_suffix(".json").write_text(json.dumps(documents, indent=1) + "\n")
    print(f"wrote {settings.out}")
    return 0
