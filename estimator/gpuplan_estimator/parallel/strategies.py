"""Memory-saving strategies of a training step, as plain data (issue #19).

A `MemoryStrategy` names what a training job does to fit a GPU: ZeRO stage 1-3 (Rajbhandari et
al., SC'20) or PyTorch FSDP (full or hybrid sharding), activation checkpointing (full or a
fraction of the blocks), gradient accumulation and optimizer-state offload (ZeRO-Offload, Ren
et al., USENIX ATC'21). Precision is not here: `TrainingSettings.precision` already says fp32,
tf32, or fp16/bf16 with fp32 master weights.

`parallel.sharding` prices a strategy in memory, `parallel.strategy_time` in time; this module only
describes, validates and enumerates strategies.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from gpuplan_estimator.core.errors import InvalidRequestError

ZERO_STAGES = (0, 1, 2, 3)
FSDP_MODES = ("none", "full", "hybrid")
CHECKPOINTING_MODES = ("none", "full", "per-block")
# Fractions of blocks tried by `candidate_strategies` before full checkpointing: half the
# blocks recompute half the extra forward (Korthikanti et al. 2022 §4 call checkpointing only
# some layers the "block" method; Megatron's --recompute-method block --recompute-num-layers).
PER_BLOCK_FRACTIONS = (0.5,)


@dataclass(frozen=True, kw_only=True)
class MemoryStrategy:
    """What a job does to save GPU memory; validated by `validate()`, never corrected."""

    zero_stage: int = 0
    """0: plain data parallel; 1 shards optimizer state (and fp32 master weights), 2 also
    gradients, 3 also parameters, over the data-parallel group."""
    fsdp: str = "none"
    """PyTorch FSDP: "full" shards like ZeRO-3 over the data-parallel group, "hybrid" shards
    within a node and replicates across nodes. Exclusive with `zero_stage` > 0."""
    checkpointing: str = "none"
    """Activation checkpointing: "none", "full" (every block) or "per-block" (a fraction)."""
    checkpoint_fraction: float | None = None
    """Per-block only: the fraction of blocks checkpointed, in (0, 1]; None otherwise."""
    gradient_accumulation: int = 1
    """Micro-steps per optimizer step: micro-batch = per-GPU batch / this (must divide)."""
    offload_optimizer: bool = False
    """Optimizer state (and fp32 master weights) live in host memory and the optimizer step
    runs on the CPU (ZeRO-Offload); needs `zero_stage` >= 1 or FSDP."""

    def validate(self) -> tuple[str, ...]:
        """Every problem as "field: message"; empty when valid."""
        errors: list[str] = []
        if not _is_int(self.zero_stage) or self.zero_stage not in ZERO_STAGES:
            errors.append(f"zero_stage: must be one of 0, 1, 2, 3, got {self.zero_stage!r}")
        if self.fsdp not in FSDP_MODES:
            errors.append(f"fsdp: must be one of {', '.join(FSDP_MODES)}, got {self.fsdp!r}")
        elif self.fsdp != "none" and self.zero_stage != 0:
            errors.append(f"fsdp: {self.fsdp} already shards parameters, gradients and "
                          f"optimizer state (ZeRO-3); set zero_stage 0, got {self.zero_stage!r}")
        errors.extend(self._checkpointing_errors())
        if not _is_int(self.gradient_accumulation) or self.gradient_accumulation < 1:
            errors.append("gradient_accumulation: must be a positive integer, got "
                          f"{self.gradient_accumulation!r}")
        if not isinstance(self.offload_optimizer, bool):
            errors.append(f"offload_optimizer: must be true or false, got "
                          f"{self.offload_optimizer!r}")
        elif self.offload_optimizer and self.zero_stage == 0 and self.fsdp == "none":
            # DeepSpeed's offload_optimizer is a ZeRO option; FSDP has CPUOffload.
            errors.append("offload_optimizer: needs zero_stage >= 1 or fsdp")
        return tuple(errors)

    def _checkpointing_errors(self) -> list[str]:
        if self.checkpointing not in CHECKPOINTING_MODES:
            return [f"checkpointing: must be one of {', '.join(CHECKPOINTING_MODES)}, "
                    f"got {self.checkpointing!r}"]
        fraction = self.checkpoint_fraction
        if self.checkpointing != "per-block":
            if fraction is not None:
                return [f"checkpoint_fraction: only for per-block checkpointing, got "
                        f"{fraction!r} with {self.checkpointing}"]
            return []
        if isinstance(fraction, bool) or not isinstance(fraction, int | float):
            return [f"checkpoint_fraction: per-block checkpointing needs a fraction in (0, 1],"
                    f" got {fraction!r}"]
        if not 0.0 < fraction <= 1.0:
            return [f"checkpoint_fraction: must be in (0, 1], got {fraction!r}"]
        return []

    def check(self) -> None:
        """Raise `InvalidRequestError` naming the first bad field (all are in the details)."""
        errors = self.validate()
        if errors:
            field_name = errors[0].split(":", 1)[0]
            raise InvalidRequestError(field_name, "; ".join(e.split(": ", 1)[1] for e in errors),
                                      details=errors)

    @property
    def shards_parameters(self) -> bool:
        """ZeRO-3 or FSDP: parameters are gathered before each use."""
        return self.zero_stage == 3 or self.fsdp != "none"

    @property
    def shards_gradients(self) -> bool:
        """ZeRO-2/3 or FSDP: each rank keeps only its shard of the gradients."""
        return self.zero_stage >= 2 or self.fsdp != "none"

    @property
    def shards_optimizer_state(self) -> bool:
        """Any ZeRO stage or FSDP: each rank keeps only its shard of the optimizer state."""
        return self.zero_stage >= 1 or self.fsdp != "none"

    @property
    def checkpointed_fraction(self) -> float:
        """Fraction of blocks whose activations are recomputed in backward (0 to 1)."""
        if self.checkpointing == "full":
            return 1.0
        if self.checkpointing == "per-block" and self.checkpoint_fraction is not None:
            return float(self.checkpoint_fraction)
        return 0.0

    @property
    def label(self) -> str:
        """A short human name, e.g. "zero-2 + accumulate x4 + checkpoint full"."""
        parts = []
        if self.zero_stage:
            parts.append(f"zero-{self.zero_stage}")
        if self.fsdp != "none":
            parts.append(f"fsdp {self.fsdp}")
        if self.gradient_accumulation > 1:
            parts.append(f"accumulate x{self.gradient_accumulation}")
        if self.checkpointing == "full":
            parts.append("checkpoint full")
        elif self.checkpointing == "per-block":
            parts.append(f"checkpoint {self.checkpointed_fraction:.0%} of blocks")
        if self.offload_optimizer:
            parts.append("offload optimizer")
        return " + ".join(parts) or "none"


NO_STRATEGY = MemoryStrategy()


def shard_group_size(strategy: MemoryStrategy, *, data_parallel: int, gpus_per_node: int,
                     tensor_parallel: int = 1) -> int:
    """Ranks one sharded copy of the model state is spread over (1 when nothing is sharded).

    ZeRO and full FSDP shard over the whole data-parallel group. Hybrid FSDP shards over the
    data-parallel ranks of one node (`gpus_per_node // tensor_parallel`: tensor parallelism
    takes its ranks within a node first) and replicates across nodes.
    """
    _check_positive(data_parallel=data_parallel, gpus_per_node=gpus_per_node,
                    tensor_parallel=tensor_parallel)
    if not strategy.shards_optimizer_state:
        return 1
    if strategy.fsdp == "hybrid":
        return min(data_parallel, max(1, gpus_per_node // tensor_parallel))
    return data_parallel


def micro_batch_size(per_gpu_batch: int, strategy: MemoryStrategy) -> int:
    """Samples per micro-step: the per-GPU batch over the accumulation steps (must divide)."""
    _check_positive(per_gpu_batch=per_gpu_batch)
    steps = strategy.gradient_accumulation
    if per_gpu_batch % steps:
        raise InvalidRequestError(
            "gradient_accumulation",
            f"{steps} micro-steps do not divide the per-GPU batch {per_gpu_batch}")
    return per_gpu_batch // steps


def candidate_strategies(*, per_gpu_batch: int, data_parallel: int, gpus_per_node: int,
                         max_accumulation: int = 64) -> tuple[MemoryStrategy, ...]:
    """Sensible strategies, cheapest in time first, for the planner to take the first that fits.

    The order (none → ZeRO-1 → ZeRO-2 → accumulation 2, 4, 8, … → checkpointing → ZeRO-3/FSDP
    → offload) follows what each costs: ZeRO-1/2 move the same bytes as an all-reduce; smaller
    micro-batches run the GPU less efficiently; checkpointing adds a forward; ZeRO-3 adds 50 %
    more communication; offload adds PCIe traffic and a CPU optimizer step. Later entries keep
    the earlier savings (ZeRO-2 under accumulation, say). Sharding is listed only when there
    is more than one data-parallel rank to shard over (offload then uses ZeRO-2 alone, as
    ZeRO-Offload does on one GPU). Accumulation steps are powers of two that divide the batch.
    """
    _check_positive(per_gpu_batch=per_gpu_batch, data_parallel=data_parallel,
                    gpus_per_node=gpus_per_node, max_accumulation=max_accumulation)
    sharded = data_parallel > 1
    base = MemoryStrategy(zero_stage=2) if sharded else NO_STRATEGY
    steps = [s for s in _powers_of_two(max_accumulation) if s > 1 and per_gpu_batch % s == 0]
    out: list[MemoryStrategy] = [NO_STRATEGY]
    if sharded:
        out += [MemoryStrategy(zero_stage=1), base]
    out += [_with(base, gradient_accumulation=s) for s in steps]
    checkpointed = [_with(base, checkpointing="per-block", checkpoint_fraction=f)
                    for f in PER_BLOCK_FRACTIONS]
    checkpointed.append(_with(base, checkpointing="full"))
    out += checkpointed
    full = checkpointed[-1]
    out += [_with(full, gradient_accumulation=s) for s in steps]
    if sharded:
        # Hybrid keeps the parameter all-gathers inside a node, so it comes before full FSDP.
        shardings = ([MemoryStrategy(fsdp="hybrid")] if data_parallel > gpus_per_node else [])
        shardings += [MemoryStrategy(fsdp="full"), MemoryStrategy(zero_stage=3)]
        out += shardings
        out += [_with(s, checkpointing="full") for s in shardings]
        deepest = _with(MemoryStrategy(zero_stage=3), checkpointing="full")
    else:
        deepest = full
    offloaded = _with(deepest if sharded else MemoryStrategy(zero_stage=2, checkpointing="full"),
                      offload_optimizer=True)
    out.append(offloaded)
    out += [_with(offloaded, gradient_accumulation=s) for s in steps]
    return tuple(dict.fromkeys(out))  # drop repeats, keep order


def _with(strategy: MemoryStrategy, **changes: Any) -> MemoryStrategy:
    made = replace(strategy, **changes)
    made.check()
    return made


def _powers_of_two(limit: int) -> list[int]:
    out, n = [], 1
    while n <= limit:
        out.append(n)
        n *= 2
    return out


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _check_positive(**values: int) -> None:
    for name, value in values.items():
        if not _is_int(value) or value < 1:
            raise InvalidRequestError(name, f"must be a positive integer, got {value!r}")
