"""The pure half of the scheduler comparison campaign: workload, nodes, configs, metrics."""

from __future__ import annotations

import pytest

from campaigns import scheduler_workload as w
from gpuplan_operator.core import annotations as plan_keys
from gpuplan_operator.extender.core.snapshot import NodeGpus


def test_workload_is_seeded_and_every_pod_fits_its_type() -> None:
    specs = w.workload(7, 60)
    assert specs == w.workload(7, 60)
    assert specs != w.workload(8, 60)
    pools = {p.product: p for p in w.DEFAULT_POOLS}
    for spec in specs:
        pool = pools[spec.product]
        assert spec.gpus <= pool.gpus and spec.cpu <= pool.cpu
        assert spec.memory_gib <= pool.memory_gib
    assert any(s.product == w.H100_SXM and s.gpus == 8 for s in specs)
    assert any(s.lifetime_steps is None for s in specs)
    assert not any(s.gpus == 0 for s in specs)
    with pytest.raises(ValueError, match="--pods"):
        w.workload(7, 0)
    with pytest.raises(ValueError, match="--cpu-only-share"):
        w.workload(7, 10, cpu_only_share=1.0)


def test_cpu_only_share_adds_pods_without_gpus_or_plan() -> None:
    specs = w.workload(7, 200, cpu_only_share=0.25)
    cpu_only = [s for s in specs if s.gpus == 0]
    assert 30 <= len(cpu_only) <= 70 and all(s.product == w.CPU_ONLY for s in cpu_only)
    pod = w.pod_manifest(cpu_only[0], "sched-a", "cmp-x")
    assert pod["metadata"]["annotations"] == {}
    assert "nvidia.com/gpu" not in pod["spec"]["containers"][0]["resources"]["requests"]
    terms = pod["spec"]["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert [e["key"] for e in terms[0]["matchExpressions"]] == [w.POOL_LABEL]


def test_pool_nodes_are_tainted_labelled_and_kwok_managed() -> None:
    nodes = w.pool_nodes(w.DEFAULT_POOLS, "cmp-x")
    assert len(nodes) == sum(p.count for p in w.DEFAULT_POOLS)
    h100 = next(n for n in nodes if n["metadata"]["name"] == "cmp-x-h100-0")
    assert h100["metadata"]["labels"][w.POOL_LABEL] == "cmp-x"
    assert h100["metadata"]["labels"]["nvidia.com/gpu.product"] == w.H100_SXM
    assert h100["spec"]["taints"] == [
        {"key": w.POOL_LABEL, "value": "cmp-x", "effect": "NoSchedule"}]
    assert h100["metadata"]["annotations"]["kwok.x-k8s.io/node"] == "fake"


def test_pod_manifest_carries_the_plan_affinity_and_toleration() -> None:
    spec = w.PodSpec("p1", w.L4, 2, 10, 40, None)
    pod = w.pod_manifest(spec, "sched-a", "cmp-x")
    assert pod["metadata"]["annotations"] == {plan_keys.GPU_TYPE: w.L4, plan_keys.GPU_COUNT: "2"}
    assert pod["spec"]["schedulerName"] == "sched-a"
    terms = pod["spec"]["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert {e["key"]: e["values"] for e in terms[0]["matchExpressions"]} == {
        "nvidia.com/gpu.product": [w.L4], w.POOL_LABEL: ["cmp-x"]}
    assert pod["spec"]["containers"][0]["resources"]["requests"] == {
        "cpu": "10", "memory": "40Gi", "nvidia.com/gpu": "2"}


def test_profile_config_with_and_without_the_extender() -> None:
    assert "pluginConfig" not in w.scheduler_profile_config("/k", "s", None, ())["profiles"][0]
    plain = w.scheduler_profile_config("/k", "s", None, w.DEFAULT_SCORED_RESOURCES)
    profile = plain["profiles"][0]
    assert profile["schedulerName"] == "s" and "extenders" not in plain
    strategy = profile["pluginConfig"][0]["args"]["scoringStrategy"]
    assert strategy == {"type": "MostAllocated", "resources": [
        {"name": "cpu", "weight": 1}, {"name": "memory", "weight": 1}]}
    with_ext = w.scheduler_profile_config("/k", "s", "http://127.0.0.1:1/extender",
                                          ("nvidia.com/gpu",))
    assert with_ext["extenders"][0]["urlPrefix"] == "http://127.0.0.1:1/extender"
    assert with_ext["profiles"][0]["pluginConfig"] != profile["pluginConfig"]


def test_whole_and_partly_used_nvlink_nodes() -> None:
    nodes = [NodeGpus("a", w.H100_SXM, 8, 0), NodeGpus("b", w.H100_SXM, 8, 3),
             NodeGpus("c", w.H100_SXM, 8, 8), NodeGpus("d", w.A100_PCIE, 8, 0),
             NodeGpus("e", w.L4, 4, 1)]
    assert w.whole_free_nvlink_nodes(nodes) == 1
    assert w.partly_used_nvlink_nodes(nodes) == 1


def _outcome(name: str, gpus: int, node_product: str | None, at_arrival: bool,
             bind_ms: float | None) -> w.PodOutcome:
    return w.PodOutcome(name, w.H100_SXM, gpus, node_product, at_arrival, bind_ms, 1)


def test_summary_ranges_over_repeats_and_the_table_row() -> None:
    run_a = w.RunResult("v", 0, (_outcome("x", 8, w.H100_SXM, True, 10.0),
                                  _outcome("y", 1, w.H100_SXM, True, 30.0)), (1, 0), (0, 1), 0)
    run_b = w.RunResult("v", 1, (_outcome("x", 8, None, False, None),
                                  _outcome("y", 1, w.H100_SXM, True, 20.0)), (0, 0), (1, 1), 1)
    summary = w.summarize("v", [run_a, run_b])
    assert summary.on_planned_type == "1–2 / 2" and summary.bound_at_arrival == "1–2"
    assert summary.whole_node_jobs_bound_at_arrival == "0–1 / 1"
    assert summary.whole_free_mean == 0.25 and summary.whole_free_min == 0
    assert summary.pending_at_end == "0–1"
    assert (summary.bind_ms_p50, summary.bind_ms_p95) == (20.0, 30.0)
    assert w.table([summary]).splitlines()[-1].startswith("| v | 2 | 2 | 1–2 / 2 | 1–2 |")
