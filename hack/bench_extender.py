"""Load benchmark of the extender: filter + prioritize over a synthetic 5,000-node inventory.

    python hack/bench_extender.py [--nodes 5000] [--candidates 5000 500]
        [--seconds 10] [--concurrency 1 8] [--server-cpu 0] [--client-cpu 1]

Starts the real aiohttp app in a subprocess (one event loop = one core, pinned to `--server-cpu`
where the OS allows), then drives it over loopback with an aiohttp client pinned to another core.
Each request pair is a filter then a prioritize for one planned pod, with `candidates` node names
(kube-scheduler sends at most the nodes it found feasible; `percentageOfNodesToScore` makes that
~10 % of 5,000). Reports client-side p50/p99 latency per verb and requests/s. Not a test.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web
from prometheus_client import CollectorRegistry

from gpuplan_operator.extender.core import plans, protocol, scoring

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # a script, not a test
from gpuplan_operator.extender.app import make_app
from gpuplan_operator.extender.core.snapshot import Snapshot, build_snapshot
from gpuplan_testing import extender_builders as builders

POOLS = (("NVIDIA-H100-80GB-HBM3", 8, 0.4), ("NVIDIA-A100-SXM4-80GB", 8, 0.3),
         ("NVIDIA-L4", 4, 0.3))
PLANNED = "NVIDIA-H100-80GB-HBM3"


def synthetic_cluster(n_nodes: int, random_state: int) -> tuple[list[dict[str, Any]],
                                                                 list[dict[str, Any]]]:
    """Nodes from POOLS with random GPU pods bound to half of them (deterministic per seed)."""
    rng = random.Random(random_state)
    nodes: list[dict[str, Any]] = []
    pods: list[dict[str, Any]] = []
    for i in range(n_nodes):
        product, gpus, _ = rng.choices(POOLS, weights=[p[2] for p in POOLS])[0]
        name = f"node-{i:05d}"
        nodes.append(builders.make_node(name, product, gpus))
        if rng.random() < 0.5:
            used = rng.randint(1, gpus)
            pods.append(builders.make_pod(f"p-{i}", gpus=used, node_name=name, phase="Running"))
    return nodes, pods


class FixedSource:
    def __init__(self, snapshot: Snapshot) -> None:
        self._snapshot = snapshot

    def snapshot(self) -> Snapshot | None:
        return self._snapshot

    def age_s(self) -> float | None:
        return 0.0


def serve(port: int, n_nodes: int, random_state: int, cpu: int | None) -> None:
    if cpu is not None and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {cpu})
    nodes, pods = synthetic_cluster(n_nodes, random_state)
    app = make_app(FixedSource(build_snapshot(nodes, pods, 0.0)), CollectorRegistry())
    web.run_app(app, host="127.0.0.1", port=port, access_log=None, print=None)


@dataclass(frozen=True)
class Result:
    candidates: int
    concurrency: int
    requests: int
    seconds: float
    p50_ms: dict[str, float]
    p99_ms: dict[str, float]

    @property
    def requests_per_s(self) -> float:
        return self.requests / self.seconds


def _quantile_ms(samples: Sequence[float], q: float) -> float:
    ordered = sorted(samples)
    return 1000.0 * ordered[min(int(q * len(ordered)), len(ordered) - 1)]


async def load(base_url: str, body: bytes, concurrency: int, seconds: float,
               candidates: int) -> Result:
    latencies: dict[str, list[float]] = {"filter": [], "prioritize": []}
    timeout = aiohttp.ClientTimeout(total=10)
    headers = {"Content-Type": "application/json"}
    async with aiohttp.ClientSession(timeout=timeout) as session:
        deadline = time.perf_counter() + seconds

        async def worker() -> None:
            while time.perf_counter() < deadline:
                for verb in ("filter", "prioritize"):
                    started = time.perf_counter()
                    async with session.post(f"{base_url}/extender/{verb}", data=body,
                                            headers=headers) as resp:
                        await resp.read()
                        if resp.status != 200:
                            raise RuntimeError(f"{verb}: HTTP {resp.status}")
                    latencies[verb].append(time.perf_counter() - started)

        started = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        elapsed = time.perf_counter() - started
    return Result(
        candidates=candidates, concurrency=concurrency,
        requests=sum(len(v) for v in latencies.values()), seconds=elapsed,
        p50_ms={k: _quantile_ms(v, 0.50) for k, v in latencies.items()},
        p99_ms={k: _quantile_ms(v, 0.99) for k, v in latencies.items()},
    )


def in_process(snapshot: Snapshot, body: bytes, repeats: int) -> dict[str, float]:
    """The request path without HTTP (parse → plan → decide → serialise), timed per verb.

    CPU time per request does not depend on what else runs on the machine, so it gives the
    one-core capacity (1000 / cpu_ms requests/s) even on a busy host."""
    resolve = plans.resolve_gfd_only
    out: dict[str, float] = {}
    for verb in ("filter", "prioritize"):
        walls: list[float] = []
        cpu_started = time.process_time()
        for _ in range(repeats):
            started = time.perf_counter()
            args = protocol.parse_args(json.loads(body))
            plan = plans.plan_for_pod(args.pod, resolve)
            assert plan is not None
            if verb == "filter":
                protocol.dumps_filter_result(scoring.filter_nodes(snapshot, plan, args.node_names),
                                             args)
            else:
                protocol.dumps_priorities(scoring.prioritize(snapshot, plan, args.node_names))
            walls.append(time.perf_counter() - started)
        out[f"{verb}_cpu_ms"] = 1000.0 * (time.process_time() - cpu_started) / repeats
        out[f"{verb}_p50_ms"] = _quantile_ms(walls, 0.5)
        out[f"{verb}_p99_ms"] = _quantile_ms(walls, 0.99)
    return out


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


async def _wait_ready(base_url: str, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=2)) as session:
        while time.monotonic() < deadline:
            with contextlib.suppress(aiohttp.ClientError, OSError, asyncio.TimeoutError):
                async with session.get(f"{base_url}/readyz") as resp:
                    if resp.status == 200:
                        return
            await asyncio.sleep(0.2)
    raise RuntimeError(f"benchmark server at {base_url} not ready after {timeout_s}s")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python hack/bench_extender.py")
    parser.add_argument("--nodes", type=int, default=5000)
    parser.add_argument("--candidates", type=int, nargs="+", default=[5000, 500])
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--random-state", type=int, default=0)
    parser.add_argument("--server-cpu", type=int, default=0)
    parser.add_argument("--client-cpu", type=int, default=1)
    parser.add_argument("--serve", type=int, metavar="PORT", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.serve:
        serve(args.serve, args.nodes, args.random_state, args.server_cpu)
        return 0
    if not 1 <= args.nodes <= 100_000 or max(args.candidates) > args.nodes:
        parser.error("--nodes must be 1..100000 and every --candidates at most --nodes")
    port = _free_port()
    server = subprocess.Popen([sys.executable, __file__,
                               "--serve", str(port), "--nodes", str(args.nodes),
                               "--random-state", str(args.random_state),
                               "--server-cpu", str(args.server_cpu)])
    try:
        if hasattr(os, "sched_setaffinity"):
            os.sched_setaffinity(0, {args.client_cpu})
        base_url = f"http://127.0.0.1:{port}"
        asyncio.run(_wait_ready(base_url))
        pod = builders.make_pod("bench", gpus=2, gpu_type=PLANNED)
        print(f"inventory {args.nodes} nodes; pod wants 2 x {PLANNED}; {args.seconds:.0f} s/run")
        nodes, pods = synthetic_cluster(args.nodes, args.random_state)
        snapshot = build_snapshot(nodes, pods, 0.0)
        print("in process (no HTTP): candidates, then per verb CPU ms/request and wall p50/p99 ms")
        for candidates in args.candidates:
            names = [f"node-{i:05d}" for i in range(candidates)]
            body = json.dumps(builders.extender_args(pod, names)).encode()
            t = in_process(snapshot, body, repeats=200)
            print(f"{candidates:>10}  filter cpu {t['filter_cpu_ms']:.2f}  "
                  f"p50/p99 {t['filter_p50_ms']:.2f}/{t['filter_p99_ms']:.2f}   "
                  f"prioritize cpu {t['prioritize_cpu_ms']:.2f}  "
                  f"p50/p99 {t['prioritize_p50_ms']:.2f}/{t['prioritize_p99_ms']:.2f}")
        print("over HTTP (loopback, aiohttp client):")
        print("candidates conc  requests  req/s   filter p50/p99 ms   prioritize p50/p99 ms")
        for candidates in args.candidates:
            names = [f"node-{i:05d}" for i in range(candidates)]
            body = json.dumps(builders.extender_args(pod, names)).encode()
            for concurrency in args.concurrency:
                r = asyncio.run(load(base_url, body, concurrency, args.seconds, candidates))
                print(f"{r.candidates:>10} {r.concurrency:>4} {r.requests:>9} "
                      f"{r.requests_per_s:>6.0f}   {r.p50_ms['filter']:>6.2f} / "
                      f"{r.p99_ms['filter']:>6.2f}     {r.p50_ms['prioritize']:>6.2f} / "
                      f"{r.p99_ms['prioritize']:>6.2f}")
    finally:
        server.terminate()
        server.wait(10)
    return 0


if __name__ == "__main__":
    sys.exit(main())
