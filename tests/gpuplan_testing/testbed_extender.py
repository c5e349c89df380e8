"""The scheduler extender on the port the testbed's gpuplan-scheduler calls (issue #16).

The testbed starts kube-scheduler's `gpuplan-scheduler` profile with an extender at
`testbed.extender_port`, but no extender: a test that wants its pods placed through it serves
one. `serving(testbed)` starts the real extender (`cli.serve`) in a thread when the port is free,
or uses the one already there when another test session on this testbed serves it (both answer
from the same cluster). `filter_calls(url)` reads its request counter from `/metrics`, so a test
can prove the scheduler asked it.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
import time
import urllib.request
from collections.abc import Iterator
from typing import Any

from prometheus_client import CollectorRegistry

START_TIMEOUT_S = 60.0
HTTP_TIMEOUT_S = 5


def _port_free(port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def _ready(base_url: str) -> bool:
    with contextlib.suppress(OSError), urllib.request.urlopen(
            f"{base_url}/readyz", timeout=HTTP_TIMEOUT_S) as resp:
        return bool(resp.status == 200)
    return False


def filter_calls(base_url: str) -> float:
    """`gpuplan_extender_requests_total{verb="filter",result="ok"}` of the extender at a URL."""
    with urllib.request.urlopen(f"{base_url}/metrics", timeout=HTTP_TIMEOUT_S) as resp:
        text = resp.read().decode()
    total = 0.0
    for line in text.splitlines():
        if (line.startswith("gpuplan_extender_requests_total{") and 'verb="filter"' in line
                and 'result="ok"' in line):
            total += float(line.split()[-1])
    return total


@contextlib.contextmanager
def serving(testbed: Any) -> Iterator[str]:
    """The base URL of an extender on the testbed's extender port, for the `with` block."""
    from gpuplan_operator.extender import cli, watcher

    port = testbed.extender_port
    assert port is not None, "the testbed has no extender port (GPUPLAN_EXTENDER_PORT)"
    base_url = f"http://127.0.0.1:{port}"
    if not _port_free(port):
        deadline = time.monotonic() + START_TIMEOUT_S
        while not _ready(base_url):  # another session's extender, maybe still syncing
            assert time.monotonic() < deadline, f"port {port} is taken by no ready extender"
            time.sleep(0.2)
        yield base_url
        return
    settings = cli.ServeSettings(host="127.0.0.1", port=port, kubeconfig=str(testbed.kubeconfig),
                                 watch=watcher.WatchSettings(watch_timeout_s=20))
    loop = asyncio.new_event_loop()
    stop = asyncio.Event()
    failure: list[BaseException] = []

    async def run_until_stopped() -> None:
        await cli.serve(settings, watcher.core_v1_api(settings.kubeconfig), CollectorRegistry(),
                        stop)

    def run() -> None:
        asyncio.set_event_loop(loop)
        try:
            loop.run_until_complete(run_until_stopped())
        except BaseException as exc:  # reported below
            failure.append(exc)

    thread = threading.Thread(target=run, name="gpuplan-extender-testbed", daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while not _ready(base_url):
            assert not failure, f"extender failed to start: {failure[0]!r}"
            assert time.monotonic() < deadline, "extender not ready (inventory never synced)"
            time.sleep(0.2)
        yield base_url
    finally:
        loop.call_soon_threadsafe(stop.set)
        thread.join(15)
