"""`gpuplan estimate`, `gpuplan strip` and `gpuplan devices`: the commands that need no database."""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from typing import Any

from gpuplan_estimator import devices, graph
from gpuplan_estimator.core import limits, options
from gpuplan_estimator.core.errors import InvalidRequestError
from gpuplan_estimator.graph import batching, exporting, zoo
from gpuplan_estimator.interfaces.cli import arguments, render
from gpuplan_estimator.models import selection
from gpuplan_estimator.planning import estimates
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
                   f"{', '.join(zoo.MODEL_TYPES)} are built without torch; any other "
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
    p.add_argument("--mode", choices=options.MODES, default=options.DEFAULT_MODE)
    p.add_argument("--batch", type=arguments.count_up_to(limits.MAX_BATCH_SIZE),
                   default=None,
                   help="global batch; binds the model's symbolic batch dim")
    p.add_argument("--dim", action="append", type=arguments.dim_binding, default=[],
                   metavar="NAME=V", help="bind a symbolic dim, e.g. sequence=1024 (repeatable)")
    p.add_argument("--optimizer", choices=options.OPTIMIZERS, default=options.DEFAULT_OPTIMIZER)
    p.add_argument("--precision", choices=options.PRECISIONS, default=options.DEFAULT_PRECISION)
    p.add_argument("--framework", choices=options.FRAMEWORKS,
                   default=options.DEFAULT_FRAMEWORK,
                   help="onnxruntime: inference with its graph fusions (BN folded, ...)")
    p.add_argument("--epochs", type=arguments.count_up_to(limits.MAX_EPOCHS), default=None)
    p.add_argument("--dataset-size", type=arguments.count_up_to(limits.MAX_DATASET_SIZE),
                   default=None,
                   help="samples per epoch")
    p.add_argument("--layers", action="store_true", help="list every layer, not the top five")
    p.add_argument("--explain", action="store_true",
                   help="every layer with its P10-P90 interval, predictor and share of the step")
    p.add_argument("--json", action="store_true", help="JSON (docs/estimate-json.md)")
    p.add_argument("--bundle", default=None, help="model bundle directory to predict with")
    p.add_argument("--cpu-backend", default=None, metavar="NAME",
                   help="bundle backend that prices CPU devices, or a unique prefix of one "
                   "(e.g. torch: PyTorch eager rows); default: the bundle's main CPU backend")
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
        return exporting.from_torch_factory(factory)
    config = zoo.load_hf_config(args.hf_config)
    if exporting.needs_export(config):
        if args.batch is None:
            raise InvalidRequestError("--batch", "needed to export a model from --hf-config")
        _progress(f"building {config.get('model_type')!s} from {args.hf_config} on the meta "
                  "device and exporting it")
    return exporting.hf_config_graph(config, batch=args.batch or 1,
                                     sequence=dict(args.dim).get(batching.SEQUENCE_DIM),
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


def resolve_devices(names: Sequence[str]) -> list[devices.DeviceSpec]:
    """Named devices (deduplicated by canonical key), or every catalog GPU when none given."""
    catalog = devices.load_catalog()
    if not names:
        return list(catalog.devices)
    specs: dict[str, devices.DeviceSpec] = {}
    for name in names:
        spec = devices.resolve_device(name, catalog)
        specs.setdefault(spec.key, spec)
    return list(specs.values())


def run_estimate(args: argparse.Namespace) -> int:
    """`gpuplan estimate`: price the model on each device and print a table or JSON."""
    specs = resolve_devices(args.device)
    source = model_source(args)
    try:  # a fixed-batch export is re-batched to --batch, as `gpuplan plan` does
        g = graph.load_at_batch(source, args.batch, dict(args.dim), name=_model_name(args))
        batch = graph.model_batch(g, args.batch)
    except InvalidRequestError as exc:
        if exc.field != "batch":
            raise
        raise InvalidRequestError("--batch", exc.message) from exc
    settings = TrainingSettings(batch_size=batch, mode=args.mode,
                                optimizer=args.optimizer, precision=args.precision,
                                framework=args.framework)
    try:
        predictor, source = selection.select_predictor(args.bundle, args.cpu_backend)
    except InvalidRequestError as exc:
        raise InvalidRequestError(f"--{exc.field.replace('_', '-')}", exc.message) from exc
    results = estimates.estimate(g, specs, settings, predictor=predictor, epochs=args.epochs,
                                dataset_size=args.dataset_size)
    if args.json:
        doc = estimates.to_json(g, results, settings, predictor_source=source, epochs=args.epochs,
                               dataset_size=args.dataset_size, include_layers=args.layers)
        print(json.dumps(doc, indent=2))
        return 0
    print(render.header(g, settings, source))
    print(render.table(results))
    for r in results:
        print()
        print(render.device_detail(r, all_layers=args.layers))
        if args.explain:
            print("\n".join(explain_lines(r)))
    return 0


def explain_lines(r: estimates.DeviceEstimate) -> list[str]:
    """Per-layer predictions, most expensive first, with interval, predictor and running share."""
    total = sum(layer.total_ms for layer in r.layers) or 1.0
    lines = [f"  explain {r.device}: layer, op, fwd ms, bwd ms, p10-p90 ms, predictor, cum %"]
    running = 0.0
    for layer in sorted(r.layers, key=lambda x: -x.total_ms):
        running += layer.total_ms
        lines.append(
            f"    {layer.name[:40]:<40} {layer.op_type:<14} {layer.forward_ms:9.3f} "
            f"{layer.backward_ms:9.3f}  {layer.p10_ms:9.3f}-{layer.p90_ms:<9.3f} "
            f"{layer.predictor:<22} {100 * running / total:5.1f}")
    return lines


def _register_strip(sub: Any) -> None:
    p = sub.add_parser("strip", help="write a structure-only copy of a model (no weights)")
    p.add_argument("source", help="ONNX file")
    p.add_argument("dest", help="output file")
    p.add_argument("--compress", choices=("gzip", "xz", "zstd"), default=None)
    p.set_defaults(func=run_strip)


def run_strip(args: argparse.Namespace) -> int:
    """`gpuplan strip`: write a weight-free copy of the model and print both sizes."""
    in_bytes, out_bytes = graph.strip_weights(args.source, args.dest, compress=args.compress)
    print(f"{args.source}: {in_bytes} bytes -> {args.dest}: {out_bytes} bytes "
          f"({out_bytes / in_bytes:.1%})" if in_bytes else f"{args.dest}: {out_bytes} bytes")
    return 0


def _register_devices(sub: Any) -> None:
    p = sub.add_parser("devices", help="list the device catalog")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=run_devices)


