"""What a memory-saving strategy costs in time: plain additions the planner applies (#19).

Compute time is given (forward, backward, optimizer of one micro-step on one GPU); this module
says how many micro-steps run, what recomputation adds, what the optimizer step becomes, and
which collectives move how many bytes. It does not price communication: the planner does,
with its interconnect model (`parallel.scaling`), from the `Collective`s returned here.

- Gradient accumulation: `steps` micro-steps of forward+backward per optimizer step; plain
  data parallelism and ZeRO-1 reduce gradients once per optimizer step (DDP `no_sync`);
  ZeRO-2/3 and FSDP reduce-scatter every micro-step, as they keep no full gradient buffer.
- Checkpointing: full recomputes the forward once more in backward; per-block a fraction f
  of it (Chen et al. 2016; Korthikanti et al. 2022 §4).
- ZeRO-1/2: reduce-scatter of gradients plus all-gather of updated parameters, the volume of
  one all-reduce (Rajbhandari et al. SC'20 §7.2). ZeRO-3/FSDP: an all-gather of parameters in
  forward, another in backward, a reduce-scatter of gradients: 1.5x an all-reduce (§7.2.2).
  Hybrid FSDP does those within a node and all-reduces the gradient shard across nodes.
- The sharded optimizer step updates 1/shard of the parameters.
- Offload (ZeRO-Offload, Ren et al. ATC'21 §4.1): the optimizer runs on the CPU, so gradients
  go down PCIe and updated parameters come up (at their widths) once per optimizer step; the
  optimizer state itself never crosses. CPU optimizer time = bytes it reads and writes / host
  memory bandwidth (the CPU Adam step is memory-bound, Ren et al. §4.2).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from gpuplan_estimator.core.errors import InvalidRequestError
from gpuplan_estimator.parallel import strategies
from gpuplan_estimator.parallel.strategies import MemoryStrategy
from gpuplan_estimator.step.decomposition import OPTIMIZER_PASSES, TrainingSettings

COLLECTIVE_KINDS = ("all-reduce", "reduce-scatter", "all-gather")
FP32_BYTES = 4


@dataclass(frozen=True)
class HostLink:
    """The host side of offload; constants, documented where they come from."""

    pcie_gbps: float = 25.0
    """GB/s each way, PCIe 4.0 x16: 32 GB/s raw, ~25 GB/s for pinned copies (cudaMemcpy
    bandwidthTest figures on A100 hosts). PCIe 5.0 hosts double it."""
    memory_bandwidth_gbps: float = 100.0
    """GB/s the CPU optimizer streams: about half of an 8-channel DDR4-3200 socket's 204.8 GB/s
    peak, what STREAM triad reaches with all cores."""


DEFAULT_HOST = HostLink()


@dataclass(frozen=True)
class StepSplit:
    """Time of one micro-step on one GPU without any strategy, in ms."""

    forward_ms: float
    backward_ms: float
    optimizer_ms: float


@dataclass(frozen=True)
class Collective:
    """A collective the strategy runs: `payload_bytes` is the whole tensor the group exchanges
    (an all-reduce of the gradients has payload = gradient bytes), run `count` times per step."""

    kind: str  # one of COLLECTIVE_KINDS
    payload_bytes: int
    group_size: int
    count: int
    what: str  # "gradients" or "parameters" ("expert ..." under expert parallelism)
    stride: int = 1  # ranks between members: the expert-data-parallel group's is ep


@dataclass(frozen=True)
class StrategyTime:
    """One optimizer step under a strategy: compute parts in ms, communication as bytes."""

    micro_steps: int
    forward_ms: float
    recompute_ms: float
    backward_ms: float
    optimizer_ms: float
    """On the GPU (0 when offloaded)."""
    host_optimizer_ms: float
    pcie_bytes: int
    """Both directions together."""
    pcie_ms: float
    collectives: tuple[Collective, ...]

    @property
    def compute_ms(self) -> float:
        """Every part but the collectives; PCIe copies are taken as not overlapped."""
        return (self.forward_ms + self.recompute_ms + self.backward_ms + self.optimizer_ms
                + self.host_optimizer_ms + self.pcie_ms)


def time_overheads(
    split: StepSplit,
    strategy: MemoryStrategy,
    *,
    settings: TrainingSettings,
    parameter_count: int,
    data_parallel: int,
    gpus_per_node: int,
    tensor_parallel: int = 1,
    pipeline_parallel: int = 1,
    host: HostLink = DEFAULT_HOST,
    expert_parallel: int = 1,
    expert_fraction: float = 0.0,
) -> StrategyTime:
    """Compute time and collectives of one optimizer step of `strategy`.

    `split` is one micro-step at the micro-batch; `parameter_count` the whole model's, of
    which each GPU holds 1/(tp·pp). Collectives are over the data-parallel group only; under
    `expert_parallel` ranks the experts' (`expert_fraction` of the parameters) over the
    dp/ep ranks holding the same experts (`parallel.experts`).
    """
    strategy.check()
    settings.check()
    for name, value in (("forward_ms", split.forward_ms), ("backward_ms", split.backward_ms),
                        ("optimizer_ms", split.optimizer_ms)):
        if not value >= 0.0:
            raise InvalidRequestError(name, f"must be >= 0, got {value!r}")
    if isinstance(parameter_count, bool) or not isinstance(parameter_count, int) \
            or parameter_count < 0:
        raise InvalidRequestError("parameter_count",
                                  f"must be a non-negative integer, got {parameter_count!r}")
    shard = strategies.shard_group_size(strategy, data_parallel=data_parallel,
                                        gpus_per_node=gpus_per_node,
                                        tensor_parallel=tensor_parallel)
    steps = strategy.gradient_accumulation
    local = math.ceil(parameter_count / (tensor_parallel * pipeline_parallel))
    width = settings.activation_bytes
    grad_width = width if settings.mixed_precision else FP32_BYTES
    pcie_bytes, host_ms, gpu_optimizer_ms = 0, 0.0, split.optimizer_ms / shard
    if expert_parallel > 1 and shard == 1:  # sharded, the experts' state is 1/dp either way
        gpu_optimizer_ms *= 1.0 - expert_fraction + expert_fraction / expert_parallel
    if strategy.offload_optimizer:
        shard_params = math.ceil(local / shard)
        pcie_bytes = shard_params * (grad_width + width)
        host_ms = _host_optimizer_ms(shard_params, settings, host)
        gpu_optimizer_ms = 0.0
    return StrategyTime(
        micro_steps=steps,
        forward_ms=steps * split.forward_ms,
        recompute_ms=steps * strategy.checkpointed_fraction * split.forward_ms,
        backward_ms=steps * split.backward_ms,
        optimizer_ms=gpu_optimizer_ms,
        host_optimizer_ms=host_ms,
        pcie_bytes=pcie_bytes,
        pcie_ms=pcie_bytes / (host.pcie_gbps * 1e9) * 1e3,
        collectives=_expert_split_collectives(
            strategy, gradient_bytes=local * grad_width, parameter_bytes=local * width,
            data_parallel=data_parallel, shard=shard, ep=expert_parallel,
            expert_fraction=expert_fraction),
    )


def _expert_split_collectives(strategy: MemoryStrategy, *, gradient_bytes: int,
                              parameter_bytes: int, data_parallel: int, shard: int, ep: int,
                              expert_fraction: float) -> tuple[Collective, ...]:
    """`collectives` of the whole shard, or under EP of its dense part over dp and of the
    rank's experts (1/ep of theirs) over the dp/ep expert-data-parallel ranks."""
    if ep == 1:
        return collectives(strategy, gradient_bytes=gradient_bytes,
                           parameter_bytes=parameter_bytes, data_parallel=data_parallel,
                           shard=shard)
    dense = collectives(strategy, gradient_bytes=round(gradient_bytes * (1 - expert_fraction)),
                        parameter_bytes=round(parameter_bytes * (1 - expert_fraction)),
                        data_parallel=data_parallel, shard=shard)
    expert = collectives(strategy,
                         gradient_bytes=math.ceil(gradient_bytes * expert_fraction / ep),
                         parameter_bytes=math.ceil(parameter_bytes * expert_fraction / ep),
                         data_parallel=data_parallel // ep, shard=max(1, shard // ep))
    return dense + tuple(replace(c, what=f"expert {c.what}", stride=ep) for c in expert)


def collectives(strategy: MemoryStrategy, *, gradient_bytes: int, parameter_bytes: int,
                data_parallel: int, shard: int) -> tuple[Collective, ...]:
    """The data-parallel collectives of one optimizer step (none on one replica)."""
    if data_parallel == 1:
        return ()
    steps = strategy.gradient_accumulation
    if not strategy.shards_optimizer_state:
        return (Collective("all-reduce", gradient_bytes, data_parallel, 1, "gradients"),)
    if not strategy.shards_parameters:
        # ZeRO-2 reduces every micro-step into the shard; ZeRO-1 accumulates full gradients.
        reduces = steps if strategy.shards_gradients else 1
        return (Collective("reduce-scatter", gradient_bytes, shard, reduces, "gradients"),
                Collective("all-gather", parameter_bytes, shard, 1, "parameters"))
    out = [Collective("all-gather", parameter_bytes, shard, 2 * steps, "parameters"),
           Collective("reduce-scatter", gradient_bytes, shard, steps, "gradients")]
    replicas = data_parallel // shard
    if replicas > 1:  # hybrid: the shards are averaged across nodes
        out.append(Collective("all-reduce", math.ceil(gradient_bytes / shard), replicas, steps,
                              "gradients"))
    return tuple(out)


def _host_optimizer_ms(parameters: int, settings: TrainingSettings, host: HostLink) -> float:
    """A memory-bound CPU optimizer step: fp32 reads+writes of OPTIMIZER_PASSES per element."""
    touched = sum(reads + writes for _, reads, writes, _ in OPTIMIZER_PASSES[settings.optimizer])
    return parameters * touched * FP32_BYTES / (host.memory_bandwidth_gbps * 1e9) * 1e3
