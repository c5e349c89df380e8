"""A parallel layout the user names (issue #34): checked, then resolved into the planner's own
types (`ParallelLayout`, `MemoryStrategy`, micro-batch) so that it is priced by the very
function the planner's search ranks with (`setups.timed`).

The planner's conventions carry over. Under plain data parallelism (tp = pp = 1) gradient
accumulation is the strategy's (`MemoryStrategy.gradient_accumulation`); under tensor or
pipeline parallelism the accumulated micro-batches are the pipeline's (`ParallelLayout.
micro_batches`), as in Megatron. Either way `layout.micro_batches` counts every micro-batch of
the step, and micro_batch x dp x micro_batches is the global batch.

What the model does not price is refused, never approximated: selective recomputation
(Korthikanti et al. 2022 §5) and ZeRO-2/3 or FSDP beside tensor/pipeline parallelism (the
planner pairs those with ZeRO-1 at most; their extra parameter gathers are not in
`layouts.step_time`), and ZeRO-3/FSDP beside expert parallelism (their expert parameter gathers
over the expert-data-parallel group are not modelled).

Expert parallelism (`ep`, `parallel.experts`) takes its ranks from the data-parallel group: it
needs a mixture-of-experts model and must divide dp and the experts per layer.

Every problem is a (field, message) pair whose field is `FIELD_PREFIX` + a `LayoutRequest`
field name; the edges map it to their own names (a CLI flag, a JSON path, a spec field).
"""

from __future__ import annotations

from dataclasses import dataclass

from gpuplan_estimator.core import limits
from gpuplan_estimator.core.errors import InvalidRequestError
from gpuplan_estimator.parallel import experts as moe
from gpuplan_estimator.parallel import layouts
from gpuplan_estimator.parallel.experts import ExpertDims
from gpuplan_estimator.parallel.layouts import ModelDims, ParallelLayout
from gpuplan_estimator.parallel.strategies import FSDP_MODES, MemoryStrategy

PP_SCHEDULES = ("1f1b", "interleaved")
CHECKPOINTING = ("none", "selective", "full", "per-block")
"""What a named layout may say; "selective" is refused with its reason (see above)."""
FIELD_PREFIX = "layout."
MAX_GPUS = 1 << 16
"""The largest GPU count (and degree, and chunk count) a named layout may give."""


@dataclass(frozen=True, kw_only=True)
class LayoutRequest:
    """A named layout as the user gives it: degrees, sharding, checkpointing and batching."""

    gpus: int
    dp: int
    tp: int
    pp: int
    gpus_per_node: int  # the node size TP groups and the interconnect model see
    fsdp: str = "none"  # one of strategies.FSDP_MODES
    zero_stage: int = 0
    checkpointing: str = "none"  # one of CHECKPOINTING
    checkpoint_fraction: float | None = None  # per-block only
    micro_batch: int | None = None  # None: global batch / (dp x gradient_accumulation)
    gradient_accumulation: int | None = None  # None: global batch / (dp x micro_batch), or 1
    pp_schedule: str = "1f1b"  # one of PP_SCHEDULES
    virtual_stages: int = 1  # model chunks per pipeline rank; > 1 only when interleaved
    ep: int = 1  # expert-parallel ranks, out of dp; > 1 only for a mixture of experts


@dataclass(frozen=True)
class ResolvedLayout:
    """A named layout in the planner's types."""

    layout: ParallelLayout  # micro_batches: every micro-batch of the step
    strategy: MemoryStrategy
    micro_batch: int
    gpus_per_node: int  # min(gpus, the request's node size), as the planner's pools give it


def _field(name: str) -> str:
    return FIELD_PREFIX + name


def _static_problems(req: LayoutRequest) -> list[tuple[str, str]]:
    """Ranges, choices and the combinations that need no model."""
    out: list[tuple[str, str]] = []
    caps = {"gpus": MAX_GPUS, "dp": MAX_GPUS, "tp": MAX_GPUS, "pp": MAX_GPUS, "ep": MAX_GPUS,
            "gpus_per_node": limits.MAX_GPUS_PER_NODE, "virtual_stages": MAX_GPUS,
            "micro_batch": limits.MAX_BATCH_SIZE, "gradient_accumulation": limits.MAX_BATCH_SIZE}
    for name, cap in caps.items():
        value = getattr(req, name)
        if value is None and name in ("micro_batch", "gradient_accumulation"):
            continue
        if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= cap:
            out.append((_field(name), f"must be an integer from 1 to {cap}, got {value!r}"))
    if out:
        return out
    if req.dp * req.tp * req.pp != req.gpus:
        out.append((_field("gpus"), f"dp x tp x pp = {req.dp} x {req.tp} x {req.pp} = "
                    f"{req.dp * req.tp * req.pp}, not the {req.gpus} GPUs given"))
    if req.fsdp not in FSDP_MODES:
        out.append((_field("fsdp"), f"must be one of {', '.join(FSDP_MODES)}, got "
                    f"{req.fsdp!r}"))
    elif req.fsdp != "none" and req.zero_stage:
        out.append((_field("zero_stage"), f"zero {req.zero_stage} with fsdp {req.fsdp}: FSDP "
                    "already shards like ZeRO-3; give one of them"))
    if req.checkpointing not in CHECKPOINTING:
        out.append((_field("checkpointing"), f"must be one of {', '.join(CHECKPOINTING)}, got "
                    f"{req.checkpointing!r}"))
    elif req.checkpointing == "selective":
        out.append((_field("checkpointing"), "selective recomputation (attention core only, "
                    "Korthikanti et al. 2022 §5) is not modelled yet; use none, full or "
                    "per-block"))
    out += _schedule_problems(req)
    out += _model_parallel_sharding_problems(req)
    if req.ep > 1 and (req.fsdp != "none" or req.zero_stage == 3):
        field_name = "fsdp" if req.fsdp != "none" else "zero_stage"
        out.append((_field(field_name), f"{field_name} {getattr(req, field_name)} is not priced "
                    f"beside expert parallelism (ep={req.ep}): its expert parameter gathers "
                    "are not modelled; use zero 1 or 2"))
    return out


