"""Issue #33's three-tenant campaign against the estimator service, at reduced scale.

    PYTHONPATH=tests:hack .venv/bin/python -m campaigns.tenants [--postgres]   # make abuse

A benchmark, not a test: it prints what happened and asserts nothing. The real service
(`service.make_app`: intake, fair queue, worker processes, SQLite or PostgreSQL) runs in this
process behind a local TokenReview server (`gpuplan_testing.tokenreviews`) that knows three
tokens: the operator's projected token for `gpuplan-estimator`, the same account's ordinary
token (what a pod's mount or a Job's environment could leak) and a tenant's own. Plans use the
roofline predictor, so the figures measure admission and queueing, not the bundle.

1. Quiet run: after a warm-up run, tenants team-a and team-b each plan `--plans` small models
   through the operator's identity (batch sizes no other run uses: no cached answers); p95 of
   each request's seconds.
2. The same beside a hostile team-c: `--bodies` concurrent large plan bodies under the
   operator's identity (its TrainingJobs), the same with no token and team-a's name in the
   client header, and forged outcome posts (no token, the tenant's token, the leaked ordinary
   token, a header naming the operator): p95 of the quiet tenants, statuses of the hostile
   requests, forged writes accepted, calibration factors before and after.
3. Outcomes posted by the operator: `--outcomes` per quiet tenant at 1.2x the estimate, then
   `--hostile-outcomes` of team-c's jobs at 3x (they really ran slow: the operator posts them,
   with team-c's namespace). The GPU type's factor before and after the flood, against the
   stated bound (`calibrating.tenant_factor_range`, docs/security.md#calibration).
4. A restart of the service on the same database: the calibration's outcome count before and
   after.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import math
import pathlib
import statistics
import sys
import tempfile
import time
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from typing import Any

import aiohttp
from aiohttp import web
from prometheus_client import CollectorRegistry

from gpuplan_estimator.interfaces.cli import serving
from gpuplan_estimator.interfaces.http import service
from gpuplan_estimator.planning import calibrating
from gpuplan_testing import contexts, postgres_server
from gpuplan_testing import operator_harness as h
from gpuplan_testing import tokenreviews as tr

AUDIENCE = "gpuplan-estimator"
CLIENT_HEADER = "X-Gpuplan-Client"
TOKENS = {"operator-projected": tr.OPERATOR, "operator-ordinary": tr.OPERATOR,
          "tenant-token": tr.TENANT}
MODEL_B64 = base64.b64encode(h.RESNET50.read_bytes()).decode()
L4 = {"gpu_type": "NVIDIA-L4", "gpus_per_node": 4, "nodes": 1, "free_gpus": 4}


def plan_body(batch: int) -> dict[str, Any]:
    return {"model_onnx_b64": MODEL_B64, "inventory": [L4],
            "training": {"batch_size": batch, "dataset_size": 1000, "optimizer": "sgd"},
            "objective": {"prefer": "cheapest", "max_gpus": 4}}


ESTIMATED_S = 100.0
HONEST_RATIO = 1.2
HOSTILE_RATIO = 3.0


def outcome(uid: str, actual_s: float = 340.0, namespace: str = "") -> dict[str, Any]:
    return {"job_uid": uid, "gpu_type": "Tesla T4", "gpu_count": 1,
            "estimated_seconds": ESTIMATED_S, "actual_seconds": actual_s,
            "calibration_factor": 1.0, **({"namespace": namespace} if namespace else {})}


def headers(token: str | None, tenant: str | None) -> dict[str, str]:
    out = {"Authorization": f"Bearer {token}"} if token else {}
    return {**out, **({CLIENT_HEADER: tenant} if tenant else {})}


@contextlib.asynccontextmanager
async def estimator(db_url: str, api_url: str) -> AsyncIterator[str]:
    """The service with the chart's limits (two workers here: this machine is small)."""
    app = service.make_app(
        service.ServiceState(contexts.roofline_context),
        service.ServiceSettings(bundle_poll_s=3600, workers=2, running_per_client=1,
                                request_timeout_s=60),
        CollectorRegistry(), outcome_sink=serving.perfdb_outcome_sink(db_url),
        outcome_history=serving.perfdb_outcome_history(db_url),
        write_guard=tr.guard_for(api_url, audiences=(AUDIENCE,)))
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    url = f"http://127.0.0.1:{runner.addresses[0][1]}"
    async with aiohttp.ClientSession() as session:
        for _ in range(600):
            with contextlib.suppress(aiohttp.ClientError):
                async with session.get(f"{url}/readyz") as resp:
                    if resp.status == 200:
                        break
            await asyncio.sleep(0.2)
    try:
        yield url
    finally:
        await runner.cleanup()


