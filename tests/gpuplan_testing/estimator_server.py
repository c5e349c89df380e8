"""The real estimator service (`interfaces.http.service`) on 127.0.0.1 in a background thread.

Integration tests of the operator talk to it over HTTP exactly as in a cluster; the service runs
the real graph parser, estimator and planner with the shipped model bundle, and stores job
outcomes in a real SQLite performance database (empty at start; `GET /v1/coverage` reads it).
Requests to `/v1/plans` are recorded so tests can assert what the operator sent.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pandas as pd
import requests
from aiohttp import web

from gpuplan_estimator.interfaces.cli import plans, serving
from gpuplan_estimator.interfaces.http import service
from gpuplan_estimator.perfdb import PerfStore

Handler = Any


class EstimatorServer:
    """`gpuplan serve` in-process; `port=0` picks a free port."""

    def __init__(self, port: int = 0, catalog_file: str | None = None) -> None:
        self.port = port
        self.catalog_file = catalog_file  # `gpuplan serve --catalog`: the user's own GPUs
        self.requests: list[dict[str, Any]] = []
        self._dir = tempfile.TemporaryDirectory(prefix="gpuplan-perfdb-")
        self.db_url = f"sqlite:///{Path(self._dir.name) / 'perf.db'}"
        self._loop = asyncio.new_event_loop()
        self._runner: web.AppRunner | None = None
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @web.middleware
    async def _record(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.path == "/v1/plans":
            self.requests.append(json.loads(await request.read()))
        response: web.StreamResponse = await handler(request)
        return response

    async def _start(self) -> None:
        state = service.ServiceState(functools.partial(plans.load_context, None, None,
                                                       self.catalog_file))
        app = service.make_app(state, service.ServiceSettings(bundle_poll_s=3600),
                               outcome_sink=serving.perfdb_outcome_sink(self.db_url),
                               coverage_source=serving.perfdb_coverage_source(self.db_url),
                               outcome_history=serving.perfdb_outcome_history(self.db_url))
        app.middlewares.insert(0, self._record)
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", self.port)
        await site.start()
        self.port = self._runner.addresses[0][1]

    def start(self) -> EstimatorServer:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(timeout=60)
        return self

    def outcomes(self) -> pd.DataFrame:
        """Job outcomes the operator reported, as stored in the performance database."""
        return PerfStore.open(self.db_url).job_outcomes()

    def stop(self) -> None:
        if self._runner is not None:
            asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result(timeout=30)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)
        self._dir.cleanup()


@contextlib.contextmanager
def serve_process(argv: list[str], port: int, log_path: Path, *, ready_timeout_s: float,
                  env: dict[str, str] | None = None) -> Iterator[str]:
    """`gpuplan serve` (`argv`, listening on 127.0.0.1:`port`) as a process: yields its URL
    once `/readyz` answers 200; terminated (killed if it lingers) on exit, its log kept at
    `log_path` for assertion messages."""
    with log_path.open("wb") as log:
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env)
        url = f"http://127.0.0.1:{port}"
        try:
            deadline = time.monotonic() + ready_timeout_s
            while True:
                assert proc.poll() is None, log_path.read_text()[-3000:]
                assert time.monotonic() < deadline, \
                    f"gpuplan serve not ready in {ready_timeout_s:.0f} s"
                try:
                    if requests.get(f"{url}/readyz", timeout=2).status_code == 200:
                        break
                except (requests.ConnectionError, requests.Timeout):
                    pass  # the port opens before the bundle loads (#33), which may stall it
                time.sleep(0.5)
            yield url
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)