def _schedule_problems(req: LayoutRequest) -> list[tuple[str, str]]:
    if req.pp_schedule not in PP_SCHEDULES:
        return [(_field("pp_schedule"), f"must be one of {', '.join(PP_SCHEDULES)}, got "
                 f"{req.pp_schedule!r}")]
    if req.pp_schedule == "1f1b" and req.virtual_stages != 1:
        return [(_field("virtual_stages"), "model chunks per rank need the interleaved "
                 "schedule")]
    if req.pp_schedule == "interleaved" and (req.pp == 1 or req.virtual_stages < 2):
        return [(_field("pp_schedule"), "interleaved needs pp > 1 and at least 2 model chunks "
                 f"per rank (got pp={req.pp}, {req.virtual_stages} chunk(s))")]
    return []


def _model_parallel_sharding_problems(req: LayoutRequest) -> list[tuple[str, str]]:
    if req.tp * req.pp == 1:
        return []
    why = ("is not priced beside tensor or pipeline parallelism (their parameter gathers are "
           "not modelled; the planner pairs tp/pp with ZeRO-1 at most)")
    if req.fsdp != "none":
        return [(_field("fsdp"), f"fsdp {req.fsdp} {why}")]
    if req.zero_stage >= 2:
        return [(_field("zero_stage"), f"zero {req.zero_stage} {why}")]
    return []


def _batching(req: LayoutRequest, global_batch: int) -> tuple[int, int] | tuple[str, str]:
    """(micro-batch, micro-batches per step), or the (field, problem) why they do not split."""
    per_replica, left = divmod(global_batch, req.dp)
    if left:
        return _field("dp"), f"global batch {global_batch} does not split over dp={req.dp}"
    micro, accum = req.micro_batch, req.gradient_accumulation
    if micro is None:
        accum = accum or 1
        if per_replica % accum:
            return (_field("gradient_accumulation"), f"{accum} does not divide the "
                    f"{per_replica} samples of each data-parallel replica")
        return per_replica // accum, accum
    if per_replica % micro:
        return (_field("micro_batch"), f"{micro} does not divide the {per_replica} samples of "
                "each data-parallel replica")
    if accum is not None and micro * accum != per_replica:
        return (_field("gradient_accumulation"), f"micro_batch x gradient_accumulation = "
                f"{micro * accum}, each data-parallel replica has {per_replica} samples")
    return micro, per_replica // micro


def resolve(req: LayoutRequest, *, global_batch: int, dims: ModelDims | None,
            training: bool, experts: ExpertDims | None) -> ResolvedLayout:
    """The planner's types for `req`; `InvalidRequestError` with every problem in `details`
    ("layout.<field>: message") and the first one's field as its own."""
    problems = _static_problems(req)
    if not problems:
        problems += [(_field(f), m) for f, m in moe.ep_problems(req.ep, experts)]
    if not training:
        problems.append((_field("gpus"), "a named layout prices a training step; the mode is "
                         "inference"))
    if problems:
        raise _error(problems)
    batching = _batching(req, global_batch)
    if isinstance(batching[0], str):
        raise _error([(str(batching[0]), str(batching[1]))])
    micro, steps = int(batching[0]), int(batching[1])
    model_parallel = req.tp * req.pp > 1
    if model_parallel and dims is None:
        raise _error([(_field("tp" if req.tp > 1 else "pp"), "the model shows no transformer "
                       "blocks with a bound sequence dim: only data parallelism is priced")])
    layout = ParallelLayout(req.dp, req.tp, req.pp, steps, req.virtual_stages, req.ep)
    gpus_per_node = min(req.gpus, req.gpus_per_node)
    for problem in layouts.layout_problems(layout, gpu_count=req.gpus,
                                           gpus_per_node=gpus_per_node,
                                           global_batch=global_batch,
                                           dims=dims if model_parallel else None):
        path, message = problem.split(": ", 1)
        problems.append((_LAYOUT_FIELDS.get(path, _field("gpus")), message))
    strategy = MemoryStrategy(zero_stage=req.zero_stage, fsdp=req.fsdp,
                              checkpointing=req.checkpointing,
                              checkpoint_fraction=req.checkpoint_fraction,
                              gradient_accumulation=1 if model_parallel else steps)
    problems += [(_field(e.split(":", 1)[0]), e.split(": ", 1)[1]) for e in strategy.validate()]
    if problems:
        raise _error(problems)
    return ResolvedLayout(layout, strategy, micro, gpus_per_node)


_LAYOUT_FIELDS = {"layout.tp": _field("tp"), "layout.pp": _field("pp"),
                  "layout.dp": _field("dp"), "layout": _field("gpus"),
                  "layout.micro_batches": _field("gradient_accumulation"),
                  "layout.virtual_stages": _field("virtual_stages"), "layout.ep": _field("ep")}
"""`layouts.layout_problems`' paths as this request's fields."""


def _error(problems: list[tuple[str, str]]) -> InvalidRequestError:
    return InvalidRequestError(problems[0][0], "; ".join(f"{f}: {m}" for f, m in problems),
                               details=tuple(f"{f}: {m}" for f, m in problems))