async def timed_plans(session: aiohttp.ClientSession, url: str, tenant: str, count: int,
                      first_batch: int) -> list[float]:
    seconds = []
    for i in range(count):
        start = time.perf_counter()
        async with session.post(f"{url}/v1/plans", json=plan_body(first_batch + i),
                                headers=headers("operator-projected", tenant)) as resp:
            await resp.read()
        seconds.append(time.perf_counter() - start)
    return seconds


def p95(values: list[float]) -> float:
    return statistics.quantiles(values, n=20)[-1] if len(values) > 1 else values[0]


async def quiet_load(session: aiohttp.ClientSession, url: str, plans: int,
                     first_batch: int) -> float:
    """p95 of the quiet tenants' plans, batch sizes from `first_batch` on: each run's own, so
    no run is answered from an earlier one's cache."""
    runs = await asyncio.gather(*(timed_plans(session, url, t, plans, first_batch + 50 * k)
                                  for k, t in enumerate(("team-a", "team-b"))))
    return p95([s for run in runs for s in run])


async def large_body(session: aiohttp.ClientSession, url: str, size_bytes: int,
                     hdrs: dict[str, str]) -> int:
    body = b'{"model_onnx_b64": "' + b"A" * size_bytes + b'"}'
    async with session.post(f"{url}/v1/plans", data=body, headers=hdrs) as resp:
        await resp.read()
        return resp.status


async def forged_writes(session: aiohttp.ClientSession, url: str, per_kind: int) -> Counter[str]:
    kinds = {"no token": headers(None, None),
             "tenant's own token": headers("tenant-token", None),
             "operator's ordinary token (leaked from a pod)": headers("operator-ordinary", None),
             "no token, header naming the operator": {**headers(None, "gpuplan-operator")}}
    statuses: Counter[str] = Counter()
    for kind, hdrs in kinds.items():
        for i in range(per_kind):
            async with session.post(f"{url}/v1/outcomes", json=outcome(f"forged-{kind}-{i}"),
                                    headers=hdrs) as resp:
                statuses[f"{kind}: {resp.status}"] += 1
    return statuses


async def calibration(session: aiohttp.ClientSession, url: str) -> dict[str, Any]:
    async with session.get(f"{url}/v1/models") as resp:
        return dict((await resp.json())["calibration"])


async def hostile(session: aiohttp.ClientSession, url: str, bodies: int, body_bytes: int
                  ) -> tuple[Counter[int], Counter[str]]:
    as_operator = headers("operator-projected", "team-c")
    spoofing = headers(None, "team-a")
    results = await asyncio.gather(
        *(large_body(session, url, body_bytes, as_operator) for _ in range(bodies)),
        *(large_body(session, url, body_bytes, spoofing) for _ in range(bodies)))
    forged = await forged_writes(session, url, 10)
    return Counter(results), forged


async def post_outcomes(session: aiohttp.ClientSession, url: str, namespace: str, count: int,
                        ratio: float) -> str:
    """`count` outcomes of `namespace`'s jobs posted by the operator; the device key."""
    device = ""
    for i in range(count):
        body = outcome(f"{namespace}-{i}", ESTIMATED_S * ratio, namespace)
        async with session.post(f"{url}/v1/outcomes", json=body,
                                headers=headers("operator-projected", namespace)) as resp:
            assert resp.status in (200, 201), await resp.text()
            device = str((await resp.json())["device"])
    return device


