"""Pure parts of the scheduler comparison (issue #32, item 4): cluster, workload, metrics, table.

Everything here is plain data in, plain data out; `campaigns.scheduler_comparison` does the I/O.

The cluster mixes 8-GPU NVLink H100 (SXM) nodes, 8-GPU PCIe A100 nodes and 4-GPU L4 nodes. The
workload is a seeded sequence of training pods, each planned on one GPU type (node affinity on
`nvidia.com/gpu.product` plus gpuplan's plan annotations, as the operator writes them), with CPU
and memory requests that vary per pod as real data loaders do. A pod finishes a seeded number of
arrivals after it was bound.
"""

from __future__ import annotations

import random
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from testbed_render import extender_section, node_manifests, scheduler_config

from gpuplan_operator.core import annotations as plan_keys
from gpuplan_operator.core.gpu_accounting import GPU_PRODUCT_LABEL, GPU_RESOURCE
from gpuplan_operator.extender.core.snapshot import NodeGpus, build_snapshot

H100_SXM = "NVIDIA-H100-80GB-HBM3"
"""SXM board: the node's 8 GPUs share NVLink/NVSwitch, so an 8-GPU job wants a whole node."""
A100_PCIE = "NVIDIA-A100-80GB-PCIe"
L4 = "NVIDIA-L4"
NVLINK_PRODUCTS = frozenset({H100_SXM})
NVLINK_NODE_GPUS = 8
DEFAULT_SCORED_RESOURCES = ("cpu", "memory")
"""NodeResourcesFit's scoring resources when a profile names none (kube-scheduler's default)."""
POOL_LABEL = "gpuplan.io/scheduler-comparison"
"""Label (value: the run's pool id) and taint key that keep the campaign's nodes to itself."""


@dataclass(frozen=True)
class NodePool:
    prefix: str
    count: int
    product: str
    gpus: int
    memory_mib: int
    cpu: int
    memory_gib: int


# GFD memory values (MiB) as nvidia-smi reports them; CPU/memory of common 8-GPU servers.
DEFAULT_POOLS = (
    NodePool("h100", 4, H100_SXM, 8, 81559, cpu=208, memory_gib=2000),
    NodePool("a100", 4, A100_PCIE, 8, 81920, cpu=128, memory_gib=1000),
    NodePool("l4", 4, L4, 4, 23034, cpu=48, memory_gib=192),
)


@dataclass(frozen=True)
class PodKind:
    product: str
    gpus: int
    weight: float


# The mix: many 1-GPU jobs (the fragmenters), some whole-node 8-GPU jobs on NVLink H100.
DEFAULT_MIX = (
    PodKind(H100_SXM, 1, 0.25), PodKind(H100_SXM, 2, 0.05), PodKind(H100_SXM, 8, 0.15),
    PodKind(A100_PCIE, 1, 0.15), PodKind(A100_PCIE, 4, 0.10), PodKind(A100_PCIE, 8, 0.05),
    PodKind(L4, 1, 0.20), PodKind(L4, 2, 0.05),
)


@dataclass(frozen=True)
class PodSpec:
    """One arrival: the pod's plan, its requests, and how many arrivals it runs once bound."""

    name: str
    product: str
    gpus: int
    cpu: int
    memory_gib: int
    lifetime_steps: int | None  # None: runs to the end of the campaign


CPU_ONLY = ""
"""`PodSpec.product` of a pod that asks for no GPU (preprocessing, evaluation, a notebook)."""
CPU_ONLY_CPU = (8, 96)
CPU_ONLY_MEMORY_GIB = (32, 768)
"""Ranges of a CPU-only pod's requests: it fits an H100 or A100 node, not an L4 one."""


