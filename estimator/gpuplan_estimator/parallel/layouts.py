"""Tensor, pipeline and data parallelism (Megatron-style) priced from a single-GPU step (#19).

A layout (dp, tp, pp, micro-batches) runs `micro_batches` micro-batches of
`global_batch / (dp * micro_batches)` samples through `pp` pipeline stages, each stage split over
`tp` GPUs of one node, and `dp` such replicas. One step costs

    pipeline = sum_i stage_i + (m - 1) * max_i stage_i        (1F1B; Narayanan et al. SC'21 §2.2)
    stage_i  = compute_i + tp_comm_i + p2p_i                  (per micro-batch)
    step     = pipeline + exposed DP all-reduce + optimizer

With equal stages the pipeline is (m + pp - 1) * stage, so the bubble is (pp-1)/(m+pp-1) of it.
Compute per GPU is the single-GPU time of the layers Megatron splits, divided by tp, plus the
replicated layers whole (Shoeybi et al. 2019 §3). TP costs two all-reduces of the
micro_batch x sequence x hidden activation in forward and two in backward per block, plus one
each for the vocab-parallel embedding (forward) and output layer (backward); they are priced with
`ScalingModel.allreduce_ms` over tp GPUs on the node's link and are not overlapped with compute.
The DP gradient all-reduce carries each (tp, pp) shard's gradients and hides behind the backward
of the last micro-batch as `ScalingModel.step_time_ms` does. docs/parallelism.md has the whole
model, its sources and its comparison with published multi-GPU steps.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass

from gpuplan_estimator.core.errors import InvalidRequestError
from gpuplan_estimator.devices.catalog import DeviceSpec
from gpuplan_estimator.parallel import experts as moe
from gpuplan_estimator.parallel.experts import ExpertDims
from gpuplan_estimator.parallel.scaling import ScalingModel

TP_ALLREDUCES_PER_BLOCK = 4
"""Megatron's f/g operators: after the attention and MLP row-parallel GEMMs in forward, before
the two column-parallel GEMMs in backward (Shoeybi et al. 2019, Fig. 4)."""
TP_FORWARD_ALLREDUCES_PER_BLOCK = 2
"""Of those, the forward's: what recomputing a checkpointed block's forward runs again."""
TP_ALLREDUCES_FIRST_STAGE = 1
"""The vocab-parallel embedding's output all-reduce (forward)."""
TP_ALLREDUCES_LAST_STAGE = 1
"""The column-parallel output layer's input-gradient all-reduce (backward). The vocab-parallel
cross-entropy's three all-reduces of micro_batch x sequence scalars are left out: latency-sized."""
P2P_SENDS_PER_BOUNDARY = 2
"""Activations forward and their gradients backward, once per micro-batch per stage boundary."""

RANK_ORDERS = ("tp-dp-pp", "tp-pp-dp")
"""How ranks map to GPUs, innermost first. "tp-dp-pp" is Megatron-core's default order
(`initialize_model_parallel(order="tp-cp-ep-dp-pp")`): DP groups stay inside nodes and pipeline
stages cross them. "tp-pp-dp" is the alternative Megatron also offers."""
DEFAULT_RANK_ORDER = "tp-dp-pp"


@dataclass(frozen=True)
class ParallelLayout:
    """Data, tensor and pipeline parallel degrees and the micro-batches each step runs."""

    dp: int
    tp: int
    pp: int
    micro_batches: int
    virtual_stages: int = 1
    """Model chunks per pipeline rank: 1 is 1F1B, more is Megatron's interleaved schedule."""
    ep: int = 1
    """Expert-parallel ranks, taken from the dp group (`parallel.experts`); 1 for dense models."""

    @property
    def gpu_count(self) -> int:
        """GPUs the layout occupies: dp x tp x pp."""
        return self.dp * self.tp * self.pp

    def micro_batch_size(self, global_batch: int) -> int:
        """Samples per micro-batch; `InvalidRequestError` when the batch does not divide."""
        per = self.dp * self.micro_batches
        if global_batch % per:
            raise InvalidRequestError("layout.micro_batches", _uneven(global_batch, self))
        return global_batch // per

    def describe(self) -> str:
        """E.g. "dp=2 tp=4 pp=1 m=8" ("ep=4" after dp when the experts are split)."""
        chunks = f" v={self.virtual_stages}" if self.virtual_stages != 1 else ""
        experts = f" ep={self.ep}" if self.ep != 1 else ""
        return (f"dp={self.dp}{experts} tp={self.tp} pp={self.pp} m={self.micro_batches}"
                f"{chunks}")


