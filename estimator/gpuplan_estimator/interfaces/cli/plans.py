"""`gpuplan plan`: choose GPU type and count for a model, a dataset and an objective (offline).

The same planner as the service's `POST /v1/plans`, run in-process on the catalog's GPUs (or
the pools given). The table shows the choice, the best other candidates with memory and the
P10-P90 range, and why each rejected GPU type and count was rejected.
"""

from __future__ import annotations

import argparse
import base64
import dataclasses
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from gpuplan_estimator import devices
from gpuplan_estimator.core import limits, options
from gpuplan_estimator.core.errors import InvalidRequestError
from gpuplan_estimator.core.progress import Step
from gpuplan_estimator.graph import exporting
from gpuplan_estimator.interfaces import json_documents
from gpuplan_estimator.interfaces.cli import (
    arguments,
    hf_configs,
    output,
    plots,
    probing,
    progress,
    render,
)
from gpuplan_estimator.latency import selection
from gpuplan_estimator.planning import planner

DEFAULT_EPOCHS = 1
TABLE_CANDIDATES = 10
"""Candidates the table lists without --all."""
_NUMBERS = re.compile(r"[0-9][0-9.,]*")
DOCUMENT_CANDIDATES = 20
"""Candidates a JSON/YAML plan lists without --all: as many as the service returns."""
DEFAULT_POOL_NODES = 1
DEFAULT_POOL_GPUS_PER_NODE = 8


def load_context(bundle_dir: str | None,
                 prices: devices.PriceChoice = None,
                 catalog_file: str | None = None) -> planner.PlannerContext:
    """Planner context: the catalog (with `catalog_file`'s devices, priced as `prices` says)
    and the predictor from `bundle_dir` or the default bundle."""
    predictor, source = selection.select_predictor(bundle_dir)
    manifest = getattr(getattr(predictor, "bundle", None), "manifest", {}) or {}
    return planner.PlannerContext(
        catalog=devices.apply_prices(devices.load_catalog(user_file=catalog_file), prices),
        predictor=predictor,
        predictor_source=source,
        manifest=manifest if isinstance(manifest, dict) else {},
    )


