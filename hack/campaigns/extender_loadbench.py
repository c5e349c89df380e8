"""Load benchmark of the scheduler extender (`make bench-extender`): reported, not asserted.

    PYTHONPATH=tests:hack python -m campaigns.extender_loadbench [--nodes 5000]
        [--candidates 500 5000] [--seconds 10] [--churn-per-s 10] [--nice -10]
        [--json out.json] [--profile extender.prof]

Three processes, so the load generator never shares an interpreter (or a GIL) with the server:

* a **fake kube-apiserver** (aiohttp, this module with `--serve-apiserver`): lists `--nodes`
  realistic v1.Node objects (GFD labels, conditions, images, taints: ~5 KB each) in pages of 500
  as the real one does, and the GPU pods bound to half of them; serves watches with bookmarks and,
  on the pod watch, `--churn-per-s` pod ADDED/DELETED events per second (pods binding and
  finishing), so the extender's inventory keeps changing under the load as it does in a cluster;
* **the extender**: the production entry point (`gpuplan_operator.extender.cli.main`, as
  `python -m gpuplan_operator.extender --kubeconfig …` runs it) pinned to `--server-cpu`. Its
  watcher lists and watches the fake apiserver through the `kubernetes` client exactly as against
  a real cluster. The only addition (`--serve-extender`) is a probe of each request's CPU time;
* **this process**, the load generator (pinned to `--client-cpu`): one keep-alive HTTP/1.1
  connection (kube-scheduler schedules one pod at a time, so its extender calls are sequential),
  alternating filter and prioritize requests for planned pods with `--candidates` node names each
  (a random sample of the inventory, different per request body), and timing each request from
  send to last byte received. Its own garbage collector is frozen and off while it measures.

Reported per candidate count and verb: client-side latency p50/p95/p99/max; the CPU time of the
extender's event-loop thread per request (p50/p99/max, from the probe: the extender's own work,
which does not grow when the host makes it wait for a core); the whole server process's CPU
seconds per request (utime + stime from /proc/<pid>/stat, watch threads and churn included); and
how long the event-loop thread waited on the run queue per request (/proc/<pid>/schedstat) — on a
shared host that wait, not the extender, is the latency tail. `--nice -10` (root) gives the
extender and the load generator priority over the rest of a busy host.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import http.client
import json
import os
import platform
import random
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from gpuplan_testing import processes as proc

GPU = "nvidia.com/gpu"
PRODUCT = "nvidia.com/gpu.product"
# (pool, GFD product, GPUs per node, memory MiB, share of the nodes); None: a CPU-only pool.
POOLS: tuple[tuple[str, str | None, int, int, float], ...] = (
    ("h100", "NVIDIA-H100-80GB-HBM3", 8, 81559, 0.40),
    ("a100", "NVIDIA-A100-SXM4-80GB", 8, 81920, 0.30),
    ("l4", "NVIDIA-L4", 4, 23034, 0.25),
    ("cpu", None, 0, 0, 0.05),
)
ZONES = ("us-central1-a", "us-central1-b", "us-central1-c", "us-central1-f")
# Pods the scheduler asks about: (planned type annotation, GPUs requested per pod).
PLANNED_PODS = (
    ("NVIDIA-H100-80GB-HBM3", 2),
    ("h100-sxm-80gb", 8),  # a catalog key, resolved through the device catalog
    ("NVIDIA-L4", 1),
    ("NVIDIA-A100-SXM4-80GB", 4),
)
BODIES_PER_SIZE = 16


# -- realistic objects ----------------------------------------------------------------------------


def node_name(pool: str, index: int, rng: random.Random) -> str:
    """A cloud-style node name, `gke-prod-h100-pool-3f9c2a1b-x7k2` (~35 characters)."""
    return f"gke-prod-{pool}-pool-{rng.getrandbits(32):08x}-{index:04x}"


def realistic_node(name: str, pool: str, product: str | None, gpus: int, memory_mib: int,
                   rng: random.Random) -> dict[str, Any]:
    """A v1.Node shaped as a GKE GPU node with GPU Feature Discovery labels (~5 KB of JSON)."""
    zone = rng.choice(ZONES)
    labels = {
        "beta.kubernetes.io/arch": "amd64", "beta.kubernetes.io/os": "linux",
        "kubernetes.io/arch": "amd64", "kubernetes.io/os": "linux",
        "kubernetes.io/hostname": name,
        "node.kubernetes.io/instance-type": f"a3-highgpu-{max(gpus, 1)}g",
        "topology.kubernetes.io/region": "us-central1", "topology.kubernetes.io/zone": zone,
        "cloud.google.com/gke-nodepool": f"{pool}-pool",
        "cloud.google.com/gke-os-distribution": "cos", "cloud.google.com/machine-family": "a3",
        "feature.node.kubernetes.io/cpu-model.vendor_id": "Intel",
        "feature.node.kubernetes.io/kernel-version.full": "6.1.100+",
        "feature.node.kubernetes.io/pci-10de.present": str(product is not None).lower(),
    }
    capacity = {"cpu": "208", "ephemeral-storage": "507944172Ki", "hugepages-1Gi": "0",
                "hugepages-2Mi": "0", "memory": "1901410484Ki", "pods": "110"}
    taints: list[dict[str, str]] = []
    if product is not None:
        labels.update({
            PRODUCT: product, "nvidia.com/gpu.count": str(gpus), "nvidia.com/gpu.present": "true",
            "nvidia.com/gpu.memory": str(memory_mib), "nvidia.com/gpu.family": "hopper",
            "nvidia.com/gpu.machine": "a3-highgpu", "nvidia.com/gpu.compute.major": "9",
            "nvidia.com/gpu.compute.minor": "0", "nvidia.com/cuda.driver.major": "550",
            "nvidia.com/cuda.driver.minor": "90", "nvidia.com/cuda.driver.rev": "07",
            "nvidia.com/cuda.runtime.major": "12", "nvidia.com/cuda.runtime.minor": "4",
            "nvidia.com/mig.capable": "false", "nvidia.com/gfd.timestamp": "1767225600",
        })
        capacity[GPU] = str(gpus)
        taints.append({"key": GPU, "value": "present", "effect": "NoSchedule"})
    allocatable = {**capacity, "cpu": "207500m", "memory": "1880000000Ki"}
    stamp = "2026-01-01T00:00:00Z"
    conditions = [
        {"type": t, "status": "False", "lastHeartbeatTime": stamp, "lastTransitionTime": stamp,
         "reason": f"KubeletHas{r}", "message": f"kubelet has {m}"}
        for t, r, m in (("MemoryPressure", "SufficientMemory", "sufficient memory available"),
                        ("DiskPressure", "NoDiskPressure", "no disk pressure"),
                        ("PIDPressure", "SufficientPID", "sufficient PID available"))
    ] + [{"type": "Ready", "status": "True", "lastHeartbeatTime": stamp,
          "lastTransitionTime": stamp, "reason": "KubeletReady",
          "message": "kubelet is posting ready status"}]
    images = [{"names": [f"us-docker.pkg.dev/prod/images/{img}@sha256:{rng.getrandbits(256):064x}",
                         f"us-docker.pkg.dev/prod/images/{img}:v1.{i}"],
               "sizeBytes": rng.randint(10**7, 10**10)}
              for i, img in enumerate(("trainer", "nvidia-device-plugin", "gpu-feature-discovery",
                                       "dcgm-exporter", "fluent-bit", "kube-proxy"))]
    ip = f"10.{rng.randint(0, 255)}.{rng.randint(0, 255)}.{rng.randint(1, 254)}"
    return {
        "kind": "Node", "apiVersion": "v1",
        "metadata": {
            "name": name, "uid": f"{rng.getrandbits(128):032x}", "resourceVersion": "1",
            "creationTimestamp": stamp, "labels": labels,
            "annotations": {
                "node.alpha.kubernetes.io/ttl": "0",
                "volumes.kubernetes.io/controller-managed-attach-detach": "true",
                "container.googleapis.com/instance_id": str(rng.getrandbits(63)),
                "csi.volume.kubernetes.io/nodeid": json.dumps(
                    {"pd.csi.storage.gke.io": f"projects/prod/zones/{zone}/instances/{name}"}),
            },
        },
        "spec": {"podCIDR": "10.4.0.0/24", "podCIDRs": ["10.4.0.0/24"],
                 "providerID": f"gce://prod/{zone}/{name}", "taints": taints},
        "status": {
            "capacity": capacity, "allocatable": allocatable, "conditions": conditions,
            "addresses": [{"type": "InternalIP", "address": ip},
                          {"type": "Hostname", "address": name}],
            "daemonEndpoints": {"kubeletEndpoint": {"Port": 10250}},
            "nodeInfo": {"machineID": f"{rng.getrandbits(128):032x}",
                         "systemUUID": f"{rng.getrandbits(128):032x}",
                         "bootID": f"{rng.getrandbits(128):032x}",
                         "kernelVersion": "6.1.100+", "osImage": "Container-Optimized OS",
                         "containerRuntimeVersion": "containerd://1.7.22",
                         "kubeletVersion": "v1.34.4", "kubeProxyVersion": "v1.34.4",
                         "operatingSystem": "linux", "architecture": "amd64"},
            "images": images,
        },
    }


def realistic_pod(name: str, *, gpus: int, node: str | None = None,
                  planned: str | None = None, namespace: str = "team-a") -> dict[str, Any]:
    """A v1.Pod as the apiserver serialises it: trainer + sidecar, requests and limits."""
    notes = {"kubectl.kubernetes.io/default-container": "trainer"}
    if planned is not None:
        notes.update({"gpuplan.io/gpu-type": planned, "gpuplan.io/gpu-count": str(gpus),
                      "gpuplan.io/estimated-seconds": "5400"})
    resources = {"requests": {"cpu": "8", "memory": "64Gi", GPU: str(gpus)},
                 "limits": {"memory": "64Gi", GPU: str(gpus)}}
    spec: dict[str, Any] = {
        "containers": [
            {"name": "trainer", "image": "us-docker.pkg.dev/prod/images/trainer:v1.0",
             "command": ["python", "-m", "train", "--config", "/etc/train/config.yaml"],
             "env": [{"name": "NCCL_DEBUG", "value": "WARN"}, {"name": "OMP_NUM_THREADS",
                                                                "value": "8"}],
             "resources": resources,
             "volumeMounts": [{"name": "config", "mountPath": "/etc/train"}],
             "terminationMessagePath": "/dev/termination-log",
             "terminationMessagePolicy": "File", "imagePullPolicy": "IfNotPresent"},
            {"name": "log-shipper", "image": "fluent-bit:3.1",
             "resources": {"requests": {"cpu": "100m", "memory": "128Mi"}}},
        ],
        "initContainers": [{"name": "fetch-data", "image": "gsutil:5",
                            "resources": {"requests": {"cpu": "1"}}}],
        "volumes": [{"name": "config", "configMap": {"name": "train-config"}}],
        "restartPolicy": "Never", "schedulerName": "gpuplan-scheduler", "priority": 0,
        "tolerations": [{"key": GPU, "operator": "Exists", "effect": "NoSchedule"}],
        "enableServiceLinks": True, "preemptionPolicy": "PreemptLowerPriority",
    }
    if node is not None:
        spec["nodeName"] = node
    return {
        "kind": "Pod", "apiVersion": "v1",
        "metadata": {"name": name, "namespace": namespace, "uid": f"uid-{namespace}-{name}",
                     "resourceVersion": "1", "creationTimestamp": "2026-01-01T00:00:00Z",
                     "labels": {"job-name": name.rsplit("-", 1)[0]}, "annotations": notes},
        "spec": spec,
        "status": {"phase": "Running" if node else "Pending", "qosClass": "Burstable"},
    }


@dataclass
class Cluster:
    """The fake cluster: Node objects, bound GPU pods, and the GPU nodes' names (for churn)."""

    nodes: list[dict[str, Any]]
    pods: list[dict[str, Any]]
    gpu_nodes: list[str] = field(default_factory=list)


