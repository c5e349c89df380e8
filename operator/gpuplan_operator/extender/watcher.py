"""The extender's only Kubernetes I/O: list + watch Nodes and Pods into an `InventoryStore`.

One daemon thread per kind runs list → watch → watch … and relists when the watch expires (410),
breaks (any error, including the client read timeout that catches a silently dead connection),
has delivered nothing for `stale_after_s`, or every `resync_every_s` regardless (trimaran's
collector refreshes off the request path the same way).
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from gpuplan_operator.core import gpu_accounting
from gpuplan_operator.extender.core.store import NODES, PODS, InventoryStore

log = logging.getLogger(__name__)

HTTP_GONE = 410
# Terminal pods hold no GPUs; the apiserver sends DELETED when a pod leaves this selector.
ACTIVE_PODS_SELECTOR = gpu_accounting.ACTIVE_PODS_FIELD_SELECTOR


@dataclass(frozen=True)
class WatchSettings:
    """Timing of the list/watch loops."""

    watch_timeout_s: int = 60
    """Server-side `timeoutSeconds` of each watch call; a clean end proves the stream was live."""
    read_timeout_margin_s: float = 15.0
    """Client read timeout = watch_timeout_s + this: a connection silent for longer is dead."""
    connect_timeout_s: float = 5.0
    list_timeout_s: float = 60.0
    list_page_size: int = 500
    stale_after_s: float = 120.0
    """Relist when a kind was last known current longer ago than this."""
    resync_every_s: float = 600.0
    """Relist periodically even when the watch looks healthy."""
    backoff_initial_s: float = 0.5
    backoff_max_s: float = 30.0


class WatchExpired(Exception):
    """The watch's resourceVersion is too old (HTTP 410); only a relist recovers."""


class ListWatch(Protocol):
    """One resource kind as a list plus a resumable watch of plain dicts."""

    kind: str

    def list(self) -> tuple[list[Mapping[str, Any]], str]:
        """All objects and the list's resourceVersion."""
        ...

    def watch(self, resource_version: str) -> Iterator[Mapping[str, Any]]:
        """Events {"type", "object"} until the server ends the watch; WatchExpired on 410."""
        ...


def _resource_version(obj: Mapping[str, Any]) -> str | None:
    rv = (obj.get("metadata") or {}).get("resourceVersion")
    return rv if isinstance(rv, str) and rv else None


def watch_until_relist(
    lw: ListWatch,
    store: InventoryStore,
    resource_version: str,
    listed_at_s: float,
    settings: WatchSettings,
    clock: Callable[[], float],
    stop: threading.Event,
) -> str:
    """Follow the watch from `resource_version` until a relist is due; returns why."""
    rv = resource_version
    last_event_s = listed_at_s
    while not stop.is_set():
        for event in lw.watch(rv):
            last_event_s = clock()
            event_type = event.get("type")
            obj = event.get("object") or {}
            if event_type == "ERROR":
                if obj.get("code") == HTTP_GONE:
                    raise WatchExpired(str(obj.get("message", "")))
                raise RuntimeError(f"{lw.kind} watch error: {obj.get('message', obj)}")
            rv = _resource_version(obj) or rv
            if event_type == "BOOKMARK":
                store.mark_fresh(lw.kind)
            else:
                store.apply(lw.kind, str(event_type), obj)
            if stop.is_set():
                return "stopped"
        now_s = clock()
        if now_s - last_event_s > settings.stale_after_s:
            # Not even a bookmark for this long: the stream may be quietly stuck; a relist is cheap.
            return "stale"
        store.mark_fresh(lw.kind)  # the server closed the watch on time: we were current
        if now_s - listed_at_s > settings.resync_every_s:
            return "resync"
    return "stopped"


def run_kind(
    lw: ListWatch,
    store: InventoryStore,
    settings: WatchSettings,
    clock: Callable[[], float],
    stop: threading.Event,
) -> None:
    """List and watch one kind until `stop` is set; errors back off and relist."""
    backoff_s = settings.backoff_initial_s
    while not stop.is_set():
        try:
            items, rv = lw.list()
            store.replace(lw.kind, items)
            log.info("listed %d %s at resourceVersion %s", len(items), lw.kind, rv)
            backoff_s = settings.backoff_initial_s
            why = watch_until_relist(lw, store, rv, clock(), settings, clock, stop)
            log.info("%s: relisting (%s)", lw.kind, why)
        except WatchExpired as exc:
            log.info("%s watch expired, relisting: %s", lw.kind, exc)
        except Exception as exc:  # any API or network failure: relist after a backoff
            log.warning("%s list/watch failed, relisting in %.1fs: %r", lw.kind, backoff_s, exc)
            stop.wait(backoff_s)
            backoff_s = min(backoff_s * 2, settings.backoff_max_s)


