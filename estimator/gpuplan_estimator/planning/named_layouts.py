"""A named parallel layout estimated per rank, through the planner's own path (issue #34).

The request's model is estimated into the same step profiles a plan of `layout.gpus` GPUs
builds (`planner.profiles_at`: the global batch, the smallest per-GPU batch and 1, calibrated),
its memory under the layout comes from the same `ModelFacts`, and the step is priced by
`setups.timed`, the function the plan's search ranks with. So a plan's chosen candidate,
estimated again by its layout, gets the same step time (tests/unit/estimator/planning/
test_named_layouts.py checks it exactly).

Throughput is the field's: tokens/s per GPU = global batch x sequence / step time / GPUs, and
MFU = model FLOPs / (step time x GPUs x the datasheet peak at the precision). Model FLOPs are
the graph's forward FLOPs x 3 (`estimates.model_flops_per_step`: backward ~ 2 x forward; the
optimizer and checkpointing's recomputation do not count, as in PaLM's MFU, Chowdhery et al.
2022, Appendix B).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from gpuplan_estimator import devices
from gpuplan_estimator.core.errors import InvalidRequestError
from gpuplan_estimator.cost import roofline
from gpuplan_estimator.graph.batching import SEQUENCE_DIM
from gpuplan_estimator.parallel import named, setups
from gpuplan_estimator.parallel.named import ResolvedLayout
from gpuplan_estimator.parallel.setups import Setup
from gpuplan_estimator.planning import estimates, model_facts, placement, planner, requests
from gpuplan_estimator.step import memory


@dataclass(frozen=True)
class LayoutEstimate:
    """One device's step under a named layout, per rank (the slowest pipeline stage's time, the
    first stage's memory, which holds the most micro-batches in flight)."""

    device: str
    resolved: ResolvedLayout
    setup: Setup  # what the planner's search would hold for this layout: memory, parts
    memory_available_bytes: int
    data_basis: str
    calibration_factor: float
    global_batch: int
    tokens_per_sample: int | None  # the bound sequence dim; None: not a sequence model
    model_flops_per_step: float
    peak_flops_per_s: float | None

    @property
    def step_time_ms(self) -> float:
        """The whole optimizer step."""
        return self.setup.step_ms

    @property
    def compute_ms(self) -> float:
        """Forward, backward, recomputation and the optimizer on the GPU (with the host
        waits the single-GPU estimate prices inside them)."""
        p = self.setup.parts_ms
        return p.get("compute", 0.0) + p.get("recompute", 0.0) + p.get("optimizer", 0.0)

    @property
    def pipeline_bubble_ms(self) -> float:
        """Pipeline fill and drain."""
        return self.setup.parts_ms.get("pp_bubble", 0.0)

    @property
    def host_ms(self) -> float:
        """Host work in the step's critical path: offload's PCIe copies."""
        return self.setup.parts_ms.get("offload_copies", 0.0)

    @property
    def exposed_comm_ms(self) -> Mapping[str, float]:
        """Communication compute does not hide, by collective."""
        return self.setup.exposed_comm_ms

    @property
    def fits(self) -> bool:
        """Whether a rank's memory fits what the device gives a process."""
        return self.setup.memory.total_bytes <= self.memory_available_bytes

    @property
    def gpus(self) -> int:
        """GPUs of the layout."""
        return self.resolved.layout.gpu_count

    @property
    def samples_per_s_per_gpu(self) -> float:
        """Global batch per second, over the GPUs."""
        return self.global_batch * 1000.0 / self.step_time_ms / self.gpus

    @property
    def tokens_per_s_per_gpu(self) -> float | None:
        """Samples/s per GPU x the sequence length; None without a sequence dim."""
        if self.tokens_per_sample is None:
            return None
        return self.samples_per_s_per_gpu * self.tokens_per_sample

    @property
    def mfu(self) -> float | None:
        """Model FLOPs utilisation (see the module docstring); None without a peak rate."""
        if not self.peak_flops_per_s:
            return None
        seconds = self.step_time_ms / 1000.0
        return self.model_flops_per_step / (seconds * self.gpus * self.peak_flops_per_s)


def estimate_layout(req: requests.EstimateRequest, ctx: planner.PlannerContext
                    ) -> tuple[LayoutEstimate, ...]:
    """The named layout `req.layout` on each requested device (all with the precision's math
    when none is named); `InvalidRequestError` naming `layout.<field>` when it cannot run."""
    named_layout = req.layout
    if named_layout is None:
        raise InvalidRequestError("layout", "an estimate by layout needs a layout")
    req = planner.with_graph(req, export_batch=1)  # as a plan builds it
    t = req.training
    specs = ([ctx.catalog.resolve(n) for n in req.devices] if req.devices
             else [d for d in ctx.catalog.devices if devices.supports_precision(d, t.precision)])
    settings = planner.training_settings(t, t.batch_size)
    g = planner.graph_at(req.model_onnx, t, t.batch_size)
    facts = model_facts.model_facts(g, settings)
    resolved = named.resolve(named_layout, global_batch=t.batch_size, dims=facts.dims,
                             training=settings.training, experts=facts.experts)
    profiles = planner.profiles_at(req.model_onnx, t, named_layout.gpus, specs, ctx,
                                   loaded={t.batch_size: g})
    flops = estimates.model_flops_per_step(g, settings)
    return tuple(_priced(resolved, profiles[s.key], s, facts, ctx, flops=flops,
                         tokens_per_sample=g.dim_bindings.get(SEQUENCE_DIM))
                 for s in specs)


def _priced(resolved: ResolvedLayout, profile: placement.StepProfile,
            spec: devices.DeviceSpec, facts: setups.ModelFacts, ctx: planner.PlannerContext,
            *, flops: float, tokens_per_sample: int | None) -> LayoutEstimate:
    setup = placement.pinned_setup(profile, resolved, spec, facts, ctx.scaling)
    return LayoutEstimate(
        device=spec.key, resolved=resolved, setup=setup,
        memory_available_bytes=memory.usable_memory_bytes(spec),
        data_basis=profile.data_basis, calibration_factor=profile.calibration.factor,
        global_batch=facts.settings.batch_size, tokens_per_sample=tokens_per_sample,
        model_flops_per_step=flops,
        peak_flops_per_s=_peak(spec, facts.settings.precision))


def _peak(spec: devices.DeviceSpec, precision: str) -> float | None:
    try:
        return roofline.peak_flops_per_s(spec, precision)
    except InvalidRequestError:
        return None