def make_cluster(n_nodes: int, seed: int) -> Cluster:
    """`n_nodes` nodes from POOLS; half of the GPU nodes run 1–3 GPU pods (deterministic)."""
    rng = random.Random(seed)
    cluster = Cluster(nodes=[], pods=[])
    for i in range(n_nodes):
        pool, product, gpus, memory, _ = rng.choices(POOLS, weights=[p[4] for p in POOLS])[0]
        name = node_name(pool, i, rng)
        cluster.nodes.append(realistic_node(name, pool, product, gpus, memory, rng))
        if product is None:
            continue
        cluster.gpu_nodes.append(name)
        if rng.random() < 0.5:
            left = gpus
            for k in range(rng.randint(1, 3)):
                if left <= 0:
                    break
                used = rng.randint(1, left)
                left -= used
                cluster.pods.append(realistic_pod(f"job{i}-{k}", gpus=used, node=name))
    return cluster


# -- the fake kube-apiserver ----------------------------------------------------------------------


def serve_apiserver(port: int, n_nodes: int, seed: int, churn_per_s: float,
                    bookmark_s: float) -> None:
    """Serve list + watch of Nodes and Pods on 127.0.0.1:`port` until SIGTERM."""
    from aiohttp import web

    cluster = make_cluster(n_nodes, seed)
    state = {"rv": 1000}
    pod_streams: set[asyncio.Queue[bytes]] = set()
    encoded = {
        "nodes": [json.dumps(n, separators=(",", ":")) for n in cluster.nodes],
        "pods": [json.dumps(p, separators=(",", ":")) for p in cluster.pods],
    }

    def list_page(kind: str, request: web.Request) -> web.Response:
        items = encoded[kind]
        limit = int(request.query.get("limit") or len(items) or 1)
        start = int(request.query.get("continue") or 0)
        end = min(start + limit, len(items))
        meta = {"resourceVersion": str(state["rv"])}
        if end < len(items):
            meta["continue"] = str(end)
        head = json.dumps({"kind": f"{kind[:-1].title()}List", "apiVersion": "v1",
                           "metadata": meta})
        body = head[:-1] + ',"items":[' + ",".join(items[start:end]) + "]}"
        return web.Response(body=body.encode(), content_type="application/json")

    async def watch(kind: str, request: web.Request) -> web.StreamResponse:
        timeout_s = float(request.query.get("timeoutSeconds") or 60)
        response = web.StreamResponse(headers={"Content-Type": "application/json"})
        response.enable_chunked_encoding()
        await response.prepare(request)
        queue: asyncio.Queue[bytes] = asyncio.Queue()
        if kind == "pods":
            pod_streams.add(queue)
        deadline = time.monotonic() + timeout_s
        try:
            while (left := deadline - time.monotonic()) > 0:
                try:
                    line = await asyncio.wait_for(queue.get(), min(left, bookmark_s))
                except TimeoutError:
                    kind_name = kind[:-1].title()
                    line = json.dumps({"type": "BOOKMARK", "object": {
                        "kind": kind_name, "apiVersion": "v1",
                        "metadata": {"resourceVersion": str(state["rv"])}}}).encode() + b"\n"
                await response.write(line)
        except (ConnectionResetError, asyncio.CancelledError):
            pass
        finally:
            pod_streams.discard(queue)
        with contextlib.suppress(ConnectionResetError):
            await response.write_eof()
        return response

    def resource(kind: str) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
        """GET /api/v1/<kind>: a watch with `?watch=true`, else a list page."""

        async def handle(request: web.Request) -> web.StreamResponse:
            if request.query.get("watch") in ("true", "1", "True"):
                return await watch(kind, request)
            return list_page(kind, request)

        return handle

    async def churn() -> None:
        """Pods binding to random GPU nodes and finishing, `churn_per_s` events a second."""
        rng = random.Random(seed + 1)
        running: list[dict[str, Any]] = []
        serial = 0
        while True:
            await asyncio.sleep(1.0 / churn_per_s)
            if running and (len(running) >= 50 or rng.random() < 0.5):
                pod, event = running.pop(rng.randrange(len(running))), "DELETED"
            else:
                serial += 1
                pod = realistic_pod(f"churn{serial}-0", gpus=1,
                                    node=rng.choice(cluster.gpu_nodes))
                running.append(pod)
                event = "ADDED"
            state["rv"] += 1
            pod["metadata"]["resourceVersion"] = str(state["rv"])
            line = json.dumps({"type": event, "object": pod}).encode() + b"\n"
            for queue in pod_streams:
                queue.put_nowait(line)

    async def main() -> None:
        app = web.Application()
        for kind in encoded:
            app.router.add_get(f"/api/v1/{kind}", resource(kind))
        runner = web.AppRunner(app, access_log=None, shutdown_timeout=1.0)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", port).start()
        stop = asyncio.Event()
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
        task = asyncio.create_task(churn()) if churn_per_s > 0 else None
        await stop.wait()
        if task is not None:
            task.cancel()
        await runner.cleanup()

    asyncio.run(main())