class KubeListWatch:
    """ListWatch over the `kubernetes` client's CoreV1Api, returning raw JSON dicts."""

    def __init__(self, api: Any, kind: str, settings: WatchSettings) -> None:
        if kind == NODES:
            self._call, self._selector = api.list_node, ""
        elif kind == PODS:
            self._call, self._selector = api.list_pod_for_all_namespaces, ACTIVE_PODS_SELECTOR
        else:
            raise ValueError(f"unknown kind {kind!r}")
        self.kind = kind
        self._settings = settings

    def list(self) -> tuple[list[Mapping[str, Any]], str]:
        """Every object of the kind, page by page, and the list's resourceVersion."""
        items: list[Mapping[str, Any]] = []
        token: str | None = None
        while True:
            kwargs: dict[str, Any] = {"limit": self._settings.list_page_size}
            if token:
                kwargs["_continue"] = token
            if self._selector:
                kwargs["field_selector"] = self._selector
            resp = self._call(
                _preload_content=False,
                _request_timeout=(self._settings.connect_timeout_s, self._settings.list_timeout_s),
                **kwargs,
            )
            page = json.loads(resp.data)
            items.extend(page.get("items") or ())
            meta = page.get("metadata") or {}
            token = meta.get("continue")
            if not token:
                return items, str(meta.get("resourceVersion", ""))

    def watch(self, resource_version: str) -> Iterator[Mapping[str, Any]]:
        """Raw watch events from `resource_version`; a 410 Gone raises WatchExpired."""
        from kubernetes import client, watch  # the only client import, kept at the edge

        s = self._settings
        kwargs: dict[str, Any] = {
            "resource_version": resource_version,
            "allow_watch_bookmarks": True,
            "timeout_seconds": s.watch_timeout_s,
            "_request_timeout": (s.connect_timeout_s, s.watch_timeout_s + s.read_timeout_margin_s),
            "deserialize": False,
        }
        if self._selector:
            kwargs["field_selector"] = self._selector
        try:
            yield from watch.Watch().stream(self._call, **kwargs)
        except client.ApiException as exc:
            if exc.status == HTTP_GONE:
                raise WatchExpired(str(exc.reason)) from exc
            raise


class Watcher:
    """Runs the Node and Pod loops in daemon threads, plus a staleness watchdog."""

    def __init__(
        self,
        sources: list[ListWatch],
        store: InventoryStore,
        settings: WatchSettings,
        clock: Callable[[], float],
    ) -> None:
        self._sources = sources
        self._store = store
        self._settings = settings
        self._clock = clock
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []

    def start(self) -> None:
        """Start one list/watch daemon thread per source."""
        for lw in self._sources:
            thread = threading.Thread(
                target=run_kind, name=f"gpuplan-watch-{lw.kind}", daemon=True,
                args=(lw, self._store, self._settings, self._clock, self._stop),
            )
            thread.start()
            self._threads.append(thread)

    def stop(self, timeout_s: float = 5.0) -> None:
        """Tell the loops to stop and wait up to `timeout_s` for each thread."""
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout_s)


def kube_watcher(
    api: Any, store: InventoryStore, settings: WatchSettings, clock: Callable[[], float]
) -> Watcher:
    """A Watcher over Nodes and active Pods through a CoreV1Api client."""
    return Watcher([KubeListWatch(api, kind, settings) for kind in (NODES, PODS)],
                   store, settings, clock)


def core_v1_api(kubeconfig: str | None) -> Any:
    """The CoreV1 API client: from `kubeconfig`, else the pod's service account."""
    from kubernetes import client, config

    if kubeconfig:
        return client.CoreV1Api(config.new_client_from_config(config_file=kubeconfig))
    config.load_incluster_config()
    return client.CoreV1Api()
