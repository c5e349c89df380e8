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

from gpuplan_operator.extender.core import snapshot

NODES = "nodes"
PODS = "pods"
KINDS = (NODES, PODS)


class InventoryStore:
    """Current Nodes and GPU-holding Pods; `snapshot()` is None until both kinds were listed.

    The per-node views and their class index (`snapshot.NodeIndex`) are kept up to date event
    by event: a pod binding or finishing touches one node, so handing out the next snapshot
    costs two dict copies, not a rebuild of every node's view (~5 ms at 5,000 nodes, which
    every request after a change used to pay).
    """

    def __init__(self, clock: Callable[[], float]) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._base: dict[str, snapshot.NodeGpus] = {}  # used_gpus always 0 here
        self._usage: dict[str, snapshot.PodUsage] = {}
        self._used: dict[str, int] = {}
        self._fresh_at_s: dict[str, float] = {}
        self._cached: snapshot.Snapshot | None = None
        # Derived from _base and _used, kept in step by _refresh_node:
        self._views: dict[str, snapshot.NodeGpus] = {}
        self._class_ids: dict[tuple[str | None, int | None, int], int] = {}
        self._classes: list[snapshot.NodeGpus] = []
        self._class_members: list[int] = []
        self._class_of: dict[str, int] = {}

    # -- writers -------------------------------------------------------------------------------

    def replace(self, kind: str, items: Iterable[Mapping[str, Any]]) -> None:
        """Replace everything of `kind` with a fresh list (a relist)."""
        with self._lock:
            if kind == NODES:
                self._base = {}
                for node in items:
                    view = snapshot.node_gpus(node)
                    self._base[view.name] = view
            elif kind == PODS:
                self._usage = {}
                for pod in items:
                    usage = snapshot.pod_usage(pod)
                    if usage is not None:
                        self._usage[snapshot.pod_key(pod)] = usage
                self._used = snapshot.used_by_node(self._usage.values())
            else:
                raise ValueError(f"unknown kind {kind!r}")
            self._fresh_at_s[kind] = self._clock()
            self._rebuild()

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
        view = snapshot.node_gpus(obj)
        if event_type == "DELETED":
            if self._base.pop(view.name, None) is not None:
                self._refresh_node(view.name)
        elif event_type in ("ADDED", "MODIFIED") and self._base.get(view.name) != view:
            self._base[view.name] = view
            self._refresh_node(view.name)

    def _apply_pod(self, event_type: str, obj: Mapping[str, Any]) -> None:
        if event_type not in ("ADDED", "MODIFIED", "DELETED"):
            return
        key = snapshot.pod_key(obj)
        new = None if event_type == "DELETED" else snapshot.pod_usage(obj)
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
            self._refresh_node(old.node_name)
        if new is not None:
            self._usage[key] = new
            self._used[new.node_name] = self._used.get(new.node_name, 0) + new.gpus
            self._refresh_node(new.node_name)

    # -- the derived views and class index -----------------------------------------------------

    def _rebuild(self) -> None:
        """Recompute every view and a compact class index (after a relist)."""
        self._views = {}
        self._class_ids, self._classes, self._class_members, self._class_of = {}, [], [], {}
        for name in self._base:
            self._refresh_node(name)
        self._cached = None

    def _refresh_node(self, name: str) -> None:
        """Bring one node's view and class in line with _base and _used."""
        base = self._base.get(name)
        old_cid = self._class_of.get(name)
        if base is None:
            if old_cid is not None:
                del self._views[name], self._class_of[name]
                self._class_members[old_cid] -= 1
                self._cached = None
            return
        used = self._used.get(name, 0)
        view = base if used == base.used_gpus else snapshot.NodeGpus(
            name, base.product, base.allocatable_gpus, used)
        if self._views.get(name) == view:
            return
        self._views[name] = view
        key = (view.product, view.allocatable_gpus, view.used_gpus)
        cid = self._class_ids.get(key)
        if cid is None:
            cid = self._class_ids[key] = len(self._classes)
            self._classes.append(snapshot.NodeGpus("", *key))
            self._class_members.append(0)
        if cid != old_cid:
            if old_cid is not None:
                self._class_members[old_cid] -= 1
            self._class_members[cid] += 1
            self._class_of[name] = cid
        self._cached = None

    # -- readers -------------------------------------------------------------------------------

    def age_s(self) -> float | None:
        """Seconds since both kinds were last known current; None before the first sync."""
        with self._lock:
            if len(self._fresh_at_s) < len(KINDS):
                return None
            return max(self._clock() - min(self._fresh_at_s.values()), 0.0)

    def snapshot(self) -> snapshot.Snapshot | None:
        """The inventory as an immutable Snapshot (cached until it changes); None before sync."""
        with self._lock:
            if len(self._fresh_at_s) < len(KINDS):
                return None
            fresh_at_s = min(self._fresh_at_s.values())
            cached = self._cached
            if cached is None:
                if len(self._classes) > 2 * self._live_classes() + 64:
                    self._rebuild()  # classes emptied by churn would be evaluated per request
                cached = self._cached = snapshot.Snapshot(
                    nodes=MappingProxyType(dict(self._views)),
                    fresh_at_s=fresh_at_s,
                    index=snapshot.NodeIndex(classes=tuple(self._classes),
                                              class_of=dict(self._class_of)),
                )
            elif cached.fresh_at_s != fresh_at_s:
                cached = self._cached = dataclasses.replace(cached, fresh_at_s=fresh_at_s)
            return cached

    def _live_classes(self) -> int:
        return sum(1 for members in self._class_members if members)