# -- the extender, with a CPU-time probe ---------------------------------------------------------


def serve_extender(argv: list[str]) -> int:
    """`python -m gpuplan_operator.extender ARGV`, plus a probe of each verb's CPU time.

    The probe is an outermost middleware reading the event-loop thread's CPU clock
    (`time.thread_time_ns`) around each filter/prioritize request, and `POST /bench/cpu`, which
    returns and clears the samples. CPU time, unlike wall time, does not grow when the host
    makes the process wait for a core, so it is the extender's own share of the latency."""
    from aiohttp import web

    from gpuplan_operator.extender import app as app_module
    from gpuplan_operator.extender import cli

    samples: dict[str, list[int]] = {"filter": [], "prioritize": []}
    make_app = app_module.make_app

    def probed_app(*args: Any, **kwargs: Any) -> web.Application:
        application = make_app(*args, **kwargs)

        @web.middleware
        async def probe(request: web.Request, handler: Any) -> web.StreamResponse:
            started = time.thread_time_ns()
            response: web.StreamResponse = await handler(request)
            verb = request.path.rpartition("/")[2]
            if verb in samples:
                samples[verb].append(time.thread_time_ns() - started)
            return response

        async def dump(_: web.Request) -> web.Response:
            out = {verb: list(values) for verb, values in samples.items()}
            for values in samples.values():
                values.clear()
            return web.json_response(out)

        application.middlewares.insert(0, probe)
        application.router.add_post("/bench/cpu", dump)
        return application

    app_module.make_app = probed_app  # type: ignore[assignment]  # cli looks it up per call
    return cli.main(argv)


