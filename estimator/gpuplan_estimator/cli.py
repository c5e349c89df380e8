"""The `gpuplan` command line: estimate, strip, devices, demo, plus plugged-in subcommands.

Other modules add subcommands by defining ``register(subparsers)`` (each parser sets
``func``: args → exit code) and being listed in `COMMAND_MODULES`. Every `GpuplanError` and
usage error becomes one ``gpuplan: error: ...`` line on stderr and exit code 2; ``--debug``
shows the traceback instead.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
import traceback
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, NoReturn

from gpuplan_estimator import devices, estimate, graph, render
from gpuplan_estimator.errors import GpuplanError, InvalidRequestError
from gpuplan_estimator.framework import FRAMEWORKS, PYTORCH_EAGER
from gpuplan_estimator.layers import OpFamily
from gpuplan_estimator.predictors import LatencyPredictor
from gpuplan_estimator.training_step import (
    FLOAT_DTYPES,
    OPTIMIZERS,
    PRECISIONS,
    TrainingSettings,
)

# Modules whose `register(subparsers)` adds subcommands (bench, import, train, eval, serve, plan).
COMMAND_MODULES: tuple[str, ...] = (
    "gpuplan_estimator.bench.cli",
    "gpuplan_estimator.train_cli",
    "gpuplan_estimator.serve_cli",
    "gpuplan_estimator.evaluation.cli",
)
BUILTIN_COMMANDS = frozenset({"estimate", "strip", "devices", "demo"})
EXIT_USAGE = 2


class UsageError(GpuplanError):
    """A command-line usage error (argparse's), reported like any other bad input."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{self.prog}: {message}")


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; returns the exit code (the console script exits with it)."""
    args_list = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in args_list
    try:
        parser = build_parser(plugins=_wants_plugins(args_list))
        args = parser.parse_args(args_list)
        func: Callable[[argparse.Namespace], int] | None = getattr(args, "func", None)
        if func is None:
            parser.print_help(sys.stderr)
            return EXIT_USAGE
        return func(args)
    except GpuplanError as exc:
        if debug:
            traceback.print_exc()
        print(f"gpuplan: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except BrokenPipeError:  # `gpuplan ... | head`: the reader left, nothing to report
        sys.stdout = open(os.devnull, "w")  # noqa: SIM115 - silences the flush at exit
        return 0
    except OSError as exc:  # files the user named: unreadable input, unwritable output
        if debug:
            traceback.print_exc()
        name = f"{exc.filename}: " if exc.filename else ""
        print(f"gpuplan: error: {name}{exc.strerror or exc}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("gpuplan: interrupted", file=sys.stderr)
        return 130


def _wants_plugins(argv: Sequence[str]) -> bool:
    """Plugged-in modules import SQLAlchemy, SciPy, ...: skip them for the built-in commands."""
    command = next((a for a in argv if not a.startswith("-")), None)
    return command not in BUILTIN_COMMANDS


def build_parser(*, plugins: bool = True) -> argparse.ArgumentParser:
    parser = _Parser(prog="gpuplan", description="GPU right-sizing for deep-learning training.")
    parser.add_argument("--debug", action="store_true", help="show tracebacks of errors")
    sub = parser.add_subparsers(title="commands", metavar="COMMAND", parser_class=_Parser)
    _register_estimate(sub)
    _register_strip(sub)
    _register_devices(sub)
    from gpuplan_estimator import demo  # demo imports this module's helpers

    demo.register(sub)
    for module_name in COMMAND_MODULES if plugins else ():
        importlib.import_module(module_name).register(sub)
    return parser


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be positive, got {value}")
    return value


def dim_binding(text: str) -> tuple[str, int]:
    name, sep, value = text.partition("=")
    if not sep or not name:
        raise argparse.ArgumentTypeError(f"expected NAME=VALUE, got {text!r}")
    return name, positive_int(value)


def _register_estimate(sub: Any) -> None:
    p = sub.add_parser("estimate", help="predict step time, epoch time and memory per GPU type")
    p.add_argument("model", help="ONNX file (plain, gzip, xz or zstd; weights optional)")
    where = p.add_mutually_exclusive_group()
    where.add_argument("--device", action="append", default=[], metavar="D",
                       help="catalog key, NVML name, GFD label or 'cpu' (repeatable)")
    where.add_argument("--all-devices", action="store_true",
                       help="every catalog GPU (the default when no --device is given)")
    p.add_argument("--mode", choices=("train", "inference"), default="train")
    p.add_argument("--batch", type=positive_int, default=None,
                   help="global batch; binds the model's symbolic batch dim")
    p.add_argument("--dim", action="append", type=dim_binding, default=[], metavar="NAME=V",
                   help="bind a symbolic dim, e.g. sequence=1024 (repeatable)")
    p.add_argument("--optimizer", choices=OPTIMIZERS, default="adam")
    p.add_argument("--precision", choices=PRECISIONS, default="fp32")
    p.add_argument("--framework", choices=FRAMEWORKS, default=PYTORCH_EAGER,
                   help="onnxruntime: inference with its graph fusions (BN folded, ...)")
    p.add_argument("--epochs", type=positive_int, default=None)
    p.add_argument("--dataset-size", type=positive_int, default=None, help="samples per epoch")
    p.add_argument("--layers", action="store_true", help="list every layer, not the top five")
    p.add_argument("--explain", action="store_true",
                   help="every layer with its P10-P90 interval, predictor and share of the step")
    p.add_argument("--json", action="store_true", help="JSON (docs/estimate-json.md)")
    p.add_argument("--bundle", default=None, help="model bundle directory to predict with")
    p.add_argument("--cpu-backend", default=None, metavar="NAME",
                   help="bundle backend that prices CPU devices, or a unique prefix of one "
                   "(e.g. torch: PyTorch eager rows); default: the bundle's main CPU backend")
    p.set_defaults(func=run_estimate)


def select_predictor(bundle_dir: str | None, cpu_backend: str | None = None
                     ) -> tuple[LatencyPredictor, str]:
    """The predictor and where it comes from, e.g. ``bundle:/path (data-dir)`` or ``roofline``.

    An explicit bundle must load; otherwise the newest valid bundle in the data dir, else the
    shipped one, else (no bundle shipped in this build) the roofline. `cpu_backend` names (or
    uniquely prefixes) the bundle's CPU backend that prices CPU devices.
    """
    from gpuplan_estimator import bundle, latency, roofline

    explicit = Path(bundle_dir) if bundle_dir is not None else None
    path, origin = bundle.find_bundle_with_origin(explicit)
    if origin == "shipped" and not (path / bundle.MANIFEST).is_file():
        if cpu_backend is not None:
            raise InvalidRequestError("--cpu-backend", "no model bundle to choose from")
        return roofline.RooflinePredictor(), "roofline"
    loaded = bundle.load_bundle(path, origin=origin)
    source = f"bundle:{path} ({origin})"
    if cpu_backend is None:
        return latency.LearnedPredictor(loaded), source
    name = cpu_backend_name(loaded.manifest, cpu_backend)
    return latency.LearnedPredictor(loaded, backend={"cpu": name}), f"{source}, CPU as {name}"


def cpu_backend_name(manifest: Mapping[str, Any], wanted: str) -> str:
    """The bundle's CPU backend named `wanted` exactly or, failing that, by a unique prefix."""
    # `gpuplan bench` names backends <backend>-<version>-<cpu|cuda>.
    default = manifest.get("default_backends", {}).get("cpu")
    cpu = [b for b in manifest.get("backends", []) if b.endswith("-cpu") or b == default]
    matches = [b for b in cpu if b == wanted] or [b for b in cpu if b.startswith(wanted)]
    if len(matches) != 1:
        found = "several match" if matches else "none matches"
        raise InvalidRequestError(
            "--cpu-backend", f"{wanted!r}: {found}; the bundle's CPU backends are "
            f"{', '.join(cpu) or 'none'}")
    return matches[0]


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
    specs = resolve_devices(args.device)
    g = graph.load_model(args.model, batch=args.batch, dim_bindings=dict(args.dim))
    settings = TrainingSettings(batch_size=model_batch(g, args.batch), mode=args.mode,
                                optimizer=args.optimizer, precision=args.precision,
                                framework=args.framework)
    predictor, source = select_predictor(args.bundle, args.cpu_backend)
    results = estimate.estimate(g, specs, settings, predictor=predictor, epochs=args.epochs,
                                dataset_size=args.dataset_size)
    if args.json:
        doc = estimate.to_json(g, results, settings, predictor_source=source, epochs=args.epochs,
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


def explain_lines(r: estimate.DeviceEstimate) -> list[str]:
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


def model_batch(g: graph.ModelGraph, requested: int | None) -> int:
    """The batch the graph was built at: `requested` when it bound a dim, else the graph's own.

    A model with a fixed batch cannot be re-batched by a flag; saying so beats estimating a
    different batch than the one asked for.
    """
    first = _first_data_dim(g)
    if requested is None:
        if first is None:
            raise InvalidRequestError("--batch", "cannot tell the model's batch; pass --batch N")
        return first
    if first is not None and first != requested:
        raise InvalidRequestError(
            "--batch", f"the model has a fixed batch of {first}; it cannot run at {requested}")
    return requested


def _first_data_dim(g: graph.ModelGraph) -> int | None:
    produced = {t.name for layer in g.layers for t in layer.outputs}
    params = {name for layer in g.layers for name in layer.parameter_inputs}
    for layer in g.layers:
        for t in layer.inputs:
            if (t.name not in produced and t.name not in params and t.shape
                    and t.dtype in FLOAT_DTYPES | {"int64", "int32"}
                    and layer.family is not OpFamily.SHAPE_ONLY):
                return t.shape[0]
    return None


def _register_strip(sub: Any) -> None:
    p = sub.add_parser("strip", help="write a structure-only copy of a model (no weights)")
    p.add_argument("source", help="ONNX file")
    p.add_argument("dest", help="output file")
    p.add_argument("--compress", choices=("gzip", "xz", "zstd"), default=None)
    p.set_defaults(func=run_strip)


def run_strip(args: argparse.Namespace) -> int:
    in_bytes, out_bytes = graph.strip_weights(args.source, args.dest, compress=args.compress)
    print(f"{args.source}: {in_bytes} bytes -> {args.dest}: {out_bytes} bytes "
          f"({out_bytes / in_bytes:.1%})" if in_bytes else f"{args.dest}: {out_bytes} bytes")
    return 0


def _register_devices(sub: Any) -> None:
    p = sub.add_parser("devices", help="list the device catalog")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=run_devices)


def run_devices(args: argparse.Namespace) -> int:
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


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
