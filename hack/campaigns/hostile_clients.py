"""Issue #21's hostile-client reproducers against a real `gpuplan serve` (shipped bundle).

    PYTHONPATH=tests:hack .venv/bin/python -m campaigns.hostile_clients     # make abuse

A benchmark, not a test: it prints what happened and asserts nothing.

1. A 64 MB body of `{"inventory": [{}, {}, ...]}`: status, seconds, answer size, the worst
   `/healthz` latency while it is handled, and the service's RSS (all its processes).
2. Two 150k-node graphs from client `team-a`, then five small estimates from `team-b`, with a
   15 s request timeout: statuses and seconds of each, RSS during and after.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import pathlib
import subprocess
import sys
import tempfile
import time
from typing import Any

import aiohttp
from onnx import TensorProto, helper

from gpuplan_testing import operator_harness as h
from gpuplan_testing import processes

CLIENT_HEADER = "X-Gpuplan-Client"
LIGHT_RESNET50 = h.RESNET50


def chain_model(nodes: int) -> bytes:
    """A graph of `nodes` Relus in a row: small on the wire, large to estimate."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 64])
    chain, previous = [], "x"
    for i in range(nodes):
        chain.append(helper.make_node("Relu", [previous], [f"r{i}"]))
        previous = f"r{i}"
    y = helper.make_tensor_value_info(previous, TensorProto.FLOAT, ["batch", 64])
    graph = helper.make_graph(chain, "chain", [x], [y])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]
                             ).SerializeToString()


async def _probe_health(session: aiohttp.ClientSession, url: str, stop: asyncio.Event,
                        worst_s: list[float]) -> None:
    while not stop.is_set():
        start = time.perf_counter()
        async with session.get(f"{url}/healthz", timeout=aiohttp.ClientTimeout(total=60)) as r:
            await r.read()
        worst_s[0] = max(worst_s[0], time.perf_counter() - start)
        await asyncio.sleep(0.05)


async def _post(session: aiohttp.ClientSession, url: str, body: Any, client: str
                ) -> tuple[int, float]:
    start = time.perf_counter()
    async with session.post(f"{url}/v1/estimate", json=body, headers={CLIENT_HEADER: client},
                            timeout=aiohttp.ClientTimeout(total=120)) as resp:
        await resp.read()
        return resp.status, round(time.perf_counter() - start, 2)


async def flood_of_empty_pools(session: aiohttp.ClientSession, url: str, pid: int) -> None:
    entries = (64 * 2**20 - 100) // 3
    body = b'{"model_onnx_b64": "AA==", "inventory": [' + b"{}," * entries + b"{}]}"
    stop, worst = asyncio.Event(), [0.0]
    probe = asyncio.create_task(_probe_health(session, url, stop, worst))
    start = time.perf_counter()
    async with session.post(f"{url}/v1/plans", data=body,
                            timeout=aiohttp.ClientTimeout(total=600)) as resp:
        answer, status = await resp.read(), resp.status
    took = time.perf_counter() - start
    stop.set()
    await probe
    print(f"1. {len(body) / 2**20:.0f} MiB of {{}} pools: {status} in {took:.2f} s, answer "
          f"{len(answer)} bytes, worst /healthz {worst[0] * 1000:.0f} ms, "
          f"RSS {processes.tree_rss_mib(pid):.0f} MiB")


async def large_models_and_small_ones(session: aiohttp.ClientSession, url: str,
                                      pid: int) -> None:
    big = base64.b64encode(chain_model(150_000)).decode()
    small = base64.b64encode(LIGHT_RESNET50.read_bytes()).decode()

    def body(model: str, batch: int) -> dict[str, Any]:
        return {"model_onnx_b64": model, "training": {"batch_size": batch}, "devices": ["t4"]}

    hogs = [asyncio.create_task(_post(session, url, body(big, b), "team-a")) for b in (1, 2)]
    await asyncio.sleep(1.0)
    smalls = await asyncio.gather(*(_post(session, url, body(small, b), "team-b")
                                    for b in range(1, 6)))
    print(f"2. team-b's five small estimates while team-a's two 150k-node graphs run: {smalls}")
    print(f"   team-a's 150k-node graphs: {await asyncio.gather(*hogs)}, "
          f"RSS {processes.tree_rss_mib(pid):.0f} MiB")
    await asyncio.sleep(3)
    print(f"   RSS 3 s later: {processes.tree_rss_mib(pid):.0f} MiB")


async def main_async(port: int, workdir: pathlib.Path) -> None:
    url = f"http://127.0.0.1:{port}"
    gpuplan = pathlib.Path(sys.executable).with_name("gpuplan")
    server = subprocess.Popen(
        [str(gpuplan), "serve", "--port", str(port), "--request-timeout", "15",
         "--db", f"sqlite:///{workdir / 'perf.db'}"],
        stdout=(workdir / "serve.log").open("w"), stderr=subprocess.STDOUT)
    try:
        async with aiohttp.ClientSession() as session:
            for _ in range(240):
                with contextlib.suppress(aiohttp.ClientError):
                    async with session.get(f"{url}/readyz") as resp:
                        if resp.status == 200:
                            break
                await asyncio.sleep(0.5)
            rss = processes.tree_rss_mib(server.pid)
            print(f"service ready, RSS {rss:.0f} MiB (service, forkserver, workers)")
            await flood_of_empty_pools(session, url, server.pid)
            await large_models_and_small_ones(session, url, server.pid)
    finally:
        server.terminate()
        server.wait(30)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="campaigns.hostile_clients", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--port", type=int, default=0)
    args = parser.parse_args(argv)
    workdir = pathlib.Path(tempfile.mkdtemp(prefix="gpuplan-hostile-"))
    asyncio.run(main_async(args.port or h.free_port(), workdir))
    print(f"(service log in {workdir / 'serve.log'})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