# -- the load generator ---------------------------------------------------------------------------


def free_port() -> int:
    """A TCP port free on loopback right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def kubeconfig(path: Path, apiserver_port: int) -> Path:
    """A kubeconfig pointing at the fake apiserver (plain HTTP, no credentials)."""
    import yaml

    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "bench",
        "clusters": [{"name": "bench", "cluster": {"server": f"http://127.0.0.1:{apiserver_port}"}}],
        "contexts": [{"name": "bench", "context": {"cluster": "bench", "user": "bench"}}],
        "users": [{"name": "bench", "user": {}}],
    }))
    return path


def runqueue_wait_seconds(pid: int) -> float:
    """Seconds the process's main thread (the event loop) spent runnable but not running, from
    /proc/<pid>/schedstat: the part of the latency that is the host's, not the extender's."""
    try:
        return int(Path(f"/proc/{pid}/schedstat").read_text().split()[1]) / 1e9
    except (OSError, IndexError, ValueError):
        return float("nan")


def get(port: int, path: str, timeout_s: float = 5.0) -> tuple[int, bytes]:
    """One GET on loopback; (0, b"") when nothing answers."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout_s)
    try:
        conn.request("GET", path)
        resp = conn.getresponse()
        return resp.status, resp.read()
    except OSError:
        return 0, b""
    finally:
        conn.close()


