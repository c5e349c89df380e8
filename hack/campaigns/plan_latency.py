"""Apply→planned latency of concurrent TrainingJobs on the testbed (issue #21, item 6).

    PYTHONPATH=tests:testbed:hack .venv/bin/python -m campaigns.plan_latency --jobs 50
    make bench-plans

A benchmark, not a test: it prints a table and asserts nothing. On a private testbed it runs the
real estimator (`gpuplan serve`, shipped bundle) and the real operator as child processes,
creates `--jobs` TrainingJobs at once from as many threads, and times, per TrainingJob, from the
return of its create call to the first watch event whose status carries condition
`Estimated=True` (the plan is written). It also reports how many plan requests the estimator
served and how many of them it computed, shared with an identical request in flight or answered
from its cache, and the estimator's CPU seconds. `--distinct` gives every TrainingJob its own
batch size, so no two plan requests are alike (the worst case for the cache).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import pathlib
import statistics
import sys
import tempfile
import threading
import time
import urllib.request
from dataclasses import dataclass
from typing import Any

from kubernetes import client, watch
from prometheus_client.parser import text_string_to_metric_families

from campaigns import chaos
from gpuplan_testing import operator_harness as h
from gpuplan_testing import processes

_HTTP_TIMEOUT_S = 30


@dataclass(frozen=True)
class Result:
    """Latencies (s) of every TrainingJob that got a plan, and what the estimator did."""
    jobs: int
    latencies_s: list[float]
    estimator_samples: dict[str, float]
    estimator_cpu_s: float
    wall_s: float

    def table(self) -> str:
        lat = sorted(self.latencies_s)
        quantiles = statistics.quantiles(lat, n=100, method="inclusive") if len(lat) > 1 else lat
        p50, p95 = (quantiles[49], quantiles[94]) if len(lat) > 1 else (lat[0], lat[0])
        rows = [
            ("TrainingJobs created / planned", f"{self.jobs} / {len(lat)}"),
            ("apply->planned p50 s", f"{p50:.3f}"),
            ("apply->planned p95 s", f"{p95:.3f}"),
            ("apply->planned max s", f"{lat[-1]:.3f}"),
            *((f"estimator {k}", f"{v:g}") for k, v in sorted(self.estimator_samples.items())),
            ("estimator CPU s (service + workers)", f"{self.estimator_cpu_s:.2f}"),
            ("wall s", f"{self.wall_s:.1f}"),
        ]
        width = max(len(k) for k, _ in rows)
        return "\n".join(f"{k:<{width}}  {v}" for k, v in rows)


def _estimator_samples(url: str) -> dict[str, float]:
    with urllib.request.urlopen(f"{url}/metrics", timeout=_HTTP_TIMEOUT_S) as resp:
        text = resp.read().decode()
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "gpuplan_estimator_http_requests_total" and \
                    sample.labels.get("endpoint") == "/v1/plans":
                out[f"/v1/plans {sample.labels['code']}"] = sample.value
            if sample.name == "gpuplan_estimator_answers_total":
                out[f"answers {sample.labels['source']}"] = sample.value
    return out


def is_planned(obj: dict[str, Any]) -> bool:
    for c in (obj.get("status") or {}).get("conditions") or []:
        if c.get("type") == "Estimated" and c.get("status") == "True":
            return True
    return False


def measure(api: client.ApiClient, namespace: str, jobs: int, distinct: bool,
            timeout_s: float) -> tuple[int, list[float], float]:
    """Create `jobs` TrainingJobs at once; apply→planned seconds of each that got a plan."""
    custom = client.CustomObjectsApi(api)
    created: dict[str, float] = {}
    planned: dict[str, float] = {}
    stop = threading.Event()

    def watcher() -> None:
        w = watch.Watch()
        while not stop.is_set():
            for event in w.stream(custom.list_namespaced_custom_object, h.G, h.V, namespace,
                                  h.P, timeout_seconds=5, _request_timeout=10):
                obj = event["object"]
                name = obj["metadata"]["name"]
                if name not in planned and is_planned(obj):
                    planned[name] = time.monotonic()
                if stop.is_set():
                    break

    thread = threading.Thread(target=watcher, daemon=True)
    thread.start()
    time.sleep(1.0)  # the watch is open before the first create

    def create(i: int) -> None:
        body = h.trainingjob(f"lat-{i:03d}")
        if distinct:
            body["spec"]["training"]["batchSize"] = 64 + i
        custom.create_namespaced_custom_object(h.G, h.V, namespace, h.P, body,
                                               _request_timeout=_HTTP_TIMEOUT_S)
        created[body["metadata"]["name"]] = time.monotonic()

    start = time.monotonic()
    with concurrent.futures.ThreadPoolExecutor(max_workers=jobs) as pool:
        list(pool.map(create, range(jobs)))
    while len(planned) < jobs and time.monotonic() - start < timeout_s:
        time.sleep(0.2)
    stop.set()
    wall = time.monotonic() - start
    return len(created), [planned[n] - created[n] for n in created if n in planned], wall


def run(state: dict[str, Any], jobs: int, distinct: bool, workdir: pathlib.Path,
        timeout_s: float) -> Result:
    with chaos.scratch_namespace(state, "plan-latency") as (api, kubeconfig, namespace):
        h.create_model_configmap(client.CoreV1Api(api), namespace)
        estimator = chaos.Estimator(workdir)
        operator = chaos.Operator(workdir, namespace, kubeconfig, estimator.url)
        try:
            estimator.start()
            _until(estimator.ready, 300, "estimator ready")
            operator.start()
            _until(operator.started, 120, "operator started")
            assert estimator.proc is not None
            cpu_before = processes.tree_cpu_seconds(estimator.proc.pid)
            count, latencies, wall = measure(api, namespace, jobs, distinct, timeout_s)
            cpu = processes.tree_cpu_seconds(estimator.proc.pid) - cpu_before
            return Result(count, latencies, _estimator_samples(estimator.url), cpu, wall)
        finally:
            operator.stop()
            estimator.stop()


def _until(predicate: Any, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: not within {timeout_s} s")
        time.sleep(0.5)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="campaigns.plan_latency", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=int, default=50)
    parser.add_argument("--distinct", action="store_true",
                        help="a different batch size per TrainingJob (no shared answers)")
    parser.add_argument("--timeout", type=float, default=600.0, metavar="SECONDS")
    parser.add_argument("--state-dir", type=pathlib.Path,
                        default=pathlib.Path(tempfile.gettempdir()) / "gpuplan-latency-testbed")
    args = parser.parse_args(argv)
    workdir = pathlib.Path(tempfile.mkdtemp(prefix="gpuplan-plan-latency-"))
    with chaos.private_testbed(args.state_dir) as state:
        result = run(state, args.jobs, args.distinct, workdir, args.timeout)
    print(result.table())
    print(f"(logs in {workdir})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
