"""The device-independent facts a plan searches with, read once from the graph: its memory
under every strategy and layout, its parameter count and its transformer widths."""

from __future__ import annotations

import functools

from gpuplan_estimator.core.errors import InvalidRequestError
from gpuplan_estimator.core.layers import ModelGraph
from gpuplan_estimator.parallel import block_activations, sharding
from gpuplan_estimator.parallel import experts as moe
from gpuplan_estimator.parallel.layouts import ModelDims, ParallelLayout
from gpuplan_estimator.parallel.setups import MemoryFn, ModelFacts
from gpuplan_estimator.parallel.strategies import NO_STRATEGY, MemoryStrategy
from gpuplan_estimator.planning import parallel_inputs, rollup
from gpuplan_estimator.step import memory
from gpuplan_estimator.step.decomposition import TrainingSettings


def model_facts(graph: ModelGraph, settings: TrainingSettings) -> ModelFacts:
    """Facts of `graph`, built at the global batch `settings.batch_size`."""
    experts = moe.expert_dims(graph)
    return ModelFacts(settings=settings, parameter_count=graph.parameter_count,
                      dims=_dims(graph, settings), memory=memory_fn(graph, settings, experts),
                      experts=experts)


def _dims(graph: ModelGraph, settings: TrainingSettings) -> ModelDims | None:
    """Transformer widths when the graph shows blocks and a bound sequence, else None (then
    only data parallelism is planned)."""
    try:
        return parallel_inputs.model_dims_from_graph(graph, precision=settings.precision)
    except InvalidRequestError:
        return None


def memory_fn(graph: ModelGraph, settings: TrainingSettings,
              experts: moe.ExpertDims | None) -> MemoryFn:
    """Per-GPU memory of `graph` at a micro-batch under a strategy and layout; the breakdowns
    are computed once per micro-batch (a plan asks for the same few many times)."""

    @functools.lru_cache(maxsize=256)
    def breakdown(micro: int) -> memory.MemoryBreakdown:
        # The graph is at the global batch B, and every micro-batch divides it: B / micro
        # "replicas" give exactly `micro` samples each.
        return memory.training_memory(graph, settings,
                                      data_parallel=settings.batch_size // micro)

    @functools.lru_cache(maxsize=1)
    def activations() -> block_activations.ActivationLayout:
        return block_activations.activation_layout(graph, settings, block_of=rollup.block_of,
                                                   outside_label=rollup.OUTSIDE_BLOCKS)

    def per_gpu(micro: int, strategy: MemoryStrategy, layout: ParallelLayout,
                gpus_per_node: int) -> sharding.ShardedMemory:
        b = breakdown(micro)
        if not settings.training:
            return _unsharded(b)
        return sharding.memory_under(
            b, strategy, settings=settings, data_parallel=layout.dp,
            gpus_per_node=gpus_per_node, tensor_parallel=layout.tp,
            pipeline_parallel=layout.pp,
            in_flight_micro_batches=min(layout.pp, layout.micro_batches),
            layout=activations().at_batch(micro),
            experts=expert_share(experts, layout.ep, micro, settings))

    return per_gpu


def expert_share(experts: moe.ExpertDims | None, ep: int, micro: int,
                 settings: TrainingSettings) -> sharding.ExpertShare:
    """Where the experts' states sit on a rank of `ep` expert-parallel ranks at `micro`."""
    if experts is None:
        return sharding.NO_EXPERTS
    buffers = 0 if ep == 1 else moe.DISPATCH_BUFFERS * experts.dispatch_bytes(
        micro, settings.activation_bytes)
    return sharding.ExpertShare(ep=ep, fraction=experts.expert_fraction,
                                dispatch_buffers_bytes=buffers)


def _unsharded(b: memory.MemoryBreakdown) -> sharding.ShardedMemory:
    """An inference step's memory as it is: strategies save training memory only."""
    return sharding.ShardedMemory(
        parameters_bytes=b.parameters_bytes, gradients_bytes=b.gradients_bytes,
        optimizer_state_bytes=b.optimizer_state_bytes, activations_bytes=b.activations_bytes,
        workspace_bytes=b.workspace_bytes, framework_overhead_bytes=b.framework_overhead_bytes,
        gathered_parameters_bytes=0, recompute_bytes=0, host_bytes=0, expert_states_bytes=0,
        dispatch_buffers_bytes=0, micro_batch=b.per_gpu_batch, strategy=NO_STRATEGY)