@dataclass(frozen=True)
class ModelDims:
    """What the communication volumes need: activation width, length, depth and element size."""

    hidden: int
    sequence: int
    blocks: int  # transformer blocks, the units pipeline stages are cut from
    element_bytes: int  # activation element at the compute width: 4 (fp32/tf32), 2 (fp16/bf16)
    heads: int | None = None  # attention heads; tp must divide them when known


@dataclass(frozen=True)
class RegionTime:
    """Forward+backward ms of one region of the model on one GPU, by how TP treats it."""

    tp_split_ms: float  # layers Megatron splits over tp (GEMMs, attention core, MLP activation)
    replicated_ms: float  # layers every tp rank runs whole (layer norms, residual adds, ...)

    @property
    def total_ms(self) -> float:
        """Both parts."""
        return self.tp_split_ms + self.replicated_ms

    def per_gpu_ms(self, tp: int) -> float:
        """The region's time on one of `tp` GPUs."""
        return self.tp_split_ms / tp + self.replicated_ms

    def scaled(self, factor: float) -> RegionTime:
        """Both parts times `factor`."""
        return RegionTime(self.tp_split_ms * factor, self.replicated_ms * factor)


@dataclass(frozen=True)
class SingleGpuSplit:
    """One training step of the whole model on one GPU at `batch` samples (the micro-batch size),
    with its forward+backward time cut into the regions pipeline stages and TP see."""

    batch: int
    forward_ms: float
    backward_ms: float
    optimizer_ms: float
    gradient_bytes: int  # all-reduced by data parallelism
    pre: RegionTime  # before the first block: embeddings (first stage)
    blocks: RegionTime  # every block together
    post: RegionTime  # after the last block: final norm, output layer (last stage)

    @classmethod
    def from_totals(cls, *, batch: int, forward_ms: float, backward_ms: float,
                    optimizer_ms: float, gradient_bytes: int, tp_split_fraction: float
                    ) -> SingleGpuSplit:
        """The simple input: step totals and the share of forward+backward in TP-split layers,
        all of it counted as blocks (no embedding or output layer of its own)."""
        if not 0.0 <= tp_split_fraction <= 1.0:
            raise InvalidRequestError("tp_split_fraction",
                                      f"must be within [0, 1], got {tp_split_fraction!r}")
        compute = forward_ms + backward_ms
        zero = RegionTime(0.0, 0.0)
        return cls(batch=batch, forward_ms=forward_ms, backward_ms=backward_ms,
                   optimizer_ms=optimizer_ms, gradient_bytes=gradient_bytes, pre=zero,
                   blocks=RegionTime(compute * tp_split_fraction,
                                     compute * (1.0 - tp_split_fraction)),
                   post=zero)

    @property
    def compute_ms(self) -> float:
        """Forward plus backward."""
        return self.forward_ms + self.backward_ms

    @property
    def backward_fraction(self) -> float:
        """Share of forward+backward spent in backward (what can hide the DP all-reduce)."""
        return self.backward_ms / self.compute_ms if self.compute_ms > 0 else 0.0

    def problems(self) -> tuple[str, ...]:
        """Every inconsistency as "field: message"; empty when valid."""
        out: list[str] = []
        if self.batch < 1:
            out.append(f"batch: must be a positive integer, got {self.batch!r}")
        for name in ("forward_ms", "backward_ms", "optimizer_ms"):
            if getattr(self, name) < 0:
                out.append(f"{name}: must not be negative")
        for name in ("pre", "blocks", "post"):
            region: RegionTime = getattr(self, name)
            if region.tp_split_ms < 0 or region.replicated_ms < 0:
                out.append(f"{name}: times must not be negative")
        regions = self.pre.total_ms + self.blocks.total_ms + self.post.total_ms
        if not math.isclose(regions, self.compute_ms, rel_tol=1e-6, abs_tol=1e-9):
            out.append(f"regions: sum to {regions:.6g} ms, forward+backward is "
                       f"{self.compute_ms:.6g} ms")
        return tuple(out)