def register(sub: Any) -> None:
    """Add the `plan` subcommand."""
    p = sub.add_parser("plan", help="choose GPU type and count for a model and an objective",
                       description="Choose the GPU type and count that meet the objective for "
                       "training MODEL on --dataset-size samples for --epochs epochs.")
    p.add_argument("model", nargs="?", default=None,
                   help="ONNX file (may be gzip/xz/zstd-compressed)")
    p.add_argument("--hf-config", default=None, metavar="CONFIG_JSON",
                   help="instead of an ONNX file: a Hugging Face config.json (model_type "
                   f"{', '.join(exporting.WRITTEN_MODEL_TYPES)} without torch; needs --dim "
                   "sequence=N, Whisper's being the decoder's length)")
    p.add_argument("--batch", type=arguments.count_up_to(limits.MAX_BATCH_SIZE), required=True,
                   metavar="N",
                   help="global batch size, split evenly over the GPUs of a candidate")
    p.add_argument("--dataset-size", type=arguments.count_up_to(limits.MAX_DATASET_SIZE),
                   required=True, metavar="SAMPLES", help="samples per epoch")
    p.add_argument("--epochs", type=arguments.count_up_to(limits.MAX_EPOCHS),
                   default=DEFAULT_EPOCHS, metavar="N",
                   help=f"epochs to train (default {DEFAULT_EPOCHS})")
    p.add_argument("--dim", type=arguments.dim_binding, action="append", default=[],
                   metavar="NAME=V", help="bind a symbolic dim, e.g. sequence=1024 (repeatable)")
    p.add_argument("--optimizer", default=options.DEFAULT_OPTIMIZER, choices=options.OPTIMIZERS,
                   help=f"optimizer (default {options.DEFAULT_OPTIMIZER})")
    arguments.add_optimizer_impl(p)
    p.add_argument("--precision", default=options.DEFAULT_PRECISION, choices=options.PRECISIONS,
                   help=f"compute precision (default {options.DEFAULT_PRECISION})")
    p.add_argument("--attention", default=options.DEFAULT_ATTENTION, choices=options.ATTENTIONS,
                   help=f"how the attention core runs (default {options.DEFAULT_ATTENTION}; "
                   "fused: one SDPA/FlashAttention kernel)")
    p.add_argument("--prefer", default=options.DEFAULT_OBJECTIVE, choices=options.OBJECTIVES,
                   help="cheapest: least cost meeting the deadline; fastest: least time within "
                   "the budget; balanced: least cost x time "
                   f"(default {options.DEFAULT_OBJECTIVE})")
    p.add_argument("--max-gpus", type=arguments.count_up_to(options.MAX_GPUS_CAP),
                   default=options.DEFAULT_MAX_GPUS, metavar="N",
                   help=f"most GPUs a plan may use (default {options.DEFAULT_MAX_GPUS})")
    p.add_argument("--deadline", type=arguments.duration_seconds, metavar="DURATION",
                   help="time the whole run must finish in: 2h, 90m, 1h30m, 3d, or seconds")
    p.add_argument("--budget", type=arguments.positive_float, metavar="USD",
                   help="most the whole run may cost, in US dollars")
    p.add_argument("--pool", action="append", default=[], metavar="TYPE=NODESxGPUS",
                   help="GPU pool, e.g. NVIDIA-H100-80GB-HBM3=2x8 (repeatable; default: "
                   f"{DEFAULT_POOL_NODES}x{DEFAULT_POOL_GPUS_PER_NODE} of every catalog GPU)")
    p.add_argument("--all", action="store_true",
                   help=f"every candidate and every rejection (default: the best "
                   f"{TABLE_CANDIDATES} and one line per rejected GPU type)")
    output.add_output_argument(p)
    p.add_argument("--plot", default=None, metavar="FILE",
                   help="also draw cost against time of every candidate, the Pareto front and "
                   "the choice to FILE (.png, .svg or a self-contained .html; needs "
                   "gpuplan[plot])")
    p.add_argument("--bundle", default=None, metavar="DIR",
                   help="model bundle directory (default: the newest in the data dir, else "
                   "the shipped one)")
    probing.add_db_flag(p)
    arguments.add_prices_flag(p)
    arguments.add_catalog_flag(p)
    progress.add_flag(p)
    p.set_defaults(func=run_plan)


def pools(specs: Sequence[str], catalog: devices.Catalog) -> list[dict[str, Any]]:
    """`--pool` values as inventory entries (default: one node of every catalog GPU, of the
    GPUs per node a user catalog gives, else 8)."""
    if not specs:
        return [{"gpu_type": d.key, "gpus_per_node": _gpus_per_node(d),
                 "nodes": DEFAULT_POOL_NODES, "free_gpus": DEFAULT_POOL_NODES * _gpus_per_node(d)}
                for d in catalog.devices]
    out = []
    for text in specs:
        name, _, shape = text.rpartition("=")
        nodes, _, gpus = shape.partition("x")
        if not name or not nodes.isdigit() or not gpus.isdigit():
            raise InvalidRequestError("--pool", f"expected TYPE=NODESxGPUS, got {text!r}")
        for what, count in (("nodes", nodes), ("GPUs per node", gpus)):
            if int(count) < 1:
                raise InvalidRequestError(f"--pool {text}", f"{what} must be ≥ 1")
        catalog.resolve(name)  # a name the catalog lacks is a typo here: one error, suggestions
        out.append({"gpu_type": name, "gpus_per_node": int(gpus), "nodes": int(nodes),
                    "free_gpus": int(nodes) * int(gpus)})
    return out


# The plan request's wire fields as the flags that set them: an error names what the user typed.
WIRE_FLAGS = {
    "training.batch_size": "--batch", "training.dataset_size": "--dataset-size",
    "training.epochs": "--epochs", "training.optimizer": "--optimizer",
    "training.optimizer_impl": "--optimizer-impl",
    "training.precision": "--precision", "training.attention": "--attention",
    "training.dims": "--dim", "objective.prefer": "--prefer", "objective.max_gpus": "--max-gpus",
    "objective.deadline_seconds": "--deadline", "objective.budget_usd": "--budget",
}
_POOL_FIELD = re.compile(r"inventory\[(\d+)\]\.?(.*)")
_PYDANTIC_BOUND = {"greater than or equal to": "≥", "greater than": ">",
                   "less than or equal to": "≤", "less than": "<"}


