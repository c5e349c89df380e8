"""`gpuplan estimate`, `gpuplan strip` and `gpuplan devices`: the commands that need no database."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from gpuplan_estimator import devices, graph
from gpuplan_estimator.core import limits, options
from gpuplan_estimator.core.errors import InvalidRequestError
from gpuplan_estimator.core.layers import ModelGraph
from gpuplan_estimator.core.progress import Step
from gpuplan_estimator.graph import batching, exporting
from gpuplan_estimator.interfaces import json_documents
from gpuplan_estimator.interfaces.cli import (
    arguments,
    exits,
    hf_configs,
    layouts,
    output,
    plots,
    probing,
    progress,
    render,
)
from gpuplan_estimator.latency import basis, selection
from gpuplan_estimator.planning import estimates, ranking
from gpuplan_estimator.step.decomposition import TrainingSettings


def register(sub: Any) -> None:
    """Add the `estimate`, `strip` and `devices` subcommands."""
    _register_estimate(sub)
    _register_strip(sub)
    _register_devices(sub)


def _register_estimate(sub: Any) -> None:
    p = sub.add_parser("estimate", help="predict step time, epoch time and memory per GPU type")
    p.add_argument("model", nargs="?", default=None,
                   help="ONNX file (plain, gzip, xz or zstd; weights optional)")
    p.add_argument("--hf-config", default=None, metavar="CONFIG_JSON",
                   help="instead of an ONNX file: a Hugging Face config.json. model_type "
                   f"{', '.join(exporting.WRITTEN_MODEL_TYPES)} are written without torch "
                   "(in seconds); any other "
                   "architecture transformers knows is built on the meta device and exported "
                   "(needs gpuplan[torch] and transformers). Text models need --batch and "
                   "--dim sequence=N")
    p.add_argument("--torch", default=None, metavar="MODULE:FACTORY",
                   help="instead of an ONNX file: a function returning (nn.Module, example "
                   "args), built on the meta device and exported (needs gpuplan[torch])")
    where = p.add_mutually_exclusive_group()
    where.add_argument("--device", action="append", default=[], metavar="D",
                       help="catalog key, NVML name, GFD label or 'cpu' (repeatable)")
    where.add_argument("--all-devices", action="store_true",
                       help="every catalog GPU (the default when no --device is given)")
    p.add_argument("--mode", choices=options.MODES, default=options.DEFAULT_MODE,
                   help=f"train (forward, backward, optimizer) or inference (forward only); "
                   f"default {options.DEFAULT_MODE}")
    p.add_argument("--batch", type=arguments.count_up_to(limits.MAX_BATCH_SIZE),
                   default=None, metavar="N",
                   help="global batch; binds the model's symbolic batch dim, and a fixed-batch "
                   "export is re-batched to it")
    p.add_argument("--dim", action="append", type=arguments.dim_binding, default=[],
                   metavar="NAME=V", help="bind a symbolic dim, e.g. sequence=1024 (repeatable)")
    p.add_argument("--optimizer", choices=options.OPTIMIZERS, default=options.DEFAULT_OPTIMIZER,
                   help=f"optimizer whose update step and state are priced (training only; "
                   f"default {options.DEFAULT_OPTIMIZER})")
    arguments.add_optimizer_impl(p)
    p.add_argument("--precision", choices=options.PRECISIONS, default=options.DEFAULT_PRECISION,
                   help=f"compute precision (default {options.DEFAULT_PRECISION})")
    p.add_argument("--framework", choices=options.FRAMEWORKS,
                   default=options.DEFAULT_FRAMEWORK,
                   help=f"how kernels are run (default {options.DEFAULT_FRAMEWORK}); "
                   "onnxruntime: inference with its graph fusions (BN folded, ...)")
    p.add_argument("--attention", choices=options.ATTENTIONS,
                   default=options.DEFAULT_ATTENTION,
                   help=f"how the attention core runs (default {options.DEFAULT_ATTENTION}): "
                   "eager, op by op with the score matrix in memory; fused, one SDPA/"
                   "FlashAttention kernel (Hugging Face's attn_implementation=\"sdpa\")")
    p.add_argument("--epochs", type=arguments.count_up_to(limits.MAX_EPOCHS), default=None,
                   metavar="N",
                   help="epochs of the run, for time and cost per run (needs --dataset-size; "
                   "default: none, the table shows cost per epoch or per 1,000 steps)")
    p.add_argument("--dataset-size", type=arguments.count_up_to(limits.MAX_DATASET_SIZE),
                   default=None, metavar="SAMPLES",
                   help="samples per epoch, for time and cost per epoch")
    p.add_argument("--prefer", choices=options.OBJECTIVES, default=options.DEFAULT_OBJECTIVE,
                   help="what the table is sorted by and the recommendation optimises: cost "
                   "per step (cheapest), step time (fastest) or cost x time (balanced); "
                   f"default {options.DEFAULT_OBJECTIVE}; unknown prices never count as free")
    p.add_argument("--details", action="store_true",
                   help="the detail block of every device, not only the recommended one")
    p.add_argument("--explain", action="store_true",
                   help="where the step time goes: rolled up by op type and by block "
                   "(transformer layer, ResNet stage)")
    p.add_argument("--layers", action="store_true",
                   help="with --explain: also every layer with its P10-P90 interval and "
                   "predictor; in JSON/YAML: every layer, not the top five")
    output.add_output_argument(p)
    p.add_argument("--plot", default=None, metavar="FILE",
                   help="also draw the step-time split and memory breakdown per device to FILE "
                   "(.png, .svg or a self-contained .html; needs gpuplan[plot])")
    p.add_argument("--bundle", default=None, metavar="DIR",
                   help="model bundle directory to predict with (default: the newest in the "
                   "data dir, else the shipped one)")
    probing.add_db_flag(p)
    p.add_argument("--cpu-backend", default=None, metavar="NAME",
                   help="bundle backend that prices CPU devices, or a unique prefix of one "
                   "(e.g. torch: PyTorch eager rows); default: the bundle's main CPU backend")
    arguments.add_prices_flag(p)
    arguments.add_catalog_flag(p)
    progress.add_flag(p)
    layouts.add_flags(p)
    p.set_defaults(func=run_estimate)


def model_source(args: argparse.Namespace) -> str | bytes:
    """The model to estimate: the ONNX file named, or the graph built from --hf-config or
    --torch (exactly one of the three)."""
    given = [name for name, value in (("model", args.model), ("--hf-config", args.hf_config),
                                      ("--torch", args.torch)) if value is not None]
    if len(given) != 1:
        raise InvalidRequestError("model", "give an ONNX file, --hf-config CONFIG_JSON or "
                                  f"--torch MODULE:FACTORY (exactly one; got {given or 'none'})")
    if args.model is not None:
        return str(args.model)
    if args.torch is not None:
        factory = exporting.resolve_factory(args.torch)
        _progress(f"building {args.torch} on the meta device and exporting it")
        return exporting.from_torch_factory(factory, batch=args.batch)
    config = hf_configs.hf_config_checked(args)
    sequence = dict(args.dim).get(batching.SEQUENCE_DIM)
    if exporting.needs_export(config):
        exporting.require_export_packages()
        _progress(f"building {config.get('model_type')!s} from {args.hf_config} on the meta "
                  "device and exporting it")
    return exporting.hf_config_graph(config, batch=args.batch or 1, sequence=sequence,
                                     label=args.hf_config, name=_model_name(args))


def _model_name(args: argparse.Namespace) -> str | None:
    """A built model's name: the config file's stem, or the factory; None for an ONNX file
    (its graph names it)."""
    if args.hf_config is not None:
        return os.path.splitext(os.path.basename(args.hf_config))[0]
    return args.torch


def _progress(message: str) -> None:
    """One line on stderr before work that takes seconds, so the wait has a reason."""
    print(f"gpuplan: {message} ...", file=sys.stderr, flush=True)


def resolve_devices(names: Sequence[str], catalog: devices.Catalog | None = None
                    ) -> list[devices.DeviceSpec]:
    """Named devices (deduplicated by canonical key), or every catalog GPU when none given."""
    catalog = catalog if catalog is not None else devices.load_catalog()
    if not names:
        return list(catalog.devices)
    specs: dict[str, devices.DeviceSpec] = {}
    for name in names:
        spec = devices.resolve_device(name, catalog)
        specs.setdefault(spec.key, spec)
    return list(specs.values())


def run_estimate(args: argparse.Namespace) -> int:
    """`gpuplan estimate`: price the model on each device; a ranked table, or a document.
    With --gpus, a named parallel layout per rank instead (`cli.layouts`)."""
    if layouts.given(args):
        return layouts.run(args)
    plots.check(args.plot)
    if args.epochs is not None and args.dataset_size is None:  # before any model is built
        raise InvalidRequestError("--epochs", "needs --dataset-size N too (samples per epoch)")
    arguments.check_optimizer_impl(args)
    specs = resolve_devices(args.device, arguments.catalog(args.prices, args.catalog))
    if not args.device:  # the whole catalog: leave out GPUs without this precision's math
        specs = [d for d in specs if devices.supports_precision(d, args.precision)]
    with progress.for_args(args) as shown:
        shown(Step("loading model", 0, None))
        source = model_source(args)
        g, batch = _load(source, args)
        settings = TrainingSettings(batch_size=batch, mode=args.mode,
                                    optimizer=args.optimizer, precision=args.precision,
                                    framework=args.framework, attention=args.attention,
                                    optimizer_impl=args.optimizer_impl)
        try:
            predictor, predictor_source = selection.select_predictor(args.bundle,
                                                                     args.cpu_backend)
        except InvalidRequestError as exc:
            raise InvalidRequestError(f"--{exc.field.replace('_', '-')}", exc.message) from exc
        shown(Step("loading model", 1, 1))
        shown(Step(f"estimating on {len(specs)} device(s)", 0, 1))
        results = ranking.rank(
            estimates.estimate(g, specs, settings, predictor=predictor, epochs=args.epochs,
                               dataset_size=args.dataset_size,
                               host_probes=probing.stored_probes(args)), args.prefer)
        shown(Step(f"estimating on {len(specs)} device(s)", 1, 1))
    rec = ranking.recommend(results, args.prefer)
    doc = json_documents.estimate_json(g, results, settings, predictor_source=predictor_source,
                                  epochs=args.epochs, dataset_size=args.dataset_size,
                                  include_layers=args.layers)
    doc["objective"] = {"prefer": args.prefer, "recommended": rec.device.device
                        if rec.device else None, "reason": rec.reason}
    output.warn(doc["warnings"])
    if args.plot:
        plots.write_estimate(doc, args.plot)
    if output.is_document(args.output):
        output.emit_document(output.document("Estimate", doc), args.output)
    else:
        print_estimate(g, results, settings, predictor_source, rec, View(
            prefer=args.prefer, wide=args.output == "wide", details=args.details,
            explain=args.explain, layers=args.layers))
    if rec.device is None:
        raise exits.InfeasibleError(f"{g.name}: {rec.reason} (memory needs are in the table)")
    return 0


def _load(source: str | bytes, args: argparse.Namespace) -> tuple[ModelGraph, int]:
    """The graph at --batch (a fixed-batch export re-batched, as `gpuplan plan` does)."""
    try:
        g = graph.load_at_batch(source, args.batch, dict(args.dim), name=_model_name(args))
        return g, graph.model_batch(g, args.batch)
    except InvalidRequestError as exc:
        if exc.field != "batch":
            raise
        raise InvalidRequestError("--batch", exc.message) from exc


@dataclass(frozen=True)
class View:
    """How much of an estimate the table output shows."""

    prefer: str
    wide: bool = False
    details: bool = False
    explain: bool = False
    layers: bool = False


def print_estimate(g: ModelGraph, results: Sequence[estimates.DeviceStepEstimate],
                   settings: TrainingSettings, predictor_source: str,
                   rec: ranking.Recommendation, view: View) -> None:
    """The table, the recommendation and its detail (every device's with `view.details`)."""
    flops_line = f"{render.flops(estimates.model_flops_per_step(g, settings))} per step"
    output.print_lines([render.header(g, settings, predictor_source) + f"; {flops_line}", ""])
    output.render_table(render.estimate_columns(results, settings),
                        render.estimate_rows(results, settings, rec.device), wide=view.wide,
                        marked_row=next((i for i, r in enumerate(results) if r is rec.device),
                                        None))
    lines = ["", *render.recommendation_lines(rec, view.prefer), *render.basis_lines(results),
             *render.attention_lines(g, settings), *render.precision_lines(settings),
             *render.host_lines(results)]
    shown = results if view.details else [rec.device] if rec.device else results[:1]
    for r in shown:
        lines += ["", render.device_detail(r, mode=settings.mode), *render.top_layer_lines(r)]
        if view.explain:
            lines += render.explain_lines(r, layers=view.layers)
    if not view.details and len(results) > 1:
        lines += ["", "(--details: every device's detail; --explain: where the time goes; "
                  "-o wide: more columns; -o json: everything)"]
    output.print_lines(lines)


def _register_strip(sub: Any) -> None:
    p = sub.add_parser("strip", help="write a structure-only copy of a model (no weights)",
                       description="Write DEST: SOURCE's graph with every weight replaced by "
                       "its shape, small enough for a ConfigMap; estimates are unchanged.")
    p.add_argument("source", help="ONNX file to read")
    p.add_argument("dest", help="file to write")
    p.add_argument("--compress", choices=("gzip", "xz", "zstd"), default=None,
                   help="compress DEST (gpuplan and the operator read all three; default: none)")
    output.add_output_argument(p)
    p.set_defaults(func=run_strip)


def run_strip(args: argparse.Namespace) -> int:
    """`gpuplan strip`: write a weight-free copy of the model and print both sizes."""
    in_bytes, out_bytes = graph.strip_weights(args.source, args.dest, compress=args.compress)
    if output.is_document(args.output):
        output.emit_document(output.document("Strip", {
            "source": args.source, "source_bytes": in_bytes, "dest": args.dest,
            "dest_bytes": out_bytes, "compress": args.compress}), args.output)
        return 0
    print(f"{args.source}: {in_bytes:,} bytes -> {args.dest}: {out_bytes:,} bytes "
          f"({out_bytes / in_bytes:.1%})" if in_bytes else f"{args.dest}: {out_bytes:,} bytes")
    return 0


def _register_devices(sub: Any) -> None:
    p = sub.add_parser("devices", help="list the device catalog, with what each GPU's "
                       "estimates rest on")
    output.add_output_argument(p)
    p.add_argument("--bundle", default=None, metavar="DIR",
                   help="model bundle whose coverage the BASIS column shows (default: the "
                   "newest in the data dir, else the shipped one)")
    arguments.add_prices_flag(p)
    arguments.add_catalog_flag(p)
    p.set_defaults(func=run_devices)


DEVICE_COLUMNS = [
    output.Column("KEY"), output.Column("NAME"), output.Column("MEMORY", numeric=True),
    output.Column("GB/S", numeric=True), output.Column("FP32 TFLOPS", numeric=True),
    output.Column("BF16 TFLOPS", numeric=True), output.Column("$/H", numeric=True),
    output.Column("BASIS"), output.Column("SOURCE"),
    output.Column("SMS", numeric=True, wide_only=True),
    output.Column("L2 MB", numeric=True, wide_only=True),
    output.Column("INTERCONNECT", wide_only=True), output.Column("PRICE SOURCE", wide_only=True),
]


def run_devices(args: argparse.Namespace) -> int:
    """`gpuplan devices`: the device catalog as a table or a document."""
    catalog = arguments.catalog(args.prices, args.catalog)
    predictor, _ = selection.select_predictor(args.bundle)
    bases = {d.key: basis.data_basis(predictor, d) for d in catalog.devices}
    if output.is_document(args.output):
        output.emit_document(output.document("DeviceList", {"devices": [
            {**_device_json(d), "data_basis": bases[d.key]} for d in catalog.devices]}),
            args.output)
        return 0
    output.render_table(DEVICE_COLUMNS, [
        [d.key, d.name, render.gib(d.memory_bytes), f"{d.mem_bandwidth_gbps:,.0f}",
         _tflops(d, "fp32"), _tflops(d, "bf16"),
         f"{d.price_per_hour_usd:.2f}" if d.has_price else "?", bases[d.key],
         d.catalog_source, str(d.sm_count), f"{d.l2_cache_mb:g}",
         f"{d.interconnect} {d.interconnect_gbps:g} GB/s",
         d.price_source or "-"]
        for d in catalog.devices], wide=args.output == "wide")
    return 0


def _tflops(d: devices.DeviceSpec, precision: str) -> str:
    value = d.peak_tflops.get(precision)
    return f"{value:.1f}" if value else "-"


def _device_json(d: devices.DeviceSpec) -> dict[str, Any]:
    return {
        "key": d.key, "name": d.name, "vendor": d.vendor, "memory_bytes": d.memory_bytes,
        "mem_bandwidth_gbps": d.mem_bandwidth_gbps, "peak_tflops": dict(d.peak_tflops),
        "sm_count": d.sm_count, "boost_clock_mhz": d.boost_clock_mhz,
        "l2_cache_mb": d.l2_cache_mb, "tdp_watts": d.tdp_watts,
        "price_per_hour_usd": d.price_per_hour_usd, "interconnect": d.interconnect,
        "interconnect_gbps": d.interconnect_gbps, "nvml_names": list(d.nvml_names),
        "gfd_products": list(d.gfd_products), "catalog_source": d.catalog_source,
        "price_source": d.price_source,
    }
