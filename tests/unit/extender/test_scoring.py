"""Filter verdicts and the packing score, table-driven."""

from __future__ import annotations

import pytest

from gpuplan_operator.extender.core import plans, scoring
from gpuplan_operator.extender.core.snapshot import NodeGpus, Snapshot, make_snapshot

H100 = "NVIDIA-H100-80GB-HBM3"
L4 = "NVIDIA-L4"


def plan(gpus: int, gpu_type: str | None = H100) -> plans.PodPlan:
    accepted = None if gpu_type is None else plans.resolve_gfd_only(gpu_type)
    return plans.PodPlan(planned_type=gpu_type, accepted_products=accepted, gpus=gpus)


def snap(*nodes: NodeGpus) -> Snapshot:
    return make_snapshot({n.name: n for n in nodes}, fresh_at_s=0.0)


@pytest.mark.parametrize(
    ("free", "alloc", "requested", "score"),
    [
        (8, 8, 8, 10),  # whole node, exactly filled
        (2, 4, 2, 10),  # partly used node, exactly filled
        (3, 4, 2, 7),  # 2 + round(7 × 0.75)
        (7, 8, 1, 4),  # 2 + round(7 × 0.25) = 2 + 2: nearly empty, still beats an empty node
        (5, 8, 4, 8),  # 2 + round(7 × 0.875)
        (4, 4, 2, 1),  # empty node the pod does not fill
        (8, 8, 1, 1),
        (1, 8, 2, 0),  # does not fit
        (8, 8, 0, 5),  # pod needs no GPUs: neutral
        (0, 0, 1, 5),  # node has no GPUs: neutral
    ],
)
def test_packing_score_table(free: int, alloc: int, requested: int, score: int) -> None:
    assert scoring.packing_score(free, alloc, requested) == score


def test_packing_score_prefers_exact_then_fullest_then_empty() -> None:
    alloc, req = 8, 2
    by_free = {free: scoring.packing_score(free, alloc, req) for free in range(req, alloc + 1)}
    assert by_free[2] == 10
    partial = [by_free[f] for f in range(3, alloc)]
    assert partial == sorted(partial, reverse=True)  # fuller (less free) scores higher
    assert min(partial) > by_free[alloc] == scoring.EMPTY_NODE_SCORE


def test_packing_score_stays_in_range() -> None:
    for alloc in range(0, 17):
        for free in range(0, alloc + 1):
            for req in range(0, 18):
                assert 0 <= scoring.packing_score(free, alloc, req) <= 10


@pytest.mark.parametrize(
    ("node", "pod_plan", "reason", "unresolvable"),
    [
        (NodeGpus("n", H100, 8, 0), plan(8), None, None),
        (NodeGpus("n", L4, 4, 0), plan(8), f"type {L4} != planned {H100}", True),
        (NodeGpus("n", H100, 8, 6), plan(8), "2 free GPUs < 8 requested", False),
        (NodeGpus("n", H100, 4, 0), plan(8), "4 allocatable GPUs < 8 requested", True),
        (NodeGpus("n", None, 8, 0), plan(1), scoring.NO_PRODUCT_LABEL, True),
        (NodeGpus("n", H100, None, 0), plan(1), scoring.NO_ALLOCATABLE, True),
        (NodeGpus("n", L4, 4, 3), plan(1, None), None, None),  # any type, 1 free
        (NodeGpus("n", "nvidia-h100-80gb-hbm3", 8, 0), plan(1), None, None),  # case-insensitive
        (None, plan(1), scoring.NOT_IN_INVENTORY, False),
    ],
)
def test_node_verdict(
    node: NodeGpus | None, pod_plan: plans.PodPlan, reason: str | None, unresolvable: bool | None
) -> None:
    verdict = scoring.node_verdict(node, pod_plan)
    if reason is None:
        assert verdict is None
    else:
        assert verdict == scoring.Verdict(reason, bool(unresolvable))


def test_filter_splits_passed_failed_and_unresolvable() -> None:
    s = snap(NodeGpus("h0", H100, 8, 0), NodeGpus("h1", H100, 8, 2), NodeGpus("l0", L4, 4, 0))
    result = scoring.filter_nodes(s, plan(8), ["h0", "h1", "l0", "ghost"])
    assert result.passed == ("h0",)
    assert result.failed == {"h1": "6 free GPUs < 8 requested", "ghost": scoring.NOT_IN_INVENTORY}
    assert result.failed_unresolvable == {"l0": f"type {L4} != planned {H100}"}


def test_prioritize_packs_partly_used_node_first() -> None:
    s = snap(NodeGpus("empty", L4, 4, 0), NodeGpus("half", L4, 4, 2), NodeGpus("one", L4, 4, 1))
    scores = dict(scoring.prioritize(s, plan(2, L4), ["empty", "half", "one"]))
    assert scores == {"empty": 1, "half": 10, "one": 7}


def test_prioritize_never_fails_on_missing_data() -> None:
    s = snap(NodeGpus("bare", None, None, 0))
    assert scoring.prioritize(s, plan(2), ["bare", "ghost"]) == [
        ("bare", scoring.NEUTRAL_SCORE), ("ghost", scoring.NEUTRAL_SCORE)]
    assert scoring.prioritize(None, plan(2), ["a"]) == [("a", scoring.NEUTRAL_SCORE)]
    assert scoring.prioritize(s, None, ["bare"]) == [("bare", scoring.UNMANAGED_SCORE)]


def test_prioritize_scores_wrong_type_lowest() -> None:
    s = snap(NodeGpus("l0", L4, 4, 0))
    assert scoring.prioritize(s, plan(1, H100), ["l0"]) == [("l0", 0)]


def test_reject_all_and_pass_through() -> None:
    assert scoring.pass_through(["a", "b"]).passed == ("a", "b")
    rejected = scoring.reject_all(["a", "b"], "bad plan")
    assert rejected.passed == ()
    assert rejected.failed_unresolvable == {"a": "bad plan", "b": "bad plan"}