def metric(text: str, name: str, labels: str = "") -> float:
    """One sample of a Prometheus text exposition; NaN when absent."""
    pattern = re.escape(name) + (r"\{" + re.escape(labels) + r"\}" if labels else "")
    found = re.search(r"(?m)^" + pattern + r" (\S+)$", text)
    return float(found.group(1)) if found else float("nan")


def handler_totals(port: int) -> dict[str, tuple[float, float]]:
    """(sum seconds, count) of the extender's own latency histogram per verb, result ok."""
    _, body = get(port, "/metrics")
    text = body.decode()
    out = {}
    for verb in ("filter", "prioritize"):
        labels = f'result="ok",verb="{verb}"'
        out[verb] = (metric(text, "gpuplan_extender_request_duration_seconds_sum", labels),
                     metric(text, "gpuplan_extender_request_duration_seconds_count", labels))
    return out


def cpu_samples(port: int) -> dict[str, list[float]]:
    """The probe's CPU seconds per request since the last call, per verb (then cleared)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request("POST", "/bench/cpu", body=b"")
        raw = json.loads(conn.getresponse().read())
    finally:
        conn.close()
    return {verb: [ns / 1e9 for ns in values] for verb, values in raw.items()}


def wait_synced(port: int, n_nodes: int, process: subprocess.Popen[bytes],
                timeout_s: float = 300.0) -> float:
    """Seconds until /readyz is 200 and the inventory holds `n_nodes` nodes."""
    started = time.monotonic()
    while time.monotonic() - started < timeout_s:
        if process.poll() is not None:
            raise RuntimeError(f"extender exited with {process.returncode} before it synced")
        status, _ = get(port, "/readyz")
        if status == 200:
            _, body = get(port, "/metrics")
            if metric(body.decode(), "gpuplan_extender_inventory_nodes") == n_nodes:
                return time.monotonic() - started
        time.sleep(0.2)
    raise RuntimeError(f"extender not synced with {n_nodes} nodes after {timeout_s:.0f}s")


def request_bodies(cluster: Cluster, candidates: int, seed: int) -> list[bytes]:
    """ExtenderArgs bodies: a planned pod and `candidates` node names sampled from the cluster."""
    rng = random.Random(seed * 7919 + candidates)
    names = [n["metadata"]["name"] for n in cluster.nodes]
    bodies = []
    for i in range(BODIES_PER_SIZE):
        planned, gpus = PLANNED_PODS[i % len(PLANNED_PODS)]
        pod = realistic_pod(f"bench{i}-0", gpus=gpus, planned=planned)
        sample = rng.sample(names, candidates)
        bodies.append(json.dumps({"Pod": pod, "Nodes": None, "NodeNames": sample}).encode())
    return bodies


def quantile_ms(samples: Sequence[float], q: float) -> float:
    """The q-quantile (nearest rank) of `samples` seconds, in milliseconds."""
    ordered = sorted(samples)
    return 1000.0 * ordered[min(int(q * len(ordered)), len(ordered) - 1)]


@dataclass
class VerbResult:
    """Latency and server cost of one verb at one candidate count."""

    verb: str
    candidates: int
    requests: int
    p50_ms: float
    p95_ms: float
    p99_ms: float
    max_ms: float
    handler_mean_ms: float
    """Mean time inside the extender's handler (its own histogram): no HTTP, no client."""
    cpu_p50_ms: float
    cpu_p99_ms: float
    cpu_max_ms: float
    """Quantiles of the event-loop thread's CPU time per request (the probe of
    `serve_extender`): the extender's own work, without the waits for a core."""


