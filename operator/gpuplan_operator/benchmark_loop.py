"""Periodic benchmark coverage: gather inputs, decide with `benchmarks`, export, create Jobs.

Runs as one background task of the operator (started by `handlers.startup`), not per object:
GPU types are a property of the whole cluster.
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime
import logging
from collections.abc import Callable

from gpuplan_operator import benchmarks, errors, estimator_client, inventory, kube, metrics
from gpuplan_operator import settings as operator_settings

LOG = logging.getLogger(__name__)
SECONDS_PER_DAY = 86400


@dataclasses.dataclass(frozen=True)
class LoopContext:
    """What the benchmark loop needs: cluster, settings, metrics, clock and GPU-type resolver."""

    kube: kube.Kube
    settings: operator_settings.Settings
    metrics: metrics.OperatorMetrics
    clock: Callable[[], datetime.datetime]
    resolve: benchmarks.Resolver
    outcomes: OutcomeLedger = dataclasses.field(default_factory=lambda: OutcomeLedger())
    """Which finished Jobs were counted (this process's counters only)."""


@dataclasses.dataclass
class OutcomeLedger:
    """Counts each finished benchmark Job once, by uid.

    The first pass only records the Jobs that had already finished: the previous operator
    process counted them (or they ended while none ran), and counting them again after a restart
    would read as new failures to anyone looking at the totals.
    """

    seen: set[str] = dataclasses.field(default_factory=set)
    baselined: bool = False

    def new(self, finished: list[benchmarks.FinishedJob]) -> list[benchmarks.FinishedJob]:
        """The Jobs of `finished` not seen before (none on the first call); remembers them."""
        fresh = [job for job in finished if job.uid not in self.seen]
        self.seen = {job.uid for job in finished}  # Jobs past their TTL are forgotten
        first, self.baselined = not self.baselined, True
        return [] if first else fresh


def job_options(s: operator_settings.Settings) -> benchmarks.JobOptions:
    """The benchmark Jobs' options from validated operator settings."""
    return benchmarks.JobOptions(
        image=s.benchmark_image, db_secret=s.benchmark_db_secret,
        budget_minutes=s.benchmark_budget_minutes, backend=s.benchmark_backend,
        tolerations=s.benchmark_tolerations(), priority_class_name=s.benchmark_priority_class_name,
        node_selector=s.benchmark_node_selector(), resources=s.benchmark_resources())


async def refresh(ctx: LoopContext) -> list[benchmarks.GpuTypeCoverage]:
    """One pass; returns the assessment. Created Jobs are logged; "already exists" is fine."""
    s = ctx.settings
    nodes = await ctx.kube.list_gpu_nodes()
    gpu_types = [pool.gpu_type for pool in inventory.build_inventory(nodes, [])]
    coverage = await estimator_client.fetch_coverage(
        s.estimator_url, timeout_seconds=s.estimator_timeout_seconds)
    running: set[str] = set()
    if s.benchmarks_enabled:
        jobs = await ctx.kube.list_jobs(
            s.benchmark_namespace, f"{benchmarks.COMPONENT_LABEL}={benchmarks.COMPONENT}")
        running = benchmarks.running_gpu_types(jobs)
        for job in ctx.outcomes.new(benchmarks.finished_jobs(jobs)):
            ctx.metrics.count_benchmark_job(job.gpu_type, job.outcome)
            LOG.info("benchmark Job for %s finished: %s", job.gpu_type, job.outcome)
    now = ctx.clock()
    assessed = benchmarks.assess(
        gpu_types, coverage, ctx.resolve, now_unix=now.timestamp(),
        max_age_seconds=s.benchmark_max_age_days * SECONDS_PER_DAY, running=running)
    ctx.metrics.observe_coverage(assessed)
    for c in assessed:
        if c.action == benchmarks.Action.UNKNOWN:
            LOG.warning("GPU type %r is not in the device catalog: no benchmark Job", c.gpu_type)
        if not (s.benchmarks_enabled and c.needs_benchmark):
            continue
        body = benchmarks.build_job(c.gpu_type, now=now, namespace=s.benchmark_namespace,
                                    options=job_options(s))
        _, created = await ctx.kube.create_job(s.benchmark_namespace, body)
        if created:
            LOG.info("benchmark Job %s/%s created for %s (%s)", s.benchmark_namespace,
                     body["metadata"]["name"], c.gpu_type, c.action)
    return assessed


async def run_forever(ctx: LoopContext) -> None:
    """`refresh` every `benchmark_interval_seconds`; a failed pass is logged and retried."""
    while True:
        try:
            await refresh(ctx)
        except (errors.OperatorError, kube.ApiError) as exc:
            LOG.warning("benchmark coverage pass failed: %s", exc)
        except Exception:  # the loop must outlive any one bad pass
            LOG.exception("benchmark coverage pass failed")
        await asyncio.sleep(ctx.settings.benchmark_interval_seconds)
