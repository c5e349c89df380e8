"""`gpuplan estimate ... --gpus N --dp D --tp T --pp P ...`: a named parallel layout, per rank.

The flags become the `layout` object of the service's estimate request and go through the same
parsing (`wire.parse_estimate_request`) and the same estimate (`work.estimate`) as
`POST /v1/estimate`; a problem is reported on the flag that caused it.
"""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from gpuplan_estimator import devices
from gpuplan_estimator.core import limits
from gpuplan_estimator.core.errors import InvalidRequestError
from gpuplan_estimator.interfaces.cli import arguments, output, plans, probing, render
from gpuplan_estimator.parallel import named

FLAGS = {"gpus": "--gpus", "dp": "--dp", "tp": "--tp", "pp": "--pp",
         "gpus_per_node": "--gpus-per-node", "fsdp": "--fsdp", "zero_stage": "--zero",
         "checkpointing": "--checkpointing", "checkpoint_fraction": "--checkpointing",
         "micro_batch": "--micro-batch", "gradient_accumulation": "--grad-accum",
         "pp_schedule": "--pp-schedule", "virtual_stages": "--pp-schedule", "ep": "--ep"}
"""Each `layout.<field>` of the request, by the flag that sets it."""
DEFAULT_GPUS_PER_NODE = 8
"""An HGX/DGX node; --gpus-per-node for others."""


def add_flags(p: argparse.ArgumentParser) -> None:
    """The named-layout flags of `gpuplan estimate`."""
    g = p.add_argument_group("named parallel layout (per-rank answer; docs/parallelism.md)")
    count = arguments.count_up_to(named.MAX_GPUS)
    g.add_argument("--gpus", type=count, default=None, metavar="N",
                   help="GPUs of the layout; giving it prices the layout instead of one GPU")
    g.add_argument("--dp", type=count, default=None, metavar="D",
                   help="data-parallel replicas (default: GPUs / (tp x pp))")
    g.add_argument("--tp", type=count, default=1, metavar="T", help="tensor-parallel size")
    g.add_argument("--pp", type=count, default=1, metavar="P", help="pipeline stages")
    g.add_argument("--ep", type=count, default=1, metavar="E",
                   help="expert-parallel ranks of a mixture of experts, out of the dp "
                   "replicas (must divide dp and the experts per layer)")
    g.add_argument("--gpus-per-node", type=arguments.count_up_to(limits.MAX_GPUS_PER_NODE),
                   default=DEFAULT_GPUS_PER_NODE, metavar="G",
                   help=f"GPUs per node (default {DEFAULT_GPUS_PER_NODE})")
    g.add_argument("--fsdp", choices=("full", "hybrid"), default="none",
                   help="PyTorch FSDP sharding (exclusive with --zero)")
    g.add_argument("--zero", type=int, choices=(1, 2, 3), default=0, help="DeepSpeed ZeRO stage")
    g.add_argument("--checkpointing", default="none", metavar="none|selective|full|per-block:F",
                   help="activation checkpointing; per-block:F checkpoints a fraction F of "
                   "the blocks (selective is refused: not modelled yet)")
    g.add_argument("--micro-batch", type=arguments.count_up_to(limits.MAX_BATCH_SIZE),
                   default=None, metavar="M", help="samples per micro-batch")
    g.add_argument("--grad-accum", type=arguments.count_up_to(limits.MAX_BATCH_SIZE),
                   default=None, metavar="A",
                   help="micro-batches per step and replica (the pipeline's under --tp/--pp)")
    g.add_argument("--pp-schedule", default="1f1b", metavar="1f1b|interleaved:V",
                   help="pipeline schedule; interleaved with V model chunks per rank")


def given(args: argparse.Namespace) -> bool:
    """Whether the command line names a layout."""
    return args.gpus is not None


def layout_json(args: argparse.Namespace) -> dict[str, Any]:
    """The `layout` object the flags describe (wire format)."""
    checkpointing, _, fraction = str(args.checkpointing).partition(":")
    schedule, _, chunks = str(args.pp_schedule).partition(":")
    dp = args.dp
    if dp is None:
        dp, left = divmod(args.gpus, args.tp * args.pp)
        if left or dp == 0:
            raise InvalidRequestError("--dp", f"--gpus {args.gpus} is not a multiple of "
                                      f"--tp x --pp = {args.tp * args.pp}")
    return {"gpus": args.gpus, "dp": dp, "tp": args.tp, "pp": args.pp,
            "gpus_per_node": args.gpus_per_node, "fsdp": args.fsdp, "zero_stage": args.zero,
            "checkpointing": checkpointing,
            "checkpoint_fraction": _number("--checkpointing", fraction, float),
            "micro_batch": args.micro_batch, "gradient_accumulation": args.grad_accum,
            "pp_schedule": schedule,
            "virtual_stages": _number("--pp-schedule", chunks, int) or 1, "ep": args.ep}