@dataclass
class SizeResult:
    """One candidate count: both verbs, plus the server's CPU per request over the run."""

    candidates: int
    seconds: float
    requests: int
    server_cpu_ms_per_request: float
    server_wait_ms_per_request: float
    """Run-queue wait of the server's event-loop thread per request (host CPU contention)."""
    verbs: list[VerbResult]


class Client:
    """One keep-alive HTTP/1.1 connection to the extender."""

    def __init__(self, port: int) -> None:
        self._conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        self._headers = {"Content-Type": "application/json"}

    def post(self, verb: str, body: bytes) -> tuple[int, bytes]:
        """POST one ExtenderArgs body; returns the status and the whole response body."""
        self._conn.request("POST", f"/extender/{verb}", body=body, headers=self._headers)
        resp = self._conn.getresponse()
        return resp.status, resp.read()

    def close(self) -> None:
        """Close the connection."""
        self._conn.close()


def check_answers(client: Client, bodies: Sequence[bytes]) -> None:
    """Every body is answered 200 with a well-formed filter result / priority list."""
    for body in bodies:
        status, raw = client.post("filter", body)
        result = json.loads(raw)
        if status != 200 or result.get("Error"):
            raise RuntimeError(f"filter answered {status}: {raw[:300]!r}")
        decided = (len(result["NodeNames"]) + len(result["FailedNodes"])
                   + len(result["FailedAndUnresolvableNodes"]))
        if decided != len(json.loads(body)["NodeNames"]) or not result["NodeNames"]:
            raise RuntimeError(f"filter decided {decided} nodes, passed {len(result['NodeNames'])}")
        status, raw = client.post("prioritize", body)
        if status != 200 or not isinstance(json.loads(raw), list):
            raise RuntimeError(f"prioritize answered {status}: {raw[:300]!r}")


