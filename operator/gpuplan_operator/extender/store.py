"""Thread-safe in-memory inventory fed by the watcher; hands out immutable snapshots.

Writers (watch threads) apply lists and events under a lock; readers (request handlers) get a
`Snapshot` copied once per change, so a request decides on one consistent view and never waits
on the API server.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable, Iterable, Mapping
from types import MappingProxyType
from typing import Any

from gpuplan_operator.extender import inventory

NODES = "nodes"
PODS = "pods"
KINDS = (NODES, PODS)


class InventoryStore:
    """Current Nodes and GPU-holding Pods; `snapshot()` is None until both kinds were listed."""

    def __init__(self, clock: Callable[[], float]) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._base: dict[str, inventory.NodeGpus] = {}  # used_gpus always 0 here
        self._usage: dict[str, inventory.PodUsage] = {}
        self._used: dict[str, int] = {}
        self._fresh_at_s: dict[str, float] = {}
        self._cached: inventory.Snapshot | None = None

    # -- writers -------------------------------------------------------------------------------

    def replace(self, kind: str, items: Iterable[Mapping[str, Any]]) -> None:
        """Replace everything of `kind` with a fresh list (a relist)."""
        with self._lock:
            if kind == NODES:
                self._base = {}
                for node in items:
                    view = inventory.node_gpus(node)
                    self._base[view.name] = view
            elif kind == PODS:
                self._usage = {}
                for pod in items:
                    usage = inventory.pod_usage(pod)
                    if usage is not None:
                        self._usage[inventory.pod_key(pod)] = usage
                self._used = inventory.used_by_node(self._usage.values())
            else:
                raise ValueError(f"unknown kind {kind!r}")
            self._fresh_at_s[kind] = self._clock()
            self._cached = None

    def apply(self, kind: str, event_type: str, obj: Mapping[str, Any]) -> None:
        """Apply one watch event (ADDED, MODIFIED, DELETED); other types only prove liveness."""
        with self._lock:
            if kind == NODES:
                self._apply_node(event_type, obj)
            elif kind == PODS:
                self._apply_pod(event_type, obj)
            else:
                raise ValueError(f"unknown kind {kind!r}")
            self._fresh_at_s[kind] = self._clock()

    def mark_fresh(self, kind: str) -> None:
        """Record that the watch of `kind` is known current (a clean server-side timeout)."""
        with self._lock:
            if kind in self._fresh_at_s:
                self._fresh_at_s[kind] = self._clock()

    def _apply_node(self, event_type: str, obj: Mapping[str, Any]) -> None:
        view = inventory.node_gpus(obj)
        if event_type == "DELETED":
            if self._base.pop(view.name, None) is not None:
                self._cached = None
        elif event_type in ("ADDED", "MODIFIED") and self._base.get(view.name) != view:
            self._base[view.name] = view
            self._cached = None

    def _apply_pod(self, event_type: str, obj: Mapping[str, Any]) -> None:
        if event_type not in ("ADDED", "MODIFIED", "DELETED"):
            return
        key = inventory.pod_key(obj)
        new = None if event_type == "DELETED" else inventory.pod_usage(obj)
        old = self._usage.get(key)
        if new == old:
            return
        if old is not None:
            del self._usage[key]
            left = self._used.get(old.node_name, 0) - old.gpus
            if left > 0:
                self._used[old.node_name] = left
            else:
                self._used.pop(old.node_name, None)
        if new is not None:
            self._usage[key] = new
            self._used[new.node_name] = self._used.get(new.node_name, 0) + new.gpus
        self._cached = None

    # -- readers -------------------------------------------------------------------------------

    def age_seconds(self) -> float | None:
        """Seconds since both kinds were last known current; None before the first sync."""
        with self._lock:
            if len(self._fresh_at_s) < len(KINDS):
                return None
            return max(self._clock() - min(self._fresh_at_s.values()), 0.0)

    def snapshot(self) -> inventory.Snapshot | None:
        """The inventory as an immutable Snapshot (cached until it changes); None before sync."""
        with self._lock:
            if len(self._fresh_at_s) < len(KINDS):
                return None
            fresh_at_s = min(self._fresh_at_s.values())
            cached = self._cached
            if cached is None:
                cached = self._cached = inventory.make_snapshot(self._views(), fresh_at_s)
            elif cached.fresh_at_s != fresh_at_s:
                cached = self._cached = dataclasses.replace(cached, fresh_at_s=fresh_at_s)
            return cached

    def _views(self) -> Mapping[str, inventory.NodeGpus]:
        used = self._used
        return MappingProxyType({
            name: inventory.NodeGpus(name, b.product, b.allocatable_gpus, used.get(name, 0))
            if name in used else b
            for name, b in self._base.items()
        })
