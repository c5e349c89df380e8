"""Does the gpuplan extender earn its place? A MostAllocated kube-scheduler with and without it,
on the same seeded workload on the testbed (issue #32, item 4).

    PYTHONPATH=tests:testbed:hack python -m campaigns.scheduler_comparison  # make sched-compare

Two kube-scheduler processes of the testbed's version run beside the testbed's own: profile
`cmp-most-allocated` (NodeResourcesFit scoring MostAllocated, nothing else changed) and
`cmp-gpuplan` (the same plus the gpuplan extender, `python -m gpuplan_operator.extender`, with
the testbed's extender section). Each repeat creates a fresh pool of kwok nodes (tainted and
labelled for the run) and replays the workload of `campaigns.scheduler_workload` through one
scheduler, one arrival at a time: finished pods are deleted, the next pod is created, and the
campaign waits until it is bound or reported unschedulable. After each arrival it counts whole
free 8-GPU NVLink nodes. Pods carry node affinity on their planned GPU type in both variants, as
the operator's Jobs do.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime
import json
import os
import pathlib
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import testbed_procs
import yaml
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

from campaigns import scheduler_workload as w
from campaigns.chaos import Child, private_testbed

ROOT = pathlib.Path(__file__).resolve().parents[2]
HTTP_TIMEOUT_S = 15
ARRIVAL_TIMEOUT_S = 30.0
"""A pod neither bound nor reported unschedulable this long after creation is a campaign error."""
POLL_S = 0.02


@dataclass(frozen=True)
class Variant:
    name: str
    scheduler_name: str
    with_extender: bool
    most_allocated_on: tuple[str, ...]  # empty: kube-scheduler's default LeastAllocated


VARIANTS = (
    Variant("MostAllocated", "cmp-most-allocated", False, w.DEFAULT_SCORED_RESOURCES),
    Variant("MostAllocated + gpuplan extender", "cmp-gpuplan", True, w.DEFAULT_SCORED_RESOURCES),
    # What a GPU cluster's admin can configure without gpuplan.
    Variant("MostAllocated on nvidia.com/gpu (tuned)", "cmp-most-allocated-gpu", False,
            (w.GPU_RESOURCE,)),
    # What a cluster runs when nobody configured anything.
    Variant("default profile (LeastAllocated)", "cmp-default", False, ()),
)


@dataclass(frozen=True)
class ComparisonSettings:
    seed: int = 7
    pods: int = 60
    repeats: int = 3
    cpu_only_share: float = 0.0


class Schedulers:
    """The variants' kube-schedulers and the extender, as child processes of the campaign."""

    def __init__(self, state: dict[str, Any], workdir: pathlib.Path) -> None:
        self.state, self.workdir = state, workdir
        self.children: list[Child] = []
        self.extender_url = ""

    def start(self) -> None:
        kubeconfig = self.state["kubeconfig"]
        ext_port, *sched_ports = testbed_procs.free_ports(1 + len(VARIANTS))
        self.extender_url = f"http://127.0.0.1:{ext_port}/extender"
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(
            str(ROOT / d) for d in ("operator", "estimator"))}
        self._child("extender", [sys.executable, "-m", "gpuplan_operator.extender",
                                 f"--kubeconfig={kubeconfig}", f"--port={ext_port}"], env)
        for variant, port in zip(VARIANTS, sched_ports, strict=True):
            url = self.extender_url if variant.with_extender else None
            path = self.workdir / f"{variant.scheduler_name}.yaml"
            path.write_text(yaml.safe_dump(
                w.scheduler_profile_config(kubeconfig, variant.scheduler_name, url,
                                           variant.most_allocated_on)))
            self._child(variant.scheduler_name, [
                str(pathlib.Path(self.state["bin_dir"]) / "kube-scheduler"), f"--config={path}",
                f"--authentication-kubeconfig={kubeconfig}",
                f"--authorization-kubeconfig={kubeconfig}", "--bind-address=127.0.0.1",
                f"--secure-port={port}"], env)
            self._wait(f"https://127.0.0.1:{port}/healthz", variant.scheduler_name)
        self._wait(f"http://127.0.0.1:{ext_port}/readyz", "extender")

    def _child(self, name: str, argv: list[str], env: dict[str, str]) -> None:
        child = Child(name, argv, env, self.workdir / f"{name}.log")
        child.start()
        self.children.append(child)

    def _wait(self, url: str, name: str, timeout_s: float = 60.0) -> None:
        tls = testbed_procs.insecure_tls() if url.startswith("https") else None
        deadline = time.monotonic() + timeout_s
        while not testbed_procs.http_ok(url, tls):
            child = next(c for c in self.children if c.name == name)
            if not child.alive or time.monotonic() > deadline:
                raise RuntimeError(f"{name} did not become healthy:\n{child.log_text()[-3000:]}")
            time.sleep(0.2)

    def stop(self) -> None:
        for child in reversed(self.children):
            child.stop()


