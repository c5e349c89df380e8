"""The list/watch loop against a scripted ListWatch (the seam of the only I/O module)."""

from __future__ import annotations

import threading
from collections.abc import Iterator, Mapping
from typing import Any

from gpuplan_operator.extender.core.store import NODES, PODS, InventoryStore
from gpuplan_operator.extender.watcher import WatchExpired, WatchSettings, run_kind
from gpuplan_testing import extender_builders as builders

L4 = "NVIDIA-L4"
FAST = WatchSettings(backoff_initial_s=0.001, backoff_max_s=0.002, stale_after_s=50.0,
                     resync_every_s=1000.0)


class Clock:
    def __init__(self) -> None:
        self.now_s = 0.0

    def __call__(self) -> float:
        return self.now_s


class ScriptedNodes:
    """Each list returns the next node list; each watch plays the next script step.

    A step is a list of events, an exception to raise, or "advance:N" to move the clock."""

    kind = NODES

    def __init__(self, lists: list[list[str]], watches: list[Any], clock: Clock,
                 stop: threading.Event) -> None:
        self.lists, self.watches, self.clock, self.stop = lists, watches, clock, stop
        self.list_calls = 0
        self.watched_from: list[str] = []

    def list(self) -> tuple[list[Mapping[str, Any]], str]:
        names = self.lists[min(self.list_calls, len(self.lists) - 1)]
        self.list_calls += 1
        return [builders.make_node(n, L4, 4) for n in names], f"rv{self.list_calls}"

    def watch(self, resource_version: str) -> Iterator[Mapping[str, Any]]:
        self.watched_from.append(resource_version)
        if not self.watches:
            self.stop.set()
            return
        step = self.watches.pop(0)
        if isinstance(step, Exception):
            raise step
        if isinstance(step, float):
            self.clock.now_s += step
            return
        yield from step


def run(lw: ScriptedNodes, store: InventoryStore, clock: Clock) -> None:
    thread = threading.Thread(target=run_kind, args=(lw, store, FAST, clock, lw.stop))
    thread.start()
    thread.join(5)
    assert not thread.is_alive()


def names(store: InventoryStore) -> set[str]:
    snap = store.snapshot()
    assert snap is not None
    return set(snap.nodes)


def node_event(kind: str, name: str, rv: str) -> dict[str, Any]:
    node = builders.make_node(name, L4, 4)
    node["metadata"]["resourceVersion"] = rv
    return {"type": kind, "object": node}


def synced_store(clock: Clock) -> InventoryStore:
    store = InventoryStore(clock)
    store.replace(PODS, [])
    return store


def test_events_apply_and_resume_from_last_resource_version() -> None:
    clock, stop = Clock(), threading.Event()
    lw = ScriptedNodes([["a"]], [[node_event("ADDED", "b", "7")],
                                  [node_event("DELETED", "a", "9")]], clock, stop)
    store = synced_store(clock)
    run(lw, store, clock)
    assert names(store) == {"b"}
    assert lw.list_calls == 1
    assert lw.watched_from == ["rv1", "7", "9"]


def test_expired_watch_relists() -> None:
    clock, stop = Clock(), threading.Event()
    lw = ScriptedNodes([["a"], ["a", "c"]], [WatchExpired("too old")], clock, stop)
    store = synced_store(clock)
    run(lw, store, clock)
    assert lw.list_calls == 2
    assert names(store) == {"a", "c"}


def test_error_event_410_relists_and_other_errors_back_off_and_relist() -> None:
    clock, stop = Clock(), threading.Event()
    gone = [{"type": "ERROR", "object": {"code": 410, "message": "too old"}}]
    boom = [{"type": "ERROR", "object": {"code": 500, "message": "boom"}}]
    lw = ScriptedNodes([["a"], ["b"], ["c"], ["d"]],
                       [gone, boom, ConnectionResetError("reset")], clock, stop)
    store = synced_store(clock)
    run(lw, store, clock)
    assert lw.list_calls == 4
    assert names(store) == {"d"}


def test_silent_watches_are_stale_and_relist() -> None:
    clock, stop = Clock(), threading.Event()
    # Two empty watches that each take 30 s: after 60 s without a single event the loop relists.
    lw = ScriptedNodes([["a"], ["a", "z"]], [30.0, 30.0], clock, stop)
    store = synced_store(clock)
    run(lw, store, clock)
    assert lw.list_calls == 2
    assert names(store) == {"a", "z"}


def test_clean_watch_end_marks_fresh() -> None:
    clock, stop = Clock(), threading.Event()
    lw = ScriptedNodes([["a"]], [[node_event("BOOKMARK", "a", "5")], 20.0], clock, stop)
    store = synced_store(clock)
    run(lw, store, clock)
    assert lw.list_calls == 1  # 20 s silent < stale_after_s 50: keep watching
    assert store.age_s() == 20.0  # pods were listed at 0 s; nodes confirmed at 20 s
