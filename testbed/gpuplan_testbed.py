"""Local Kubernetes testbed: a real control plane as local processes on 127.0.0.1, no Docker.

    python testbed/gpuplan_testbed.py up [--extender-port N] [--strict-extender]
    python testbed/gpuplan_testbed.py status [--json]
    python testbed/gpuplan_testbed.py down
    python testbed/gpuplan_testbed.py env          # prints `export KUBECONFIG=...`
    python testbed/gpuplan_testbed.py nodes --kubeconfig K   # fake nodes on another cluster (kind)

Starts etcd, kube-apiserver, kube-controller-manager, kube-scheduler, a second kube-scheduler
named `gpuplan-scheduler` (extender at http://127.0.0.1:<extender-port>/extender) and kwok with
the fake GPU nodes of `testbed/nodes.yaml`. Everything lives in the state directory
(`$GPUPLAN_TESTBED_STATE`, default `<repo>/.testbed`); `state.json` there tells tests and tools
the ports, kubeconfig and binaries. See docs/testbed.md.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import shutil
import ssl
import subprocess
import sys
import time
from dataclasses import dataclass, field
from typing import Any

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

import testbed_procs as procs
import yaml
from testbed_commands import component_argvs
from testbed_common import (
    COMPONENTS,
    GPUPLAN_SCHEDULER_NAME,
    REPO_ROOT,
    TESTBED_DIR,
    Layout,
    Ports,
    TestbedError,
)
from testbed_lock import exclusive
from testbed_nodes import create_nodes, load_nodes, wait_nodes_ready
from testbed_pki import ensure_pki
from testbed_render import gpuplan_scheduler_config, kubeconfig, scheduler_config

# helm is built too but only tests that render charts need it; they check for it themselves.
BINARIES = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubectl",
            "kwok")
STATE_VERSION = 1


def default_state_dir() -> pathlib.Path:
    return pathlib.Path(os.environ.get("GPUPLAN_TESTBED_STATE", REPO_ROOT / ".testbed")).resolve()


def default_bin_dir() -> pathlib.Path:
    """`$GPUPLAN_TESTBED_BIN`, else the versioned cache dir that hack/testbed-build.sh fills."""
    if "GPUPLAN_TESTBED_BIN" in os.environ:
        return pathlib.Path(os.environ["GPUPLAN_TESTBED_BIN"]).resolve()
    out = subprocess.run(["bash", str(REPO_ROOT / "hack" / "testbed-build.sh"), "--print-bin"],
                         check=True, capture_output=True, text=True, timeout=30)
    return pathlib.Path(out.stdout.strip())


def missing_binaries(bin_dir: pathlib.Path) -> list[str]:
    return [b for b in BINARIES if not os.access(bin_dir / b, os.X_OK)]


@dataclass(frozen=True)
class Settings:
    """How to start the testbed; every field has a CLI flag or environment variable."""

    state_dir: pathlib.Path = field(default_factory=default_state_dir)
    bin_dir: pathlib.Path = field(default_factory=default_bin_dir)
    extender_port: int | None = None  # None: a free port, recorded in state.json
    extender_ignorable: bool = True  # the scheduler still schedules when no extender listens
    nodes_file: pathlib.Path = TESTBED_DIR / "nodes.yaml"
    apiserver_timeout_s: float = 180.0  # cold start on a loaded 2-core machine takes ~20-60 s
    component_timeout_s: float = 90.0
    nodes_timeout_s: float = 120.0


def up(settings: Settings, owner: str = "cli") -> dict[str, Any]:
    """Start the testbed, or reuse it when the one in `state_dir` is healthy; returns state.json.

    `owner` "pytest" marks a testbed that the last pytest session using it may stop; "cli"
    (`make testbed-up`) keeps it running until `down`. Callers sharing a state dir hold
    `testbed_lock.exclusive()` around this.
    """
    layout = Layout(settings.state_dir)
    state = load_state(layout)
    if state is not None and not unhealthy_components(layout, state):
        if owner == "cli" and state.get("owner") != "cli":
            state["owner"] = "cli"  # adopted by a person: pytest must no longer stop it
            layout.state_json.write_text(json.dumps(state, indent=2) + "\n")
        return dict(state, reused=True)
    missing = missing_binaries(settings.bin_dir)
    if missing:
        raise TestbedError(f"testbed binaries missing in {settings.bin_dir}: {missing}; "
                           "run `make testbed-build`")
    down(layout)  # leftovers of a crashed or half-started run
    _reset_state_dir(layout)
    try:
        return _start(settings, layout, owner)
    except BaseException:
        down(layout, keep_data=True)
        raise


def _reset_state_dir(layout: Layout) -> None:
    # Logs of the previous run stay for post-mortems; etcd data and configs start clean.
    for stale in (layout.etcd_data, layout.config, layout.state_dir / "apiserver-certs"):
        shutil.rmtree(stale, ignore_errors=True)
    for d in (layout.state_dir, layout.logs, layout.pids, layout.config, layout.etcd_data):
        d.mkdir(parents=True, exist_ok=True)
    layout.etcd_data.chmod(0o700)


def _start(settings: Settings, layout: Layout, owner: str) -> dict[str, Any]:
    started = time.monotonic()
    ports = _choose_ports(settings.extender_port)
    ensure_pki(layout.pki)
    _write_configs(settings, layout, ports)
    argvs = component_argvs(settings.bin_dir, layout, ports)
    waited: dict[str, float] = {}
    for name in COMPONENTS:
        procs.start(layout, name, argvs[name])
        timeout = settings.apiserver_timeout_s if name == "kube-apiserver" else \
            settings.component_timeout_s
        probe = _probes(layout, ports)[name]
        waited[name] = round(procs.wait_until(layout, name, probe, timeout), 2)
    state = _state(settings, layout, ports)
    nodes = load_nodes(settings.nodes_file)
    create_nodes(layout.kubeconfig, nodes)
    waited["nodes-ready"] = round(
        wait_nodes_ready(layout.kubeconfig, len(nodes), settings.nodes_timeout_s), 2)
    state.update(nodes=len(nodes), startup_seconds=waited,
                 ready_after_seconds=round(time.monotonic() - started, 2), owner=owner)
    layout.state_json.write_text(json.dumps(state, indent=2) + "\n")
    return dict(state, reused=False)


def _choose_ports(extender_port: int | None) -> Ports:
    p = procs.free_ports(8)
    return Ports(etcd_client=p[0], etcd_peer=p[1], apiserver=p[2], controller_manager=p[3],
                 scheduler_default=p[4], scheduler_gpuplan=p[5], kwok=p[6],
                 extender=extender_port if extender_port is not None else p[7])


def _write_configs(settings: Settings, layout: Layout, ports: Ports) -> None:
    pki = layout.pki_file
    kcfg = kubeconfig(f"https://127.0.0.1:{ports.apiserver}", str(pki("ca.crt")),
                      str(pki("admin.crt")), str(pki("admin.key")))
    layout.kubeconfig.write_text(yaml.safe_dump(kcfg, sort_keys=False))
    layout.kubeconfig.chmod(0o600)
    sched_default = scheduler_config(str(layout.kubeconfig), scheduler_name=None)
    sched_gpuplan = gpuplan_scheduler_config(str(layout.kubeconfig), ports.extender,
                                             settings.extender_ignorable)
    (layout.config / "sched-default.yaml").write_text(yaml.safe_dump(sched_default))
    (layout.config / "sched-gpuplan.yaml").write_text(yaml.safe_dump(sched_gpuplan))
    shutil.copyfile(TESTBED_DIR / "kwok-stages.yaml", layout.config / "kwok.yaml")


def _probes(layout: Layout, ports: Ports) -> dict[str, Any]:
    admin = ssl.create_default_context(cafile=str(layout.pki_file("ca.crt")))
    admin.load_cert_chain(str(layout.pki_file("admin.crt")), str(layout.pki_file("admin.key")))
    anon = procs.insecure_tls()

    def https(port: int, path: str, ctx: ssl.SSLContext) -> Any:
        return lambda: procs.http_ok(f"https://127.0.0.1:{port}{path}", ctx)

    return {
        "etcd": lambda: procs.http_ok(f"http://127.0.0.1:{ports.etcd_client}/health"),
        "kube-apiserver": https(ports.apiserver, "/readyz", admin),
        "kube-controller-manager": https(ports.controller_manager, "/healthz", anon),
        "kube-scheduler": https(ports.scheduler_default, "/healthz", anon),
        "gpuplan-scheduler": https(ports.scheduler_gpuplan, "/healthz", anon),
        "kwok": lambda: procs.http_ok(f"http://127.0.0.1:{ports.kwok}/healthz"),
    }


def _state(settings: Settings, layout: Layout, ports: Ports) -> dict[str, Any]:
    return {
        "version": STATE_VERSION,
        "state_dir": str(layout.state_dir),
        "kubeconfig": str(layout.kubeconfig),
        "api_server": f"https://127.0.0.1:{ports.apiserver}",
        "bin_dir": str(settings.bin_dir),
        "kubectl": str(settings.bin_dir / "kubectl"),
        "helm": str(settings.bin_dir / "helm"),
        "logs_dir": str(layout.logs),
        "ports": ports.as_dict(),
        "extender_port": ports.extender,
        "extender_url": f"http://127.0.0.1:{ports.extender}/extender",
        "extender_ignorable": settings.extender_ignorable,
        "gpuplan_scheduler_name": GPUPLAN_SCHEDULER_NAME,
    }


def load_state(layout: Layout) -> dict[str, Any] | None:
    try:
        state: dict[str, Any] = json.loads(layout.state_json.read_text())
    except FileNotFoundError:
        return None
    except ValueError as exc:
        raise TestbedError(f"{layout.state_json}: not JSON ({exc}); run `down`") from exc
    return state if state.get("version") == STATE_VERSION else None


def component_status(layout: Layout, state: dict[str, Any] | None) -> dict[str, dict[str, Any]]:
    """Per component: running (process alive), healthy (probe answered), pid, rss_mib."""
    probes = _probes(layout, Ports.from_dict(state["ports"])) if state else {}
    report = {}
    for name in COMPONENTS:
        record = procs.read_record(layout, name)
        alive = procs.is_alive(record)
        report[name] = {
            "running": alive,
            "healthy": bool(alive and name in probes and probes[name]()),
            "pid": record["pid"] if alive and record else None,
            "rss_mib": round(procs.rss_bytes(record) / 2**20, 1),
        }
    return report


def unhealthy_components(layout: Layout, state: dict[str, Any]) -> list[str]:
    return [n for n, s in component_status(layout, state).items() if not s["healthy"]]


def down(layout: Layout, keep_data: bool = False) -> list[str]:
    """Stop every recorded component (reverse start order); returns those that were running."""
    stopped = [n for n in reversed(COMPONENTS) if procs.stop(layout, n)]
    layout.state_json.unlink(missing_ok=True)
    if not keep_data:
        shutil.rmtree(layout.etcd_data, ignore_errors=True)
    return stopped


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="gpuplan_testbed", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("command", choices=["up", "down", "status", "env", "nodes"])
    parser.add_argument("--state-dir", type=pathlib.Path, default=None)
    parser.add_argument("--extender-port", type=int,
                        default=int(os.environ.get("GPUPLAN_EXTENDER_PORT", "0")) or None)
    parser.add_argument("--strict-extender", action="store_true",
                        help="extender errors fail scheduling (ignorable: false)")
    parser.add_argument("--json", action="store_true", help="status as JSON")
    parser.add_argument("--kubeconfig", type=pathlib.Path,
                        help="nodes: the cluster to add testbed/nodes.yaml to (needs kwok in it)")
    args = parser.parse_args(argv)
    state_dir = (args.state_dir or default_state_dir()).resolve()
    layout = Layout(state_dir)
    try:
        return _run(args, layout)
    except TestbedError as exc:
        print(f"testbed: {exc}", file=sys.stderr)
        return 1


def _run(args: argparse.Namespace, layout: Layout) -> int:
    if args.command == "up":
        with exclusive(layout):
            state = up(Settings(state_dir=layout.state_dir, extender_port=args.extender_port,
                                extender_ignorable=not args.strict_extender))
        verb = "reused" if state.get("reused") else f"ready in {state['ready_after_seconds']} s"
        print(f"testbed {verb}: {state['api_server']} ({state['nodes']} fake nodes)\n"
              f"  export KUBECONFIG={state['kubeconfig']}\n  state: {layout.state_json}")
        return 0
    if args.command == "nodes":
        if args.kubeconfig is None:
            raise TestbedError("nodes needs --kubeconfig")
        nodes = load_nodes(TESTBED_DIR / "nodes.yaml")
        created = create_nodes(args.kubeconfig.resolve(), nodes)
        waited = wait_nodes_ready(args.kubeconfig.resolve(), len(nodes), 120.0)
        print(f"{created} nodes created, {len(nodes)} Ready after {waited:.1f} s")
        return 0
    if args.command == "down":
        with exclusive(layout):
            stopped = down(layout)
        print(f"testbed stopped: {', '.join(stopped) or 'nothing was running'}")
        return 0
    current = load_state(layout)
    if args.command == "env":
        if current is None:
            raise TestbedError(f"no testbed state in {layout.state_dir}; run `up`")
        print(f"export KUBECONFIG={current['kubeconfig']}\nexport PATH={current['bin_dir']}:$PATH")
        return 0
    report = component_status(layout, current)
    if args.json:
        print(json.dumps({"state": current, "components": report}, indent=2))
    else:
        for name, s in report.items():
            word = "up" if s["healthy"] else ("unhealthy" if s["running"] else "down")
            print(f"{name:24s} {word:9s} pid={s['pid']} rss={s['rss_mib']} MiB")
    return 0 if all(s["healthy"] for s in report.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
