"""Pure inventory functions and the thread-safe store built on them."""

from __future__ import annotations

import pytest

from gpuplan_operator.extender.core import snapshot
from gpuplan_operator.extender.core.store import NODES, PODS, InventoryStore
from gpuplan_testing import extender_builders as builders

L4 = "NVIDIA-L4"


def test_node_gpus_reads_label_and_allocatable() -> None:
    view = snapshot.node_gpus(builders.make_node("n", L4, 4))
    assert view == snapshot.NodeGpus("n", L4, 4, 0)
    assert view.free_gpus == 4
    bare = snapshot.node_gpus(builders.make_node("cpu"))
    assert bare.product is None and bare.allocatable_gpus is None and bare.free_gpus is None


def test_node_gpus_tolerates_garbage_allocatable() -> None:
    node = builders.make_node("n", L4, 4)
    node["status"]["allocatable"]["nvidia.com/gpu"] = "lots"
    assert snapshot.node_gpus(node).allocatable_gpus is None


@pytest.mark.parametrize(
    ("phase", "node", "counted"),
    [("Running", "n", True), ("Pending", "n", True), ("Succeeded", "n", False),
     ("Failed", "n", False), ("Pending", None, False)],
)
def test_pod_usage_counts_bound_non_terminal_pods(
    phase: str, node: str | None, counted: bool
) -> None:
    usage = snapshot.pod_usage(builders.make_pod("p", gpus=2, node_name=node, phase=phase))
    assert (usage == snapshot.PodUsage("n", 2)) is counted
    assert counted or usage is None


def test_build_snapshot_subtracts_bound_pods() -> None:
    nodes = [builders.make_node("a", L4, 4), builders.make_node("b", L4, 4)]
    pods = [builders.make_pod("p1", gpus=1, node_name="a", phase="Running"),
            builders.make_pod("p2", gpus=2, node_name="a", phase="Running"),
            builders.make_pod("p3", gpus=4, node_name="b", phase="Succeeded")]
    snap = snapshot.build_snapshot(nodes, pods, fresh_at_s=3.0)
    assert snap.nodes["a"].free_gpus == 1
    assert snap.nodes["b"].free_gpus == 4


class FakeClock:
    def __init__(self) -> None:
        self.now_s = 100.0

    def __call__(self) -> float:
        return self.now_s


def test_store_is_unsynced_until_both_kinds_are_listed() -> None:
    store = InventoryStore(FakeClock())
    assert store.snapshot() is None and store.age_s() is None
    store.replace(NODES, [builders.make_node("a", L4, 4)])
    assert store.snapshot() is None
    store.replace(PODS, [])
    snap = store.snapshot()
    assert snap is not None and snap.nodes["a"].free_gpus == 4


def test_store_applies_events_and_keeps_old_snapshots_unchanged() -> None:
    clock = FakeClock()
    store = InventoryStore(clock)
    store.replace(NODES, [builders.make_node("a", L4, 4)])
    store.replace(PODS, [])
    before = store.snapshot()
    pod = builders.make_pod("p", gpus=3, node_name="a", phase="Running")
    store.apply(PODS, "ADDED", pod)
    after = store.snapshot()
    assert before is not None and after is not None
    assert before.nodes["a"].free_gpus == 4  # a request's snapshot never changes under it
    assert after.nodes["a"].free_gpus == 1
    store.apply(PODS, "MODIFIED", {**pod, "status": {"phase": "Succeeded"}})
    assert store.snapshot().nodes["a"].free_gpus == 4  # type: ignore[union-attr]
    store.apply(PODS, "ADDED", pod)
    store.apply(PODS, "DELETED", pod)
    store.apply(NODES, "ADDED", builders.make_node("b", L4, 8))
    store.apply(NODES, "DELETED", builders.make_node("a", L4, 4))
    final = store.snapshot()
    assert final is not None and dict(final.nodes) == {"b": snapshot.NodeGpus("b", L4, 8, 0)}


def test_store_unchanged_snapshot_is_reused() -> None:
    store = InventoryStore(FakeClock())
    store.replace(NODES, [builders.make_node("a", L4, 4)])
    store.replace(PODS, [])
    assert store.snapshot() is store.snapshot()