@contextlib.contextmanager
def running_schedulers(state: dict[str, Any], workdir: pathlib.Path) -> Iterator[Schedulers]:
    schedulers = Schedulers(state, workdir)
    try:
        schedulers.start()
        yield schedulers
    finally:
        schedulers.stop()


class Replay:
    """One repeat of the workload through one variant, on its own nodes and namespace."""

    def __init__(self, core: client.CoreV1Api, variant: Variant, pool_id: str) -> None:
        self.core, self.variant, self.pool_id, self.namespace = core, variant, pool_id, pool_id
        self.bound_step: dict[str, int] = {}
        self.bound_node: dict[str, str] = {}
        self.finished: set[str] = set()

    def run(self, specs: list[w.PodSpec], repeat: int) -> w.RunResult:
        outcomes, whole_series, partly_series = [], [], []
        for step, spec in enumerate(specs):
            self._finish(specs, step)
            free_before = w.whole_free_nvlink_nodes(self.node_states())
            outcome = self._arrive(spec, step, free_before)
            states = self.node_states()
            whole_series.append(w.whole_free_nvlink_nodes(states))
            partly_series.append(w.partly_used_nvlink_nodes(states))
            outcomes.append(outcome)
        self._note_late_binds(len(specs))
        products = {n.name: n.product for n in self.node_states()}
        node_of = self.bound_node
        settled = [dataclasses.replace(o, node_product=products.get(node_of.get(o.name, "")))
                   for o in outcomes]
        pending = sum(1 for p in self._pods() if not p["spec"].get("nodeName"))
        return w.RunResult(self.variant.name, repeat, tuple(settled), tuple(whole_series),
                           tuple(partly_series), pending)

    def _finish(self, specs: list[w.PodSpec], step: int) -> None:
        """Delete the pods whose lifetime (counted from their binding) ends at this arrival."""
        for spec in specs:
            bound = self.bound_step.get(spec.name)
            if bound is None or spec.lifetime_steps is None or spec.name in self.finished:
                continue
            if step - bound >= spec.lifetime_steps:
                self.core.delete_namespaced_pod(spec.name, self.namespace, grace_period_seconds=0,
                                                _request_timeout=HTTP_TIMEOUT_S)
                self.finished.add(spec.name)
        self._note_late_binds(step)

    def _note_late_binds(self, step: int) -> None:
        for pod in self._pods():
            name = pod["metadata"]["name"]
            if pod["spec"].get("nodeName") and name not in self.bound_step:
                self.bound_step[name] = step
                self.bound_node[name] = pod["spec"]["nodeName"]

    def _arrive(self, spec: w.PodSpec, step: int, free_before: int) -> w.PodOutcome:
        manifest = w.pod_manifest(spec, self.variant.scheduler_name, self.pool_id)
        started = time.monotonic()
        self.core.create_namespaced_pod(self.namespace, manifest, _request_timeout=HTTP_TIMEOUT_S)
        node, bind_ms = None, None
        while time.monotonic() - started < ARRIVAL_TIMEOUT_S:
            pod = self.core.read_namespaced_pod(spec.name, self.namespace,
                                                _request_timeout=HTTP_TIMEOUT_S)
            if pod.spec.node_name:
                node, bind_ms = pod.spec.node_name, (time.monotonic() - started) * 1000.0
                break
            if _unschedulable(pod):
                break
            time.sleep(POLL_S)
        else:
            raise RuntimeError(f"{spec.name}: neither bound nor unschedulable after "
                               f"{ARRIVAL_TIMEOUT_S} s ({self.variant.scheduler_name} alive?)")
        if node is not None:
            self.bound_step[spec.name], self.bound_node[spec.name] = step, node
        return w.PodOutcome(spec.name, spec.product, spec.gpus, None, node is not None, bind_ms,
                            free_before)

    def _pods(self) -> list[dict[str, Any]]:
        return _items(self.core.list_namespaced_pod(self.namespace, _preload_content=False,
                                                    _request_timeout=HTTP_TIMEOUT_S))

    def node_states(self) -> list[Any]:
        nodes = _items(self.core.list_node(label_selector=f"{w.POOL_LABEL}={self.pool_id}",
                                           _preload_content=False, _request_timeout=HTTP_TIMEOUT_S))
        return w.node_states(nodes, self._pods(), self.pool_id)


def _items(response: Any) -> list[dict[str, Any]]:
    return list(json.loads(response.data)["items"])


def _unschedulable(pod: Any) -> bool:
    return any(c.type == "PodScheduled" and c.status == "False" and c.reason == "Unschedulable"
               for c in (pod.status.conditions or []))


