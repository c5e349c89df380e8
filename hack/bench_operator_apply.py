"""Benchmark (not a test): apply 50 TrainingJobs at once, report apply→planned p50/p95 and total.

    .venv/bin/python hack/bench_operator_apply.py [--jobs 50]

Uses the local testbed (reuses a running one, else starts it and stops it afterwards), the real
operator under KopfRunner and the real estimator service
(tests/gpuplan_testing/estimator_server.py). Times are wall-clock on this machine, measured
client-side: from the create call returning to the first observation of `Estimated=True`
(and `Launched=True` for the total).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import os
import pathlib
import statistics
import sys
import time
import uuid
from typing import Any

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "testbed"), str(ROOT / "tests")]  # a script: the test helpers

import gpuplan_testbed as runner  # noqa: E402
import pytest  # noqa: E402
from kubernetes import client, config  # noqa: E402
from testbed_pytest import Kubectl  # noqa: E402

from gpuplan_testing import operator_harness as h  # noqa: E402
from gpuplan_testing.estimator_server import EstimatorServer  # noqa: E402


def _status_flags(tj: dict[str, Any]) -> tuple[bool, bool]:
    conds = {c["type"]: c["status"] for c in tj.get("status", {}).get("conditions", [])}
    return conds.get("Estimated") == "True", conds.get("Launched") == "True"


def run(jobs: int, state: dict[str, Any]) -> dict[str, float]:
    os.environ["KUBECONFIG"] = state["kubeconfig"]
    api = config.new_client_from_config(config_file=state["kubeconfig"])
    core = client.CoreV1Api(api)
    h.install_crd(Kubectl(pathlib.Path(state["kubectl"]), pathlib.Path(state["kubeconfig"])))
    ns = f"bench-{uuid.uuid4().hex[:6]}"
    core.create_namespace({"metadata": {"name": ns}}, _request_timeout=30)
    tjs = h.TrainingJobs(api, ns)
    h.create_model_configmap(core, ns)
    est = EstimatorServer().start()
    created: dict[str, float] = {}
    planned: dict[str, float] = {}
    launched: dict[str, float] = {}
    try:
        with pytest.MonkeyPatch.context() as mp, h.run_operator(mp, ns, est.url):
            time.sleep(2)  # let the operator start watching
            t0 = time.monotonic()

            def create(i: int) -> None:
                tjs.create(h.trainingjob(f"bench-{i:03d}", succeed_after="600s"))
                created[f"bench-{i:03d}"] = time.monotonic()

            with concurrent.futures.ThreadPoolExecutor(16) as pool:
                list(pool.map(create, range(jobs)))
            deadline = time.monotonic() + 600
            while len(launched) < jobs and time.monotonic() < deadline:
                items = tjs.api.list_namespaced_custom_object(
                    h.G, h.V, ns, h.P, _request_timeout=30)["items"]
                now = time.monotonic()
                for tj in items:
                    name = tj["metadata"]["name"]
                    est_ok, launch_ok = _status_flags(tj)
                    if est_ok:
                        planned.setdefault(name, now)
                    if launch_ok:
                        launched.setdefault(name, now)
                time.sleep(0.1)
            total = max(launched.values()) - t0 if launched else float("nan")
    finally:
        est.stop()
        core.delete_namespace(ns, _request_timeout=30)
    lat = sorted(planned[n] - created[n] for n in planned)
    return {
        "jobs": jobs, "planned": len(planned), "launched": len(launched),
        "p50_s": statistics.median(lat), "p95_s": lat[max(0, int(0.95 * len(lat)) - 1)],
        "max_s": lat[-1], "total_s": total, "estimator_requests": len(est.requests),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=50)
    args = parser.parse_args()
    settings = runner.Settings(bin_dir=runner.default_bin_dir())
    state = runner.up(settings)
    try:
        result = run(args.jobs, state)
    finally:
        if not state.get("reused"):
            runner.down(runner.Layout(settings.state_dir))
    print(" ".join(f"{k}={v:.2f}" if isinstance(v, float) else f"{k}={v}"
                   for k, v in result.items()))


if __name__ == "__main__":
    main()