async def calibration_flood(session: aiohttp.ClientSession, url: str, args: argparse.Namespace
                            ) -> tuple[float, float, tuple[float, float]]:
    """The GPU type's factor from the quiet tenants' outcomes, after team-c's flood, and the
    range the stated bound allows it."""
    for tenant in ("team-a", "team-b"):
        device = await post_outcomes(session, url, tenant, args.outcomes, HONEST_RATIO)
    key = f"{device}/train"
    honest = (await calibration(session, url))["factors"][key]
    await post_outcomes(session, url, "team-c", args.hostile_outcomes, HOSTILE_RATIO)
    flooded = (await calibration(session, url))["factors"][key]
    bound = calibrating.tenant_factor_range([math.log(HONEST_RATIO)] * 2 * args.outcomes, 3)
    return honest, flooded, bound


async def campaign(db_url: str, args: argparse.Namespace) -> None:
    fake = tr.FakeApiServer(users=dict(TOKENS), token_audiences={
        "operator-projected": (AUDIENCE,), "tenant-token": (AUDIENCE,)})
    async with tr.serving(fake) as api, aiohttp.ClientSession() as session:
        async with estimator(db_url, api.url) as url:
            await quiet_load(session, url, args.plans, 1)  # the workers' first plans: warm-up
            quiet_p95 = await quiet_load(session, url, args.plans, 100)
            before = await calibration(session, url)
            attacked, (statuses, forged) = await asyncio.gather(
                quiet_load(session, url, args.plans, 200),
                hostile(session, url, args.bodies, args.body_mib * 2**20))
            after = await calibration(session, url)
            honest, flooded, (low, high) = await calibration_flood(session, url, args)
            stored = (await calibration(session, url))["outcomes"]
        async with estimator(db_url, api.url) as url:
            restarted = (await calibration(session, url))["outcomes"]
    accepted = sum(n for k, n in forged.items() if k.endswith(": 201"))
    print(f"database: {db_url.split('@')[-1]}")
    print(f"quiet tenants' plan p95: {quiet_p95:.3f} s alone, {attacked:.3f} s beside the "
          f"hostile tenant ({attacked / quiet_p95:.2f}x)")
    print(f"hostile large bodies ({args.bodies} as the operator for team-c, {args.bodies} "
          f"spoofing team-a, {args.body_mib} MiB each): statuses {dict(statuses)}")
    print(f"forged outcome posts: {dict(forged)}; accepted {accepted}")
    print(f"calibration before {before['factors']} ({before['outcomes']} outcomes), after the "
          f"attack {after['factors']} ({after['outcomes']} outcomes)")
    within = "within" if low <= flooded <= high else "BEYOND"
    print(f"calibration moved by team-c's {args.hostile_outcomes} outcomes at "
          f"{HOSTILE_RATIO}x: factor {honest:.4f} (team-a, team-b: {args.outcomes} each at "
          f"{HONEST_RATIO}x) -> {flooded:.4f}, {within} the stated bound [{low:.4f}, {high:.4f}]"
          f" (max namespace share {calibrating.CalibrationSettings.max_namespace_share})")
    print(f"operator outcomes stored {stored}, after a restart of the service {restarted}")


@contextlib.contextmanager
def database(postgres: bool, workdir: pathlib.Path, name: str = "campaign") -> Iterator[str]:
    """A SQLite file in `workdir`, or database `name` on a private PostgreSQL server."""
    if not postgres:
        yield f"sqlite:///{workdir / 'perf.db'}"
        return
    with postgres_server.running_server() as server:
        yield postgres_server.create_database(server, name)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="campaigns.tenants", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--plans", type=int, default=20, help="plans per quiet tenant")
    parser.add_argument("--bodies", type=int, default=8, help="large bodies per hostile kind")
    parser.add_argument("--body-mib", type=int, default=48, help="size of a large body")
    parser.add_argument("--outcomes", type=int, default=20,
                        help="outcomes per quiet tenant (posted by the operator)")
    parser.add_argument("--hostile-outcomes", type=int, default=1000,
                        help="outcomes of the hostile tenant's slow jobs")
    parser.add_argument("--postgres", action="store_true",
                        help="PostgreSQL (tests/gpuplan_testing/postgres_server) for SQLite")
    args = parser.parse_args(argv)
    workdir = pathlib.Path(tempfile.mkdtemp(prefix="gpuplan-tenants-"))
    with database(args.postgres, workdir) as url:
        asyncio.run(campaign(url, args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