def in_flags(problem: tuple[str, str], pool_specs: Sequence[str]) -> tuple[str, str]:
    """A wire (path, message) as (flag, message): `inventory[0].nodes` is the first --pool."""
    path, message = problem
    for words, sign in _PYDANTIC_BOUND.items():  # pydantic's wording, in the CLI's
        message = message.replace(f"Input should be {words} ", f"must be {sign} ")
    pool = _POOL_FIELD.fullmatch(path)
    if pool and int(pool.group(1)) < len(pool_specs):
        return f"--pool {pool_specs[int(pool.group(1))]}", f"{pool.group(2)} {message}".strip()
    return WIRE_FLAGS.get(path, path), message


def parse_flags(body: Mapping[str, Any], pool_specs: Sequence[str]) -> Any:
    """`body` parsed as the service would, its errors naming the flags instead of wire paths."""
    # Imported here: the service's pydantic models cost every CLI start ~0.1 s (#34).
    from gpuplan_estimator.interfaces.http import wire

    try:
        return wire.parse_plan_request(body)
    except wire.InvalidFieldsError as exc:
        named = [in_flags(p, pool_specs) for p in exc.problems]
        raise InvalidRequestError(", ".join(f for f, _ in named),
                                  "; ".join(f"{f}: {m}" for f, m in named),
                                  tuple(f"{f}: {m}" for f, m in named)) from exc


def _gpus_per_node(spec: devices.DeviceSpec) -> int:
    return int(spec.extra.get(devices.GPUS_PER_NODE_EXTRA, DEFAULT_POOL_GPUS_PER_NODE))


def model_json(args: argparse.Namespace) -> dict[str, Any]:
    """The model of a request (wire format): the ONNX file's bytes or the --hf-config object."""
    if (args.model is None) == (args.hf_config is None):
        raise InvalidRequestError("model", "give an ONNX file or --hf-config CONFIG_JSON "
                                  "(exactly one)")
    return ({"model_onnx_b64": base64.b64encode(Path(args.model).read_bytes()).decode()}
            if args.model is not None
            else {"model_hf_config": hf_configs.hf_config_checked(args)})


def request_body(args: argparse.Namespace, catalog: devices.Catalog) -> dict[str, Any]:
    """The plan request the flags describe, in the service's wire format."""
    return {
        **model_json(args),
        "training": {"batch_size": args.batch, "dataset_size": args.dataset_size,
                     "epochs": args.epochs, "optimizer": args.optimizer,
                     "optimizer_impl": args.optimizer_impl,
                     "precision": args.precision, "attention": args.attention,
                     "dims": dict(args.dim)},
        "objective": {"prefer": args.prefer, "max_gpus": args.max_gpus,
                      "deadline_seconds": args.deadline, "budget_usd": args.budget},
        "inventory": pools(args.pool, catalog),
    }


def run_plan(args: argparse.Namespace) -> int:
    """`gpuplan plan`: the plan as a table (choice, candidates, rejections) or a document."""
    plots.check(args.plot)
    with progress.for_args(args) as shown:
        shown(Step("planning", 0, 1))
        context = dataclasses.replace(load_context(args.bundle, args.prices, args.catalog),
                                      host_probes=probing.stored_probes(args))
        body = request_body(args, context.catalog)
        result = json_documents.plan_request_json(parse_flags(body, args.pool), context,
                                                  max_candidates=None)
        shown(Step("planning", 1, 1))
    doc = {**result, "objective": body["objective"],
           "training": dict(body["training"])}
    output.warn(doc["warnings"])
    if args.plot:
        plots.write_plan(doc, args.plot)
    if output.is_document(args.output):
        if not args.all:
            doc["candidates"] = doc["candidates"][:DOCUMENT_CANDIDATES]
        output.emit_document(output.document("Plan", doc), args.output)
        return 0
    _print_plan(doc, args)
    return 0