def run_size(port: int, pid: int, bodies: Sequence[bytes], candidates: int,
             seconds: float, warmup: int) -> SizeResult:
    """Filter + prioritize pairs over one connection for `seconds`; latency and server CPU."""
    client = Client(port)
    try:
        check_answers(client, bodies)
        for i in range(warmup):
            client.post("filter", bodies[i % len(bodies)])
            client.post("prioritize", bodies[i % len(bodies)])
        latencies: dict[str, list[float]] = {"filter": [], "prioritize": []}
        cpu_samples(port)  # clears the warm-up's
        before_handler = handler_totals(port)
        cpu_before = proc.cpu_seconds(pid)
        wait_before = runqueue_wait_seconds(pid)
        started = time.perf_counter()
        deadline = started + seconds
        i = 0
        clock = time.perf_counter
        while clock() < deadline:
            body = bodies[i % len(bodies)]
            i += 1
            for verb in ("filter", "prioritize"):
                t0 = clock()
                status, _ = client.post(verb, body)
                latencies[verb].append(clock() - t0)
                if status != 200:
                    raise RuntimeError(f"{verb}: HTTP {status}")
        elapsed = time.perf_counter() - started
        cpu = proc.cpu_seconds(pid) - cpu_before
        wait = runqueue_wait_seconds(pid) - wait_before
        after_handler = handler_totals(port)
        server_cpu = cpu_samples(port)
    finally:
        client.close()
    requests = sum(len(v) for v in latencies.values())
    verbs = []
    for verb, samples in latencies.items():
        d_sum = after_handler[verb][0] - before_handler[verb][0]
        d_count = after_handler[verb][1] - before_handler[verb][1]
        cpu_s = server_cpu.get(verb) or [float("nan")]
        verbs.append(VerbResult(
            verb=verb, candidates=candidates, requests=len(samples),
            p50_ms=quantile_ms(samples, 0.50), p95_ms=quantile_ms(samples, 0.95),
            p99_ms=quantile_ms(samples, 0.99), max_ms=1000.0 * max(samples),
            handler_mean_ms=1000.0 * d_sum / d_count if d_count else float("nan"),
            cpu_p50_ms=quantile_ms(cpu_s, 0.50), cpu_p99_ms=quantile_ms(cpu_s, 0.99),
            cpu_max_ms=1000.0 * max(cpu_s)))
    return SizeResult(candidates=candidates, seconds=elapsed, requests=requests,
                      server_cpu_ms_per_request=1000.0 * cpu / requests,
                      server_wait_ms_per_request=1000.0 * wait / requests, verbs=verbs)


def _pin(pid: int, cpu: int | None) -> None:
    if cpu is not None and hasattr(os, "sched_setaffinity") and cpu < (os.cpu_count() or 1):
        with contextlib.suppress(OSError):
            os.sched_setaffinity(pid, {cpu})


def _renice(pid: int, nice: int) -> None:
    if nice:
        os.setpriority(os.PRIO_PROCESS, pid, nice)  # a negative value needs root


def _stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(10)


@contextlib.contextmanager
def processes(args: argparse.Namespace, workdir: Path) -> Iterator[tuple[int, int]]:
    """Start the fake apiserver and the extender; yields (extender port, extender pid)."""
    api_port, ext_port = free_port(), free_port()
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    apiserver = subprocess.Popen(
        [sys.executable, "-m", "campaigns.extender_loadbench",
         "--serve-apiserver", str(api_port), "--nodes", str(args.nodes),
         "--seed", str(args.seed), "--churn-per-s", str(args.churn_per_s)], env=env)
    extender: subprocess.Popen[bytes] | None = None
    try:
        deadline = time.monotonic() + 120
        while get(api_port, "/api/v1/nodes?limit=1")[0] != 200:
            if apiserver.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("the fake apiserver did not start")
            time.sleep(0.2)
        profile = ["-m", "cProfile", "-o", str(args.profile)] if args.profile else []
        extender = subprocess.Popen(
            [sys.executable, *profile, "-m", "campaigns.extender_loadbench",
             "--serve-extender", "--kubeconfig",
             str(kubeconfig(workdir / "kubeconfig", api_port)),
             "--port", str(ext_port), "--log-level", "WARNING"], env=env)
        _pin(extender.pid, args.server_cpu)
        _renice(extender.pid, args.nice)
        synced_s = wait_synced(ext_port, args.nodes, extender)
        time.sleep(2.0)  # let the extender's one-off gc.collect + gc.freeze after sync pass
        print(f"extender synced {args.nodes} nodes from the fake apiserver in {synced_s:.1f} s "
              f"(pid {extender.pid}, rss {proc.rss_mib(extender.pid):.0f} MiB)", flush=True)
        yield ext_port, extender.pid
    finally:
        if extender is not None:
            _stop(extender)
        _stop(apiserver)


def describe_host() -> str:
    """CPU model, cores and load, so figures from different machines are not compared blindly."""
    model = platform.processor() or "?"
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    load = os.getloadavg() if hasattr(os, "getloadavg") else (float("nan"),) * 3
    return (f"{model}, {os.cpu_count()} cores, load average {load[0]:.2f}; "
            f"Python {platform.python_version()}")