@contextlib.contextmanager
def node_pool(core: client.CoreV1Api, pools: tuple[w.NodePool, ...], pool_id: str,
              timeout_s: float = 60.0) -> Iterator[None]:
    """The run's kwok nodes and namespace, Ready before use and deleted afterwards."""
    nodes = w.pool_nodes(pools, pool_id)
    core.create_namespace({"metadata": {"name": pool_id}}, _request_timeout=HTTP_TIMEOUT_S)
    try:
        for node in nodes:
            core.create_node(node, _request_timeout=HTTP_TIMEOUT_S)
        deadline = time.monotonic() + timeout_s
        while not _all_ready(core, pool_id, len(nodes)):
            if time.monotonic() > deadline:
                raise RuntimeError(f"kwok did not make the {len(nodes)} nodes of {pool_id} Ready")
            time.sleep(0.2)
        yield
    finally:
        with contextlib.suppress(ApiException):
            core.delete_namespace(pool_id, grace_period_seconds=0, _request_timeout=HTTP_TIMEOUT_S)
        for node in nodes:
            with contextlib.suppress(ApiException):
                core.delete_node(node["metadata"]["name"], _request_timeout=HTTP_TIMEOUT_S)


def _all_ready(core: client.CoreV1Api, pool_id: str, count: int) -> bool:
    nodes = core.list_node(label_selector=f"{w.POOL_LABEL}={pool_id}",
                           _request_timeout=HTTP_TIMEOUT_S).items
    ready = [n for n in nodes if any(c.type == "Ready" and c.status == "True"
                                     for c in (n.status.conditions or []))]
    return len(ready) == count


def campaign(state: dict[str, Any], settings: ComparisonSettings, workdir: pathlib.Path
             ) -> dict[str, list[w.RunResult]]:
    specs = w.workload(settings.seed, settings.pods, settings.cpu_only_share)
    api = config.new_client_from_config(config_file=state["kubeconfig"])
    core = client.CoreV1Api(api)
    results: dict[str, list[w.RunResult]] = {v.name: [] for v in VARIANTS}
    with running_schedulers(state, workdir):
        for repeat in range(settings.repeats):
            for i, variant in enumerate(VARIANTS):  # alternated, so host load hits both alike
                pool_id = f"cmp-{int(time.time())}-{repeat}-{i}"
                with node_pool(core, w.DEFAULT_POOLS, pool_id):
                    results[variant.name].append(Replay(core, variant, pool_id).run(specs, repeat))
                print(f"repeat {repeat} {variant.name}: done", flush=True)
    api.close()
    return results


def _git_commit() -> str:
    out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                         text=True, timeout=30, check=False)
    return out.stdout.strip() or "unknown"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="campaigns.scheduler_comparison", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seed", type=int, default=ComparisonSettings.seed)
    parser.add_argument("--pods", type=int, default=ComparisonSettings.pods)
    parser.add_argument("--repeats", type=int, default=ComparisonSettings.repeats)
    parser.add_argument("--cpu-only-share", type=float, default=ComparisonSettings.cpu_only_share,
                        help="share of the arrivals that are CPU-only pods (0 to below 1)")
    parser.add_argument("--state-dir", type=pathlib.Path,
                        default=pathlib.Path(tempfile.gettempdir()) / "gpuplan-schedcmp-testbed",
                        help="private testbed state dir (started and stopped here)")
    parser.add_argument("--json", type=pathlib.Path, help="also write every run's outcomes here")
    args = parser.parse_args(argv)
    if not 1 <= args.pods <= 500:
        parser.error(f"--pods must be in 1..500, got {args.pods}")
    if not 1 <= args.repeats <= 20:
        parser.error(f"--repeats must be in 1..20, got {args.repeats}")
    if not 0.0 <= args.cpu_only_share < 1.0:
        parser.error(f"--cpu-only-share must be in [0, 1), got {args.cpu_only_share}")
    settings = ComparisonSettings(seed=args.seed, pods=args.pods, repeats=args.repeats,
                        cpu_only_share=args.cpu_only_share)
    workdir = pathlib.Path(tempfile.mkdtemp(prefix="gpuplan-schedcmp-"))
    with private_testbed(args.state_dir) as state:
        results = campaign(state, settings, workdir)
        version = pathlib.Path(state["bin_dir"]).parent.name
    summaries = [w.summarize(name, runs) for name, runs in results.items()]
    print(f"{datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M} UTC, commit {_git_commit()}, "
          f"testbed {version}, seed {settings.seed}, {settings.pods} pods, "
          f"CPU-only share {settings.cpu_only_share}, {settings.repeats} repeats; "
          f"logs in {workdir}")
    print(w.table(summaries))
    if args.json:
        args.json.write_text(json.dumps({k: [dataclasses.asdict(r) for r in v]
                                         for k, v in results.items()}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