def with_step(split: SingleGpuSplit, *, batch: int, forward_ms: float, backward_ms: float,
              optimizer_ms: float) -> SingleGpuSplit:
    """`split` moved to another batch's step totals (e.g. `StepProfile.at(micro_batch)`), keeping
    its regions' shares: they hardly move with the batch, the totals do."""
    factor = (forward_ms + backward_ms) / split.compute_ms if split.compute_ms > 0 else 0.0
    return SingleGpuSplit(batch=batch, forward_ms=forward_ms, backward_ms=backward_ms,
                          optimizer_ms=optimizer_ms, gradient_bytes=split.gradient_bytes,
                          pre=split.pre.scaled(factor), blocks=split.blocks.scaled(factor),
                          post=split.post.scaled(factor))


@dataclass(frozen=True)
class ParallelStep:
    """One step under a layout, in ms; the components add up to `total_ms`."""

    layout: ParallelLayout
    micro_batch_size: int
    compute_ms: float  # m x the slowest stage's forward+backward per micro-batch
    recompute_ms: float  # m x the slowest stage's recomputed forward (activation checkpointing)
    tp_comm_ms: float  # m x the slowest stage's TP all-reduces (the recomputed forward's too)
    pp_bubble_ms: float  # pipeline fill and drain
    pp_p2p_ms: float  # m x the slowest stage's sends to its neighbours
    dp_allreduce_ms: float  # the part of the gradient all-reduce backward does not hide
    optimizer_ms: float  # the optimizer on this GPU's 1/(tp*pp) of the parameters
    total_ms: float
    bubble_fraction: float  # (pp-1)/(m+pp-1): the idle share of an even pipeline
    stage_ms: tuple[float, ...]  # per micro-batch, first stage first
    dp_allreduce_full_ms: float  # before overlap
    link: str  # the node's interconnect, e.g. "nvlink3"
    ep_alltoall_ms: float  # m x the slowest stage's expert all-to-alls (0 without EP)


# --- layouts -------------------------------------------------------------------------------


def _uneven(global_batch: int, layout: ParallelLayout) -> str:
    per = layout.dp * layout.micro_batches
    return (f"global batch {global_batch} does not split into dp={layout.dp} x "
            f"{layout.micro_batches} micro-batch(es) ({global_batch % per} sample(s) left over)")


def layout_problems(layout: ParallelLayout, *, gpu_count: int, gpus_per_node: int,
                    global_batch: int, dims: ModelDims | None = None) -> tuple[str, ...]:
    """Every reason `layout` cannot run, as "field: message"; empty when it can."""
    degrees = {"dp": layout.dp, "tp": layout.tp, "pp": layout.pp,
               "micro_batches": layout.micro_batches, "virtual_stages": layout.virtual_stages,
               "ep": layout.ep}
    bad = [f"layout.{k}: must be a positive integer, got {v!r}" for k, v in degrees.items()
           if isinstance(v, bool) or not isinstance(v, int) or v < 1]
    if bad:
        return tuple(bad)
    out: list[str] = []
    if layout.gpu_count != gpu_count:
        out.append(f"layout: dp x tp x pp = {layout.gpu_count}, the plan has {gpu_count} GPUs")
    if layout.tp > gpus_per_node or gpus_per_node % layout.tp:
        out.append(f"layout.tp: {layout.tp} GPUs cannot form TP groups inside nodes of "
                   f"{gpus_per_node} (TP's per-layer all-reduces need the node's link)")
    if global_batch % (layout.dp * layout.micro_batches):
        out.append(f"layout.micro_batches: {_uneven(global_batch, layout)}")
    if layout.dp % layout.ep:
        out.append(f"layout.ep: {layout.ep} does not divide dp={layout.dp}: expert-parallel "
                   "ranks are taken from the data-parallel group")
    out += _interleave_problems(layout)
    if dims is not None:
        out += _dims_problems(layout, dims)
    return tuple(out)