def test_store_age_tracks_the_oldest_kind() -> None:
    clock = FakeClock()
    store = InventoryStore(clock)
    store.replace(NODES, [])
    clock.now_s += 10
    store.replace(PODS, [])
    clock.now_s += 5
    assert store.age_s() == 15.0
    store.mark_fresh(NODES)
    assert store.age_s() == 5.0
    snap = store.snapshot()
    assert snap is not None and snap.fresh_at_s == 110.0


def test_store_rejects_unknown_kind() -> None:
    store = InventoryStore(FakeClock())
    with pytest.raises(ValueError, match="unknown kind"):
        store.replace("services", [])


def test_store_follows_events_like_a_full_rebuild() -> None:
    """The incremental views and class index equal a from-scratch snapshot after any events."""
    import random

    rng = random.Random(7)
    clock = FakeClock()
    store = InventoryStore(clock)
    products = [L4, "NVIDIA-H100-80GB-HBM3", None]
    nodes = {f"n{i}": builders.make_node(f"n{i}", rng.choice(products), rng.choice([4, 8]))
             for i in range(30)}
    pods: dict[str, dict] = {}
    store.replace(NODES, list(nodes.values()))
    store.replace(PODS, [])
    for step in range(2000):
        roll = rng.random()
        if roll < 0.45 and nodes:
            name = f"p{step}"
            pods[name] = builders.make_pod(name, gpus=rng.randint(1, 3),
                                           node_name=rng.choice(list(nodes)), phase="Running")
            store.apply(PODS, "ADDED", pods[name])
        elif roll < 0.85 and pods:
            pod = pods.pop(rng.choice(list(pods)))
            finished = {**pod, "status": {"phase": "Succeeded"}}
            store.apply(PODS, rng.choice(["DELETED", "MODIFIED"]), finished)
        elif roll < 0.93:
            name = f"n{rng.randrange(40)}"
            nodes[name] = builders.make_node(name, rng.choice(products), rng.choice([4, 8]))
            store.apply(NODES, "MODIFIED", nodes[name])
        elif nodes:
            name = rng.choice(list(nodes))
            store.apply(NODES, "DELETED", nodes.pop(name))
        if step % 97 == 0 or step == 1999:
            got = store.snapshot()
            want = snapshot.build_snapshot(nodes.values(), pods.values(), fresh_at_s=0.0)
            assert got is not None and dict(got.nodes) == dict(want.nodes)
            for name in nodes:
                assert got.index.classes[got.index.class_of[name]] == (
                    want.index.classes[want.index.class_of[name]])
            assert set(got.index.class_of) == set(nodes)
            assert len(got.index.classes) <= 2 * len(set(got.index.class_of.values())) + 64


@pytest.mark.parametrize(
    "node",
    [{"metadata": "x"}, {"metadata": {"name": "n", "labels": ["a"]}},
     {"metadata": {"name": "n"}, "status": {"allocatable": {"nvidia.com/gpu": "²"}}},
     {"metadata": {"name": "n"}, "status": {"allocatable": ["nvidia.com/gpu"]}},
     {"metadata": {"name": "n"}, "status": "Ready"}],
)
def test_node_gpus_never_raises(node: dict) -> None:
    view = snapshot.node_gpus(node)
    assert view.allocatable_gpus is None


@pytest.mark.parametrize(
    "spec",
    [{"nodeName": "n", "containers": "x"}, {"nodeName": "n", "initContainers": [None]},
     {"nodeName": "n", "containers": [{"resources": {"limits": {"nvidia.com/gpu": "²"}}}]},
     {"nodeName": "n", "containers": [{"resources": []}]}],
)
def test_a_malformed_pod_from_the_watch_counts_as_zero_and_keeps_the_store_alive(
    spec: dict,
) -> None:
    pod = {"metadata": {"name": "p", "uid": "u"}, "spec": spec, "status": {"phase": "Running"}}
    assert snapshot.pod_usage(pod) is None
    store = InventoryStore(FakeClock())
    store.replace(NODES, [builders.make_node("n", L4, 4)])
    store.replace(PODS, [pod])
    store.apply(PODS, "MODIFIED", pod)
    snap = store.snapshot()
    assert snap is not None and snap.nodes["n"].free_gpus == 4