def _number(flag: str, text: str, kind: type[float] | type[int]) -> Any:
    if not text:
        return None
    try:
        return kind(text)
    except ValueError:
        raise InvalidRequestError(flag, f"expected a number after ':', got {text!r}") from None


def request_body(args: argparse.Namespace) -> dict[str, Any]:
    """The estimate request the flags describe, layout included (wire format)."""
    if args.torch is not None:
        raise InvalidRequestError("--torch", "with --gpus: give an ONNX file or --hf-config")
    model = plans.model_json(args)
    if args.batch is None:
        raise InvalidRequestError("--batch", "a named layout needs the global batch")
    training = {"batch_size": args.batch, "epochs": 1, "optimizer": args.optimizer,
                "optimizer_impl": args.optimizer_impl, "precision": args.precision,
                "attention": args.attention, "mode": args.mode, "dims": dict(args.dim)}
    return {**model, "training": training, "devices": list(args.device),
            "layout": layout_json(args)}


def _flagged(exc: InvalidRequestError) -> InvalidRequestError:
    """`exc` with each `layout.<field>` named by its flag."""
    from gpuplan_estimator.interfaces.http import wire  # see `run`

    problems = exc.problems if isinstance(exc, wire.InvalidFieldsError) \
        else ((exc.field, exc.message),)
    named_problems = [(_flag(path), message) for path, message in problems]
    lines = tuple(f"{f}: {m}" for f, m in named_problems)
    if len(lines) == 1:
        return InvalidRequestError(*named_problems[0])
    return InvalidRequestError(", ".join(dict.fromkeys(f for f, _ in named_problems)),
                               "; ".join(lines), details=lines)


def _flag(path: str) -> str:
    if path.startswith(named.FIELD_PREFIX):
        return FLAGS.get(path[len(named.FIELD_PREFIX):], path)
    return {"training.batch_size": "--batch",
            "training.optimizer_impl": "--optimizer-impl"}.get(path, path)


def run(args: argparse.Namespace) -> int:
    """`gpuplan estimate` with a named layout: the per-rank table, or the document."""
    # Imported here, not at start-up: the service's pydantic models cost every CLI call
    # ~0.1 s, and only a named layout goes through them (#34).
    from gpuplan_estimator.interfaces.http import wire, work

    body = request_body(args)
    prices = devices.read_prices_file(args.prices) if args.prices else None
    context = dataclasses.replace(plans.load_context(args.bundle, prices),
                                  host_probes=probing.stored_probes(args))
    try:
        doc = work.estimate(wire.parse_estimate_request(body), context)
    except InvalidRequestError as exc:
        raise _flagged(exc) from exc
    if output.is_document(args.output):
        output.emit_document(output.document("LayoutEstimate", doc), args.output)
    else:
        output.print_lines([line for e in doc["layout_estimates"] for line in rank_lines(e)])
    return 0


def rank_lines(e: Mapping[str, Any]) -> Sequence[str]:
    """One device's per-rank answer as text."""
    lay, step, mem = e["layout"], e["step_ms"], e["memory_per_rank"]
    comm = ", ".join(f"{k} {v:.2f}" for k, v in step["exposed_comm"].items() if v)
    tokens = e["throughput"]["tokens_per_s_per_gpu"]
    mfu = f"{e['mfu']:.1%}" if e["mfu"] is not None else "n/a"
    return [
        f"{e['device']}: dp={lay['dp']} tp={lay['tp']} pp={lay['pp']}"
        f"{' ep=' + str(lay['ep']) if lay['ep'] != 1 else ''} on {lay['gpus']} GPUs, "
        f"micro-batch {lay['micro_batch']} x {lay['micro_batches']}, {lay['strategy']}",
        f"  step {e['step_time_ms']:.2f} ms = compute {step['compute']:.2f} + exposed comm "
        f"[{comm or 'none'}] + bubble {step['pipeline_bubble']:.2f} + host {step['host']:.2f}",
        f"  memory per rank {render.gib(mem['total_bytes'])} of "
        f"{render.gib(e['memory_available_bytes'])} ({'fits' if e['fits'] else 'DOES NOT FIT'})"
        f": params {render.gib(mem['parameters_bytes'])}, grads "
        f"{render.gib(mem['gradients_bytes'])}, optimizer "
        f"{render.gib(mem['optimizer_state_bytes'])}, activations "
        f"{render.gib(mem['activations_bytes'])}"
        + (f"; experts' states {render.gib(mem['expert_states_bytes'])}, all-to-all buffers "
           f"{render.gib(mem['dispatch_buffers_bytes'])}" if mem["expert_states_bytes"] else ""),
        f"  {tokens:,.0f} tokens/s per GPU, MFU {mfu}" if tokens is not None
        else f"  {e['throughput']['samples_per_s_per_gpu']:,.1f} samples/s per GPU, MFU {mfu}",
    ]