def _print_plan(doc: Mapping[str, Any], args: argparse.Namespace) -> None:
    chosen = doc["plan"]
    output.print_lines([*summary_lines(chosen, doc), ""])
    candidates = doc["candidates"] if args.all else doc["candidates"][:TABLE_CANDIDATES]
    shown = f"{len(candidates)} of {doc['candidates_total']}"
    output.print_lines([f"candidates ({shown}, best first"
                        + ("" if args.all else "; --all lists every one") + "):"])
    output.render_table(CANDIDATE_COLUMNS, [candidate_row(c, chosen) for c in candidates],
                        wide=args.output == "wide", marked_row=next(
                            (i for i, c in enumerate(candidates) if _same(c, chosen)), None))
    lines = ["", *rejection_lines(doc["rejected"], every=args.all)]
    lines += [f"note: {n}" for n in doc.get("notes", [])]
    warning = doc["attention"]["warning"]
    if warning is not None:  # asked fused, priced eager: the figures above are eager ones
        lines.append(f"attention: NOT FUSED: {warning}")
    output.print_lines(lines)


def _same(a: Mapping[str, Any], b: Mapping[str, Any]) -> bool:
    return bool(a["gpu_type"] == b["gpu_type"] and a["gpu_count"] == b["gpu_count"])


def _cost(c: Mapping[str, Any]) -> str:
    return render.usd(c["cost_usd"]) if c["cost_usd"] is not None else "? (no price)"


def summary_lines(chosen: Mapping[str, Any], doc: Mapping[str, Any]) -> list[str]:
    """The choice in words: type, count, time with its range, cost, how it runs (layout and
    memory strategy), memory and step time by part, the settings."""
    lo, hi = chosen["interval_seconds"]
    t = doc["training"]
    obj = doc["objective"]
    limits_text = "".join([
        f", deadline {render.duration(obj['deadline_seconds'])}"
        if obj.get("deadline_seconds") else "",
        f", budget {render.usd(obj['budget_usd'])}" if obj.get("budget_usd") else ""])
    return [
        f"plan: {chosen['gpu_count']} x {chosen['gpu_type']} on {chosen['nodes']} node(s): "
        f"{render.duration(chosen['estimated_seconds'])} (p10-p90 {render.duration(lo)} to "
        f"{render.duration(hi)}), {_cost(chosen)}",
        *setup_lines(chosen),
        f"  objective {obj['prefer']}{limits_text}; {t['epochs']} epoch(s) of "
        f"{t['dataset_size']:,} samples at batch {t['batch_size']}"
        + (" (--epochs defaults to 1)" if t["epochs"] == DEFAULT_EPOCHS else ""),
    ]


def setup_lines(c: Mapping[str, Any]) -> list[str]:
    """How a candidate runs: parallelism and strategy, step and memory by part."""
    par = c.get("parallelism")
    if par is None:  # a plan without the search: plain data parallelism
        return [f"  per GPU: batch {c['per_gpu_batch']}, step {render.ms(c['step_time_ms'])} ms "
                f"(all-reduce {render.ms(c['allreduce_ms'])} ms), memory "
                f"{render.gib(c['memory_bytes_per_gpu'])}"]
    parts = ", ".join(f"{name.replace('_', ' ')} {render.ms(ms)}"
                      for name, ms in c["step_ms"].items() if ms > 0)
    memory = c["memory"]
    shown = ("parameters", "gradients", "optimizer_state", "activations",
             "gathered_parameters", "dispatch_buffers", "workspace", "framework_overhead")
    memory_parts = ", ".join(f"{name.replace('_', ' ')} {render.gib(memory[f'{name}_bytes'])}"
                             for name in shown if memory.get(f"{name}_bytes"))
    host = (f"; {render.gib(memory['host_bytes'])} of optimizer state in host memory"
            if memory.get("host_bytes") else "")
    return [
        f"  runs as {layout_text(par)}, memory strategy: {c['strategy']['label']}",
        f"  step {render.ms(c['step_time_ms'])} ms: {parts}",
        f"  memory per GPU {render.gib(c['memory_bytes_per_gpu'])}: {memory_parts}{host}",
    ]