def report(results: Sequence[SizeResult]) -> str:
    """The results as a Markdown table."""
    lines = ["| candidates | verb | requests | p50 ms | p95 ms | p99 ms | max ms "
             "| handler CPU p50 / p99 / max ms | server process CPU ms/request "
             "| server run-queue wait ms/request |",
             "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for size in results:
        for v in size.verbs:
            lines.append(f"| {v.candidates:,} | {v.verb} | {v.requests:,} | {v.p50_ms:.2f} | "
                         f"{v.p95_ms:.2f} | {v.p99_ms:.2f} | {v.max_ms:.1f} | "
                         f"{v.cpu_p50_ms:.2f} / {v.cpu_p99_ms:.2f} / {v.cpu_max_ms:.1f} | "
                         f"{size.server_cpu_ms_per_request:.2f} | "
                         f"{size.server_wait_ms_per_request:.2f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark (or be the fake apiserver, or the probed extender)."""
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--serve-extender"]:
        return serve_extender(argv[1:])
    parser = argparse.ArgumentParser(prog="python -m campaigns.extender_loadbench",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=5000, help="nodes in the inventory")
    parser.add_argument("--candidates", type=int, nargs="+", default=[500, 5000],
                        help="node names per request (default 500 5000)")
    parser.add_argument("--seconds", type=float, default=10.0, help="measured seconds per size")
    parser.add_argument("--warmup", type=int, default=100, help="request pairs before measuring")
    parser.add_argument("--churn-per-s", type=float, default=10.0,
                        help="pod ADDED/DELETED events per second on the watch (0: none)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--server-cpu", type=int, default=0, help="pin the extender to this CPU")
    parser.add_argument("--client-cpu", type=int, default=1, help="pin this process to this CPU")
    parser.add_argument("--nice", type=int, default=0,
                        help="scheduling niceness of the extender and the load generator "
                             "(e.g. -10 on a busy shared host; negative values need root)")
    parser.add_argument("--json", type=Path, help="also write the results here")
    parser.add_argument("--profile", type=Path, help="run the extender under cProfile, write here")
    parser.add_argument("--serve-apiserver", type=int, metavar="PORT", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.serve_apiserver:
        serve_apiserver(args.serve_apiserver, args.nodes, args.seed, args.churn_per_s,
                        bookmark_s=5.0)
        return 0
    if not 1 <= args.nodes <= 100_000 or not all(0 < c <= args.nodes for c in args.candidates):
        parser.error("--nodes must be 1..100000 and every --candidates 1..--nodes")
    if args.profile:
        args.profile = args.profile.resolve()
    _pin(0, args.client_cpu)
    print(f"host: {describe_host()}; nice {args.nice}")
    print(f"inventory: {args.nodes:,} realistic Nodes listed and watched through the kubernetes "
          f"client from a fake apiserver; pod churn {args.churn_per_s:g} events/s; "
          f"{args.seconds:g} s per size; one keep-alive connection", flush=True)
    cluster = make_cluster(args.nodes, args.seed)
    bodies = {c: request_bodies(cluster, c, args.seed) for c in args.candidates}
    del cluster
    # The load generator's own collector must not pause inside a timed request: nothing it keeps
    # is garbage, and the few objects a request allocates are freed by reference counting.
    gc.collect()
    gc.freeze()
    results = []
    with tempfile.TemporaryDirectory() as tmp, processes(args, Path(tmp)) as (port, pid):
        _renice(os.getpid(), args.nice)
        for candidates in args.candidates:
            gc.disable()
            try:
                result = run_size(port, pid, bodies[candidates], candidates, args.seconds,
                                  args.warmup)
            finally:
                gc.enable()
            results.append(result)
            print(f"  {candidates:,} candidates ({len(bodies[candidates][0]) / 1024:.0f} KiB "
                  f"bodies): {result.requests:,} requests in {result.seconds:.1f} s", flush=True)
    print()
    print(report(results))
    if args.json:
        args.json.write_text(json.dumps({"host": describe_host(), "args": {
            k: str(v) for k, v in vars(args).items()}, "results": [asdict(r) for r in results]},
            indent=2) + "\n")
    if args.profile:
        print(f"\ncProfile of the extender's main thread: {args.profile} "
              f"(python -m pstats {args.profile})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