def workload(seed: int, pods: int, cpu_only_share: float = 0.0,
             mix: Sequence[PodKind] = DEFAULT_MIX,
             pools: Sequence[NodePool] = DEFAULT_POOLS) -> list[PodSpec]:
    """The seeded arrival sequence; the same arguments give the same list on every machine.

    GPU pods draw CPU and memory per GPU up to the node's share per GPU (a data loader's
    appetite varies), so every pod fits its type's node; `cpu_only_share` of the arrivals are
    CPU-only pods that may land on any node of the pool. A 1/10 of the pods never finish."""
    if pods < 1:
        raise ValueError(f"--pods must be at least 1, got {pods}")
    if not 0.0 <= cpu_only_share < 1.0:
        raise ValueError(f"--cpu-only-share must be in [0, 1), got {cpu_only_share}")
    kinds = [*mix, PodKind(CPU_ONLY, 0, sum(k.weight for k in mix) * cpu_only_share
                           / (1.0 - cpu_only_share))]
    pool_of = {p.product: p for p in pools}
    rng = random.Random(seed)
    specs = []
    for i, kind in enumerate(rng.choices(kinds, weights=[k.weight for k in kinds], k=pods)):
        if kind.product == CPU_ONLY:
            cpu, memory_gib = rng.randint(*CPU_ONLY_CPU), rng.randint(*CPU_ONLY_MEMORY_GIB)
            label = "cpu"
        else:
            pool = pool_of[kind.product]
            cpu = kind.gpus * rng.randint(2, pool.cpu // pool.gpus)
            memory_gib = kind.gpus * rng.randint(8, pool.memory_gib // pool.gpus)
            label = f"{kind.product.split('-')[1].lower()}x{kind.gpus}"
        lifetime = rng.randint(3, 20) if rng.random() < 0.9 else None
        specs.append(PodSpec(f"p{i:03d}-{label}", kind.product, kind.gpus, cpu, memory_gib,
                             lifetime))
    return specs


def pool_nodes(pools: Sequence[NodePool], pool_id: str) -> list[dict[str, Any]]:
    """kwok Node objects for the pools, labelled and tainted for this run only."""
    doc = {"kind": "NodePools", "pools": [
        {"namePrefix": f"{pool_id}-{p.prefix}", "count": p.count, "cpu": str(p.cpu),
         "memory": f"{p.memory_gib}Gi",
         "gpu": {"product": p.product, "count": p.gpus, "memoryMiB": p.memory_mib}}
        for p in pools]}
    nodes = node_manifests(doc, "scheduler comparison pools")
    for node in nodes:
        node["metadata"]["labels"][POOL_LABEL] = pool_id
        node["spec"]["taints"] = [{"key": POOL_LABEL, "value": pool_id, "effect": "NoSchedule"}]
    return nodes


def pod_manifest(spec: PodSpec, scheduler_name: str, pool_id: str) -> dict[str, Any]:
    """The pod as the operator would create it: plan annotations and required node affinity on
    the planned type (a CPU-only pod: neither, only the pool)."""
    expressions = [{"key": POOL_LABEL, "operator": "In", "values": [pool_id]}]
    requests = {"cpu": str(spec.cpu), "memory": f"{spec.memory_gib}Gi"}
    resources: dict[str, Any] = {"requests": requests}
    notes = {}
    if spec.gpus:
        expressions.insert(0, {"key": GPU_PRODUCT_LABEL, "operator": "In",
                               "values": [spec.product]})
        requests[GPU_RESOURCE] = str(spec.gpus)
        resources["limits"] = {GPU_RESOURCE: str(spec.gpus)}
        notes = {plan_keys.GPU_TYPE: spec.product, plan_keys.GPU_COUNT: str(spec.gpus)}
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": spec.name, "annotations": notes},
        "spec": {
            "schedulerName": scheduler_name, "restartPolicy": "Never",
            "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [{"matchExpressions": expressions}]}}},
            "tolerations": [{"key": POOL_LABEL, "operator": "Equal", "value": pool_id,
                             "effect": "NoSchedule"}],
            "containers": [{"name": "train", "image": "trainer:campaign", "resources": resources}],
        },
    }


def scheduler_profile_config(kubeconfig_path: str, scheduler_name: str, extender_url: str | None,
                             most_allocated_on: Sequence[str]) -> dict[str, Any]:
    """kube-scheduler with NodeResourcesFit scoring MostAllocated over `most_allocated_on`
    (weight 1 each; empty: the default profile, LeastAllocated), optionally plus the gpuplan
    extender (the testbed's extender section)."""
    config = scheduler_config(kubeconfig_path, scheduler_name=scheduler_name)
    if most_allocated_on:
        config["profiles"][0]["pluginConfig"] = [{"name": "NodeResourcesFit", "args": {
            "scoringStrategy": {"type": "MostAllocated", "resources": [
                {"name": r, "weight": 1} for r in most_allocated_on]}}}]
    if extender_url is not None:
        config["extenders"] = [extender_section(extender_url, ignorable=True)]
    return config


def whole_free_nvlink_nodes(nodes: Sequence[NodeGpus]) -> int:
    """8-GPU NVLink nodes with no GPU in use: what the next whole-node job can still get."""
    return sum(1 for n in nodes if n.product in NVLINK_PRODUCTS
               and n.allocatable_gpus == NVLINK_NODE_GPUS and n.used_gpus == 0)


def partly_used_nvlink_nodes(nodes: Sequence[NodeGpus]) -> int:
    """NVLink nodes with some but not all GPUs in use: fragments."""
    return sum(1 for n in nodes if n.product in NVLINK_PRODUCTS
               and 0 < n.used_gpus < (n.allocatable_gpus or 0))


@dataclass(frozen=True)
class PodOutcome:
    name: str
    product: str
    gpus: int
    node_product: str | None  # None: never bound
    bound_at_arrival: bool
    bind_ms: float | None  # create → bound, for pods bound at arrival
    whole_nvlink_free_at_arrival: int


@dataclass(frozen=True)
class RunResult:
    variant: str
    repeat: int
    outcomes: tuple[PodOutcome, ...]
    whole_free_series: tuple[int, ...]  # after each arrival
    partly_used_series: tuple[int, ...]
    pending_at_end: int


@dataclass(frozen=True)
class VariantSummary:
    variant: str
    runs: int
    pods: int
    on_planned_type: str
    bound_at_arrival: str
    whole_node_jobs_bound_at_arrival: str
    whole_free_mean: float
    whole_free_min: int
    partly_used_mean: float
    pending_at_end: str
    bind_ms_p50: float
    bind_ms_p95: float


def _range(values: Sequence[int]) -> str:
    low, high = min(values), max(values)
    return f"{low}" if low == high else f"{low}–{high}"


def _percentile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def summarize(variant: str, runs: Sequence[RunResult]) -> VariantSummary:
    """Counts as min–max over the repeats (ties between equal nodes are broken at random by
    kube-scheduler, so repeats differ); series means and bind times over all repeats."""
    def per_run(pick: Any) -> list[int]:
        return [sum(1 for o in r.outcomes if pick(o)) for r in runs]

    whole_jobs = [o for o in runs[0].outcomes if o.product in NVLINK_PRODUCTS
                  and o.gpus == NVLINK_NODE_GPUS]
    whole_free = [v for r in runs for v in r.whole_free_series]
    partly = [v for r in runs for v in r.partly_used_series]
    binds = [o.bind_ms for r in runs for o in r.outcomes if o.bind_ms is not None]
    return VariantSummary(
        variant=variant, runs=len(runs), pods=len(runs[0].outcomes),
        on_planned_type=(f"{_range(per_run(lambda o: o.gpus > 0 and o.node_product == o.product))}"
                         f" / {sum(1 for o in runs[0].outcomes if o.gpus)}"),
        bound_at_arrival=_range(per_run(lambda o: o.bound_at_arrival)),
        whole_node_jobs_bound_at_arrival=(
            f"{_range(per_run(lambda o: in_whole(o) and o.bound_at_arrival))}"
            f" / {len(whole_jobs)}"),
        whole_free_mean=round(statistics.fmean(whole_free), 2),
        whole_free_min=min(whole_free),
        partly_used_mean=round(statistics.fmean(partly), 2),
        pending_at_end=_range([r.pending_at_end for r in runs]),
        bind_ms_p50=round(_percentile(binds, 0.5), 1),
        bind_ms_p95=round(_percentile(binds, 0.95), 1),
    )


def in_whole(outcome: PodOutcome) -> bool:
    """An 8-GPU job planned on an NVLink type: it needs a whole NVLink node."""
    return outcome.product in NVLINK_PRODUCTS and outcome.gpus == NVLINK_NODE_GPUS


TABLE_HEADER = (
    "| variant | runs | pods | GPU pods on planned type | bound at arrival | 8-GPU NVLink jobs "
    "bound at arrival | whole free NVLink nodes, mean (min) | partly used NVLink nodes, mean | "
    "pending at end | bind p50 / p95 ms |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")


def table(summaries: Sequence[VariantSummary]) -> str:
    rows = [f"| {s.variant} | {s.runs} | {s.pods} | {s.on_planned_type} | {s.bound_at_arrival} | "
            f"{s.whole_node_jobs_bound_at_arrival} | {s.whole_free_mean} ({s.whole_free_min}) | "
            f"{s.partly_used_mean} | {s.pending_at_end} | {s.bind_ms_p50} / {s.bind_ms_p95} |"
            for s in summaries]
    return "\n".join([TABLE_HEADER, *rows])


def node_states(nodes: Sequence[Mapping[str, Any]], pods: Sequence[Mapping[str, Any]],
                pool_id: str) -> list[NodeGpus]:
    """GPU use per campaign node, counted as the extender counts it, from listed Nodes and Pods."""
    mine = [n for n in nodes if n["metadata"].get("labels", {}).get(POOL_LABEL) == pool_id]
    return list(build_snapshot(mine, pods, fresh_at_s=0.0).nodes.values())