def layout_text(par: Mapping[str, Any]) -> str:
    """``dp=2 tp=4 pp=1`` (``ep=4`` after dp when the experts are split), with the
    micro-batching when there is any."""
    text = f"dp={par['dp']}{_ep(par, ' ep=')} tp={par['tp']} pp={par['pp']}"
    if par["micro_batches"] > 1:
        text += f", {par['micro_batches']} micro-batches of {par['micro_batch']}"
    return text


def _ep(par: Mapping[str, Any], label: str) -> str:
    """`label` and the expert-parallel degree, or nothing when there is none (a plan from
    before expert parallelism has no ep)."""
    ep = par.get("ep", 1)
    return f"{label}{ep}" if ep != 1 else ""


CANDIDATE_COLUMNS = [
    output.Column(""), output.Column("GPU TYPE"), output.Column("BASIS"),
    output.Column("GPUS", numeric=True),
    output.Column("NODES", numeric=True), output.Column("LAYOUT"),
    output.Column("STRATEGY"), output.Column("STEP ms", numeric=True),
    output.Column("TIME", numeric=True), output.Column("P10-P90", numeric=True),
    output.Column("MEMORY/GPU", numeric=True), output.Column("COST", numeric=True),
    output.Column("BATCH/GPU", numeric=True, wide_only=True),
    output.Column("ALL-REDUCE ms", numeric=True, wide_only=True),
    output.Column("CALIBRATION", wide_only=True),
]


def candidate_row(c: Mapping[str, Any], chosen: Mapping[str, Any]) -> list[str]:
    """One candidate as a table row matching `CANDIDATE_COLUMNS`."""
    lo, hi = c["interval_seconds"]
    cal = c.get("calibration", {})
    par = c.get("parallelism")
    layout = (f"{par['dp']}x{par['tp']}x{par['pp']}" + _ep(par, " ep=")
              + (f" m={par['micro_batches']}" if par["micro_batches"] > 1 else "")
              if par else f"{c['gpu_count']}x1x1")
    return [
        render.RECOMMENDED_MARK if _same(c, chosen) else "", c["gpu_type"], c["data_basis"],
        str(c["gpu_count"]),
        str(c["nodes"]), layout, c["strategy"]["label"] if par else "none",
        render.ms(c["step_time_ms"]), render.duration(c["estimated_seconds"]),
        f"{render.duration(lo)}-{render.duration(hi)}",
        render.gib(c["memory_bytes_per_gpu"]), _cost(c), str(c["per_gpu_batch"]),
        render.ms(c["allreduce_ms"]),
        f"x{cal.get('factor', 1.0):.2f} ({cal.get('level', 'none')})",
    ]


def rejection_lines(rejected: Sequence[Mapping[str, Any]], *, every: bool) -> list[str]:
    """Why candidates were rejected: every one with `every`, else one line per GPU type (its
    counts and the first reason)."""
    if not rejected:
        return ["rejected: none"]
    if every:
        return [f"rejected ({len(rejected)}):",
                *(f"  {r['gpu_type']} x {r['gpu_count']}: {r['reason']}" for r in rejected)]
    groups: dict[tuple[str, str], list[Mapping[str, Any]]] = {}
    for r in rejected:  # one group per GPU type and kind of reason (numbers aside)
        groups.setdefault((r["gpu_type"], _NUMBERS.sub("#", r["reason"])), []).append(r)
    lines = [f"rejected ({len(rejected)} type/count pairs, grouped by reason with the largest "
             "count's figures; --all lists each):"]
    for (gpu_type, _), rs in groups.items():
        last = max(rs, key=lambda r: int(r["gpu_count"]))
        lines.append(f"  {gpu_type} x {count_ranges([int(r['gpu_count']) for r in rs])}: "
                     f"(x{last['gpu_count']}) {last['reason']}")
    return lines


def count_ranges(counts: Sequence[int]) -> str:
    """GPU counts compactly: ``1-4,6,8``."""
    parts: list[str] = []
    ordered = sorted(set(counts))
    start = prev = ordered[0]
    for n in [*ordered[1:], None]:
        if n is not None and n == prev + 1:
            prev = n
            continue
        parts.append(str(start) if start == prev else f"{start}-{prev}")
        if n is not None:
            start = prev = n
    return ",".join(parts)