def _interleave_problems(layout: ParallelLayout) -> list[str]:
    """Megatron's interleaved schedule needs a pipeline and micro-batches in groups of pp."""
    if layout.virtual_stages == 1:
        return []
    if layout.pp == 1:
        return ["layout.virtual_stages: an interleaved schedule needs pp > 1"]
    if layout.micro_batches % layout.pp:
        return [f"layout.virtual_stages: the interleaved schedule runs micro-batches in groups "
                f"of pp={layout.pp}; {layout.micro_batches} is not a multiple"]
    return []


def _dims_problems(layout: ParallelLayout, dims: ModelDims) -> list[str]:
    out: list[str] = []
    if dims.hidden % layout.tp:
        out.append(f"layout.tp: {layout.tp} does not divide the hidden size {dims.hidden}")
    if dims.heads is not None and dims.heads % layout.tp:
        out.append(f"layout.tp: {layout.tp} does not divide the {dims.heads} attention heads")
    if layout.pp * layout.virtual_stages > dims.blocks:
        out.append(f"layout.pp: {layout.pp} x {layout.virtual_stages} model chunks for "
                   f"{dims.blocks} blocks")
    return out


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def layouts(gpu_count: int, gpus_per_node: int, global_batch: int, *, max_tp: int = 8,
            max_pp: int | None = None, dims: ModelDims | None = None
            ) -> Iterator[ParallelLayout]:
    """Every valid layout of `gpu_count` GPUs for `global_batch`: tp a divisor of the node up to
    `max_tp`, pp up to `max_pp` (and the block count when `dims` is given), and every
    micro-batch count that splits the batch evenly; dp ascending, then tp, pp, micro-batches."""
    for dp in _divisors(gpu_count):
        for tp in _divisors(gpu_count // dp):
            pp = gpu_count // (dp * tp)
            if tp > max_tp or (max_pp is not None and pp > max_pp):
                continue
            if global_batch % dp:
                continue
            for m in _divisors(global_batch // dp):
                layout = ParallelLayout(dp=dp, tp=tp, pp=pp, micro_batches=m)
                if not layout_problems(layout, gpu_count=gpu_count, gpus_per_node=gpus_per_node,
                                       global_batch=global_batch, dims=dims):
                    yield layout


# --- the formulas --------------------------------------------------------------------------


def activation_bytes(micro_batch: int, dims: ModelDims) -> int:
    """One micro_batch x sequence x hidden activation: what a TP all-reduce or a stage sends."""
    return micro_batch * dims.sequence * dims.hidden * dims.element_bytes


def tp_allreduce_ms(message_bytes: int, tp: int, *, gpus_per_node: int, device: DeviceSpec,
                    scaling: ScalingModel) -> float:
    """One ring all-reduce of `message_bytes` over the `tp` GPUs of a TP group (one node)."""
    return scaling.allreduce_ms(gradient_bytes=message_bytes, gpu_count=tp,
                                gpus_per_node=gpus_per_node,
                                intra_node_gbps=device.interconnect_gbps)


def p2p_ms(message_bytes: int, *, crosses_nodes: bool, device: DeviceSpec,
           scaling: ScalingModel) -> float:
    """One point-to-point send between neighbouring stages: the all-reduce's link, efficiency
    and hop latency, one hop."""
    if message_bytes <= 0:
        return 0.0
    link_gbps = device.interconnect_gbps
    if crosses_nodes:
        link_gbps = min(link_gbps, scaling.inter_node_gbps)
    seconds = message_bytes / (scaling.bandwidth_efficiency * link_gbps * 1e9)
    return (seconds + scaling.hop_latency_us * 1e-6) * 1000.0


def stage_blocks(blocks: int, pp: int) -> tuple[int, ...]:
    """Blocks per stage, as even as they go: the first `blocks % pp` stages take one more."""
    base, extra = divmod(blocks, pp)
    return tuple(base + (1 if i < extra else 0) for i in range(pp))


def bubble_fraction(pp: int, micro_batches: int, virtual_stages: int = 1) -> float:
    """The idle share of an even pipeline: (pp-1)/(m+pp-1) for 1F1B, the bubble 1/v of
    that for v interleaved chunks: ((pp-1)/v) / (m + (pp-1)/v)."""
    bubble = (pp - 1) / virtual_stages
    return bubble / (micro_batches + bubble)


def pipeline_ms(stage_ms: tuple[float, ...], micro_batches: int, virtual_stages: int = 1
                ) -> float:
    """1F1B step time of stages taking `stage_ms` per micro-batch: one micro-batch through all
    of them, then the slowest stage for each of the others. Interleaved over `virtual_stages`
    chunks per rank, fill and drain pass chunks 1/v the size (Narayanan et al. SC'21 §2.2.2:
    the bubble shrinks by v)."""
    if virtual_stages == 1:
        return sum(stage_ms) + (micro_batches - 1) * max(stage_ms)
    slowest = max(stage_ms)
    return micro_batches * slowest + (sum(stage_ms) - slowest) / virtual_stages


def dp_shard_gradient_bytes(gradient_bytes: int, layout: ParallelLayout) -> int:
    """Gradient bytes one GPU all-reduces over dp: its (tp, pp) shard of the parameters."""
    return math.ceil(gradient_bytes / (layout.tp * layout.pp))


def rank_of(layout: ParallelLayout, *, tp_rank: int, dp_rank: int, pp_rank: int,
            order: str) -> int:
    """The global rank (GPU index, nodes filled in order) of one member of the layout."""
    if order == "tp-dp-pp":
        return tp_rank + layout.tp * (dp_rank + layout.dp * pp_rank)
    if order == "tp-pp-dp":
        return tp_rank + layout.tp * (pp_rank + layout.pp * dp_rank)
    raise InvalidRequestError("rank_order", f"must be one of {', '.join(RANK_ORDERS)}, "
                              f"got {order!r}")


def dp_members_per_node(layout: ParallelLayout, gpus_per_node: int, order: str,
                        dp_ranks: range | None = None) -> int:
    """How many members of one DP group (or of the group of `dp_ranks` in it: an EP group,
    an expert-data-parallel group) share a node (what decides whether it crosses nodes)."""
    ranks = [rank_of(layout, tp_rank=0, dp_rank=d, pp_rank=0, order=order)
             for d in (dp_ranks if dp_ranks is not None else range(layout.dp))]
    per_node: dict[int, int] = {}
    for r in ranks:
        per_node[r // gpus_per_node] = per_node.get(r // gpus_per_node, 0) + 1
    return min(per_node.values())


def boundary_crosses_nodes(layout: ParallelLayout, boundary: int, gpus_per_node: int,
                           order: str) -> bool:
    """Whether any sender and receiver across stage boundary `boundary` (between stages
    `boundary` and `boundary + 1`) sit on different nodes."""
    for t in range(layout.tp):
        for d in range(layout.dp):
            a = rank_of(layout, tp_rank=t, dp_rank=d, pp_rank=boundary, order=order)
            b = rank_of(layout, tp_rank=t, dp_rank=d, pp_rank=boundary + 1, order=order)
            if a // gpus_per_node != b // gpus_per_node:
                return True
    return False


# --- the whole step ------------------------------------------------------------------------


@dataclass(frozen=True)
class _Stage:
    compute_ms: float
    tp_comm_ms: float
    p2p_ms: float
    alltoall_ms: float
    recompute_ms: float  # the checkpointed forward run again inside backward

    @property
    def total_ms(self) -> float:
        return (self.compute_ms + self.recompute_ms + self.tp_comm_ms + self.p2p_ms
                + self.alltoall_ms)


def ep_groups(layout: ParallelLayout) -> tuple[range, range]:
    """The dp ranks of one EP group (consecutive: Megatron-core's "tp-cp-ep-dp-pp") and of one
    expert-data-parallel group (those holding the same experts, ep apart)."""
    return range(layout.ep), range(0, layout.dp, layout.ep)


def alltoall_per_micro_batch_ms(layout: ParallelLayout, experts: ExpertDims | None,
                                micro_batch: int, *, element_bytes: int, device: DeviceSpec,
                                scaling: ScalingModel, gpus_per_node: int, order: str) -> float:
    """The expert all-to-alls of every MoE layer for one micro-batch; 0 without EP."""
    if experts is None or layout.ep == 1:
        return 0.0
    message = experts.dispatch_bytes(micro_batch, element_bytes)
    one = moe.alltoall_ms(message, ep=layout.ep, intra_node_gbps=device.interconnect_gbps,
                          members_per_node=dp_members_per_node(
                              layout, gpus_per_node, order, ep_groups(layout)[0]),
                          scaling=scaling)
    return moe.ALLTOALLS_PER_MOE_LAYER * one * experts.moe_layers


def _stages(layout: ParallelLayout, split: SingleGpuSplit, dims: ModelDims, device: DeviceSpec,
            scaling: ScalingModel, gpus_per_node: int, order: str,
            recompute_fraction: float, experts: ExpertDims | None) -> list[_Stage]:
    message = activation_bytes(split.batch, dims)
    allreduce = tp_allreduce_ms(message, layout.tp, gpus_per_node=gpus_per_node, device=device,
                                scaling=scaling)
    # Narayanan et al. SC'21 §4.1: each TP rank sends its 1/tp of the boundary activation and the
    # receivers all-gather it over the node's link.
    sends = [p2p_ms(message // layout.tp, device=device, scaling=scaling,
                    crosses_nodes=boundary_crosses_nodes(layout, b, gpus_per_node, order))
             for b in range(layout.pp - 1)]
    per_block = split.blocks.per_gpu_ms(layout.tp) / dims.blocks
    forward_share = split.forward_ms / split.compute_ms if split.compute_ms > 0 else 0.0
    # Averaged over the blocks: a stage runs its share of the MoE layers.
    alltoall = alltoall_per_micro_batch_ms(
        layout, experts, split.batch, element_bytes=dims.element_bytes, device=device,
        scaling=scaling, gpus_per_node=gpus_per_node, order=order) / dims.blocks
    last = layout.pp - 1
    stages = []
    for i, n in enumerate(stage_blocks(dims.blocks, layout.pp)):
        compute = n * per_block
        reduces: float = n * TP_ALLREDUCES_PER_BLOCK
        if i == 0:
            compute += split.pre.per_gpu_ms(layout.tp)
            reduces += TP_ALLREDUCES_FIRST_STAGE
        if i == last:
            compute += split.post.per_gpu_ms(layout.tp)
            reduces += TP_ALLREDUCES_LAST_STAGE
        # A stage sends its output forward and its input gradient backward.
        p2p = (sends[i] if i < last else 0.0) + (sends[i - 1] if i > 0 else 0.0)
        # Interleaved: each micro-batch crosses every rank's boundaries once per chunk (§2.2.2).
        p2p *= layout.virtual_stages
        # Checkpointing recomputes the stage's forward in every micro-batch's backward, with the
        # blocks' forward all-reduces and (MoE) the forward's two of the four all-to-alls:
        # stage work, so in the pipeline's fill and drain too.
        recompute = recompute_fraction * compute * forward_share
        reduces += recompute_fraction * n * TP_FORWARD_ALLREDUCES_PER_BLOCK
        stages.append(_Stage(compute_ms=compute,
                             tp_comm_ms=reduces * allreduce if layout.tp > 1 else 0.0,
                             p2p_ms=p2p, alltoall_ms=n * alltoall * (1 + recompute_fraction / 2),
                             recompute_ms=recompute))
    return stages


def step_time(layout: ParallelLayout, single_gpu_split: SingleGpuSplit, model_dims: ModelDims,
              device: DeviceSpec, scaling: ScalingModel, *, gpus_per_node: int,
              rank_order: str = DEFAULT_RANK_ORDER, recompute_fraction: float = 0.0,
              experts: ExpertDims | None = None) -> ParallelStep:
    """One training step of `layout` on `device` GPUs, each component in ms.

    `single_gpu_split` is the whole model's step on one GPU at the micro-batch size
    (global batch / (dp x micro-batches)); the global batch is taken to be
    dp x its batch x micro-batches. `recompute_fraction` of each stage's forward is run again
    in its backward (activation checkpointing: 1 full, a fraction per-block), inside the
    pipeline. `InvalidRequestError` lists every problem of the layout.
    """
    split = single_gpu_split
    global_batch = layout.dp * split.batch * layout.micro_batches
    problems = (*split.problems(),
                *layout_problems(layout, gpu_count=layout.gpu_count, gpus_per_node=gpus_per_node,
                                 global_batch=global_batch, dims=model_dims))
    if rank_order not in RANK_ORDERS:
        problems = (*problems, f"rank_order: must be one of {', '.join(RANK_ORDERS)}")
    problems = (*problems, *(f"layout.{f}: {m}" for f, m in moe.ep_problems(layout.ep, experts)))
    if problems:
        raise InvalidRequestError("layout", f"{layout.describe()} cannot run: "
                                  f"{'; '.join(problems)}", details=problems)
    stages = _stages(layout, split, model_dims, device, scaling, gpus_per_node, rank_order,
                     recompute_fraction, experts)
    stage_ms = tuple(s.total_ms for s in stages)
    m = layout.micro_batches
    slowest = stages[max(range(len(stages)), key=lambda i: stage_ms[i])]
    pipeline = pipeline_ms(stage_ms, m, layout.virtual_stages)
    full = _gradient_allreduce_ms(layout, split.gradient_bytes, experts, device=device,
                                  scaling=scaling, gpus_per_node=gpus_per_node,
                                  order=rank_order)
    # Gradients are reduced once per step, after the last micro-batch: only its backward on
    # the slowest stage can hide the all-reduce.
    exposed = scaling.step_time_ms(compute_ms=0.0, optimizer_ms=0.0, allreduce_ms=full,
                                   backward_ms=slowest.compute_ms * split.backward_fraction)
    optimizer = split.optimizer_ms / (layout.tp * layout.pp)  # EP's share: `setups.timed`
    return ParallelStep(
        layout=layout, micro_batch_size=split.batch,
        compute_ms=m * slowest.compute_ms, recompute_ms=m * slowest.recompute_ms,
        tp_comm_ms=m * slowest.tp_comm_ms,
        pp_bubble_ms=pipeline - m * slowest.total_ms, pp_p2p_ms=m * slowest.p2p_ms,
        dp_allreduce_ms=exposed, optimizer_ms=optimizer, total_ms=pipeline + exposed + optimizer,
        bubble_fraction=bubble_fraction(layout.pp, m, layout.virtual_stages), stage_ms=stage_ms,
        dp_allreduce_full_ms=full, link=device.interconnect,
        ep_alltoall_ms=m * slowest.alltoall_ms,
    )


def _gradient_allreduce_ms(layout: ParallelLayout, gradient_bytes: int,
                           experts: ExpertDims | None, *, device: DeviceSpec,
                           scaling: ScalingModel, gpus_per_node: int, order: str) -> float:
    """The data-parallel all-reduce of one GPU's gradient shard; under EP the dense part over
    dp and the experts' (1/ep of them on this rank) over the dp/ep ranks that hold the same."""
    def over(payload: int, ranks: range) -> float:
        return scaling.allreduce_ms(
            gradient_bytes=payload, gpu_count=len(ranks), intra_node_gbps=device.interconnect_gbps,
            gpus_per_node=dp_members_per_node(layout, gpus_per_node, order, ranks))

    shard = dp_shard_gradient_bytes(gradient_bytes, layout)
    if experts is None or layout.ep == 1:
        return over(shard, range(layout.dp))
    expert = round(shard * experts.expert_fraction)
    return (over(shard - expert, range(layout.dp))
            + over(math.ceil(expert / layout.ep), ep_groups(layout)[1]))