def run_devices(args: argparse.Namespace) -> int:
    """`gpuplan devices`: print the device catalog as a table or JSON."""
    catalog = devices.load_catalog()
    if args.json:
        print(json.dumps([_device_json(d) for d in catalog.devices], indent=2))
        return 0
    print(f"{'key':<22} {'name':<28} {'memory':>9} {'GB/s':>7} {'fp32':>6} {'fp16':>6} "
          f"{'$/h':>6}")
    for d in catalog.devices:
        price = f"{d.price_per_hour_usd:.2f}" if d.price_per_hour_usd > 0 else "-"
        print(f"{d.key:<22} {d.name[:28]:<28} {render.gib(d.memory_bytes):>9} "
              f"{d.mem_bandwidth_gbps:>7.0f} {d.peak_tflops.get('fp32', 0):>6.1f} "
              f"{d.peak_tflops.get('fp16', 0):>6.1f} {price:>6}")
    return 0


def _device_json(d: devices.DeviceSpec) -> dict[str, Any]:
    return {
        "key": d.key, "name": d.name, "vendor": d.vendor, "memory_bytes": d.memory_bytes,
        "mem_bandwidth_gbps": d.mem_bandwidth_gbps, "peak_tflops": dict(d.peak_tflops),
        "sm_count": d.sm_count, "boost_clock_mhz": d.boost_clock_mhz,
        "l2_cache_mb": d.l2_cache_mb, "tdp_watts": d.tdp_watts,
        "price_per_hour_usd": d.price_per_hour_usd, "interconnect": d.interconnect,
        "interconnect_gbps": d.interconnect_gbps, "nvml_names": list(d.nvml_names),
        "gfd_products": list(d.gfd_products),
    }
