"""Periodic benchmark coverage: gather inputs, decide with `benchmarks`, export, create Jobs;
then retraining: decide with `retraining`, count finished training Jobs, start the next one.

Runs as one background task of the operator (started by `handlers.startup`), not per object:
GPU types are a property of the whole cluster.
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime
import logging
from collections.abc import Callable, Mapping

from gpuplan_operator import estimator_client, kube, metrics
from gpuplan_operator.core import benchmarks, errors, gpu_pools, retraining
from gpuplan_operator.core import settings as operator_settings

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
    retraining: RetrainingLedger = dataclasses.field(default_factory=lambda: RetrainingLedger())
    """Training Jobs counted, Jobs started and rows at the last training (this process)."""
    leading: Callable[[], bool] = lambda: True
    """Whether this replica runs the passes now (`leases.LeaseKeeper.leading`; issue #33)."""


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


@dataclasses.dataclass
class RetrainingLedger:
    """What the retraining step remembers between passes of this process.

    Finished training Jobs are counted once by uid, the first pass only recording those already
    finished (as `OutcomeLedger`). `rows_seen` holds each GPU type's database rows when the
    last training Job of this process started: a benchmark Job that succeeded brought new rows
    when its type has more now. Which triggers wait is not remembered: every pass derives them
    from the Jobs (`retraining.benchmark_triggers`), so a restart loses none.
    """

    counted: set[str] = dataclasses.field(default_factory=set)
    baselined: bool = False
    rows_seen: dict[str, int] = dataclasses.field(default_factory=dict)
    started: set[str] = dataclasses.field(default_factory=set)
    """Names of the training Jobs this process created (a schedule slot starts one Job even
    after its Job is gone past its TTL)."""

    def new_outcomes(self, finished: list[tuple[str, str]]) -> list[tuple[str, str]]:
        """The (uid, outcome) pairs of `finished` not seen before (none on the first call)."""
        fresh = [(uid, ended) for uid, ended in finished if uid not in self.counted]
        self.counted = {uid for uid, _ in finished}  # Jobs past their TTL are forgotten
        first, self.baselined = not self.baselined, True
        return [] if first else fresh

    def new_rows(self, rows_by_type: Mapping[str, int]) -> dict[str, bool]:
        """Per GPU type: more rows than at this process's last training Job. A type with rows
        that no training Job of this process saw counts as new: after a restart, the Jobs' times
        decide whether a training Job read them (`retraining.benchmark_triggers`)."""
        return {t: rows > self.rows_seen.get(t, 0) for t, rows in rows_by_type.items()}


def job_options(s: operator_settings.Settings) -> benchmarks.BenchmarkJobOptions:
    """The benchmark Jobs' options from validated operator settings."""
    return benchmarks.BenchmarkJobOptions(
        image=s.benchmark_image, db_secret=s.benchmark_db_secret,
        budget_minutes=s.benchmark_budget_minutes, backend=s.benchmark_backend,
        tolerations=s.benchmark_tolerations(), priority_class_name=s.benchmark_priority_class_name,
        node_selector=s.benchmark_node_selector(), resources=s.benchmark_resources(),
        image_pull_secrets=s.job_image_pull_secrets)


def retraining_options(s: operator_settings.Settings) -> retraining.RetrainJobOptions:
    """The training Jobs' options from validated operator settings (the benchmark database)."""
    return retraining.RetrainJobOptions(image=s.retraining_image, db_secret=s.benchmark_db_secret,
                                 max_rows=s.retraining_max_rows,
                                 resources=s.retraining_resources(),
                                 image_pull_secrets=s.job_image_pull_secrets)


async def refresh(ctx: LoopContext) -> list[benchmarks.GpuTypeCoverage]:
    """One pass; returns the assessment. Created Jobs are logged; "already exists" is fine."""
    s = ctx.settings
    nodes = await ctx.kube.list_gpu_nodes()
    gpu_types = [pool.gpu_type for pool in gpu_pools.build_inventory(nodes, [])]
    coverage = await estimator_client.fetch_coverage(
        s.estimator_url, timeout_seconds=s.estimator_timeout_seconds,
        ca_file=s.estimator_ca_file)
    running: set[str] = set()
    finished: list[benchmarks.FinishedJob] = []
    if s.benchmarks_enabled or s.retraining_enabled:
        jobs = await ctx.kube.list_jobs(
            s.benchmark_namespace, f"{benchmarks.COMPONENT_LABEL}={benchmarks.COMPONENT}")
        running = benchmarks.running_gpu_types(jobs)
        finished = ctx.outcomes.new(benchmarks.finished_jobs(jobs))
        for job in finished:
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
    if s.retraining_enabled and s.benchmark_db_secret:
        await retrain(ctx, benchmarks.finished_jobs(jobs),
                      {c.gpu_type: c.measurements for c in assessed})
    return assessed


async def retrain(ctx: LoopContext, finished: list[benchmarks.FinishedJob],
                  rows_by_type: Mapping[str, int]) -> dict[str, object] | None:
    """The retraining step of a pass: count finished training Jobs once, derive a trigger per
    succeeded benchmark Job (of `finished`, every finished one listed) whose new rows no
    training Job has read (and the schedule's slot), and start the newest one unless a training
    Job runs. Returns the Job body sent, or None."""
    s, ledger = ctx.settings, ctx.retraining
    jobs = await ctx.kube.list_jobs(
        s.benchmark_namespace, f"{benchmarks.COMPONENT_LABEL}={retraining.COMPONENT}")
    for uid, ended in ledger.new_outcomes(retraining.finished_jobs(jobs)):
        ctx.metrics.count_retraining_job(ended)
        LOG.info("training Job %s finished: %s", uid, ended)
    triggers = retraining.benchmark_triggers(
        finished, ledger.new_rows(rows_by_type),
        last_training_unix=retraining.last_start_unix(jobs))
    # A trigger whose Job exists (or existed, in this process) has had its training.
    done = ledger.started | {str((j.get("metadata") or {}).get("name")) for j in jobs}
    scheduled = retraining.schedule_trigger(ctx.clock().timestamp(),
                                            s.retraining_interval_seconds())
    waiting = [t for t in [*triggers, *([scheduled] if scheduled else [])]
               if retraining.job_name(t) not in done]
    trigger = retraining.next_trigger(waiting, running=retraining.any_running(jobs))
    if trigger is None:
        return None
    body = retraining.build_job(trigger, namespace=s.benchmark_namespace,
                                options=retraining_options(s))
    _, created = await ctx.kube.create_job(s.benchmark_namespace, body)
    ledger.started.add(body["metadata"]["name"])
    # The newest trigger's Job reads every row the older ones wrote: their benchmark Jobs ended
    # before it was created, so later passes derive no trigger from them.
    ledger.rows_seen.update(rows_by_type)
    if created:
        LOG.info("training Job %s/%s created (%s trigger %s)", s.benchmark_namespace,
                 body["metadata"]["name"], trigger.kind, trigger.key)
    return body


async def run_forever(ctx: LoopContext) -> None:
    """`refresh` every `benchmark_interval_seconds`; a failed pass is logged and retried."""
    while True:
        try:
            if ctx.leading():  # one replica counts and creates, the others wait their turn
                await refresh(ctx)
        except (errors.OperatorError, kube.ApiError) as exc:
            LOG.warning("benchmark coverage pass failed: %s", exc)
        except Exception:  # the loop must outlive any one bad pass
            LOG.exception("benchmark coverage pass failed")
        await asyncio.sleep(ctx.settings.benchmark_interval_seconds)
