"""Run a Helm release's Deployments as local processes, the way a kubelet would (issue #16).

The testbed has no kubelet and no container runtime: kwok marks the release's pods Running on
fake nodes. This harness supplies what a kubelet would do for each container of every Deployment
it reads from the API (never from the chart's files, so it runs whatever the chart renders):

* the process: the container's `command`/`args` ($(VAR) expanded), else the image's entrypoint,
  mapped to a local executable (`IMAGE_ENTRYPOINTS`, then the venv's console scripts and the
  testbed's binaries by name);
* the environment: `value`, `valueFrom` (secretKeyRef, configMapKeyRef, fieldRef) and `envFrom`
  resolved through the API, plus KUBERNETES_SERVICE_HOST/PORT pointing at the testbed's
  apiserver; nothing of the test's own environment (no KUBECONFIG, no admin certificate);
* volumes: configMap, secret, projected and emptyDir written to temporary directories, plus the
  ServiceAccount volume at /var/run/secrets/kubernetes.io/serviceaccount (a TokenRequest token
  bound to the pod kwok runs, the cluster CA, the namespace), unless automount is off. The
  process runs in its own user and mount namespace (`unshare`), so mount paths under /run, /tmp
  and /etc/hosts are real bind mounts: client libraries find the in-cluster token where they
  always look, and RBAC is exercised as the pod's own ServiceAccount. Mount paths that do not
  exist on this machine (/data, /etc/<x>) cannot be mounted without root, so they are rewritten
  in args and env instead (`MountPlan.rewrites`);
* Services: /etc/hosts maps `<svc>`, `<svc>.<ns>`, `<svc>.<ns>.svc[.cluster.local]` to
  127.0.0.1, where each Service's target port listens (a Service whose port differs from its
  target port cannot be emulated that way and is reported);
* probes: httpGet/tcpSocket polled on 127.0.0.1 as the kubelet polls the pod IP. A probe that
  sets `host` is refused: the kubelet would probe that host from the node, not the pod.

Test-only mappings, all in this file: `IMAGE_ENTRYPOINTS` (the Dockerfiles' ENTRYPOINT/CMD) and
`IMPLICIT_PORT_FLAGS` (kube-scheduler's secure port 10259 is not in its args; it gets a free
port through `--secure-port`, so concurrent test sessions never collide). The processes run as
root of their user namespace (the invoking user outside), not as `runAsUser`.
"""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import json
import os
import pathlib
import re
import shlex
import signal
import socket
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

SA_MOUNT = "/var/run/secrets/kubernetes.io/serviceaccount"
# The images' ENTRYPOINT and CMD (Dockerfile, benchmark-jobs/Dockerfile.cuda; kube-scheduler's
# image has no entrypoint, its Deployment names the command).
IMAGE_ENTRYPOINTS: dict[str, tuple[list[str], list[str]]] = {
    "ghcr.io/gpuplan/gpuplan": (["gpuplan"], ["serve", "--host", "0.0.0.0", "--port", "8080"]),
    "registry.k8s.io/kube-scheduler": ([], []),
}
# Ports a program opens without naming them in its args: executable name -> {port: flag}.
IMPLICIT_PORT_FLAGS: dict[str, dict[int, str]] = {"kube-scheduler": {10259: "--secure-port={port}"}}
BIND_IN_PLACE = ("/run/", "/var/run/", "/tmp/")  # exist here, or under a fresh tmpfs /run
REWRITTEN_MOUNTS = "/run/gpuplan-harness-mounts"  # where mount paths that cannot exist go
ROOT = pathlib.Path(__file__).resolve().parents[2]
HOST_STASH = "/run/gpuplan-harness-host"  # host directories a bind covers, to re-expose parts
TOKEN_SECONDS = 3600
PROBE_TIMEOUT_S = 2.0
_VAR = re.compile(r"\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)|\$\$")


class HarnessError(AssertionError):
    """Something the kubelet would do that the harness cannot, or a pod it would not run."""


# ---------------------------------------------------------------------------------------------
# Pure parts


def image_repository(image: str) -> str:
    """`registry:5000/a/b:tag@sha256:..` -> `registry:5000/a/b`."""
    name = image.split("@", 1)[0]
    last = name.rsplit("/", 1)
    if ":" in last[-1]:
        name = name[: name.rindex(":")]
    return name


def expand_vars(text: str, env: Mapping[str, str]) -> str:
    """Kubernetes' $(VAR) expansion: unknown references stay as written, `$$` is a `$`."""
    def sub(match: re.Match[str]) -> str:
        if match.group(0) == "$$":
            return "$"
        return env.get(match.group(1), match.group(0))

    return _VAR.sub(sub, text)


def container_argv(container: Mapping[str, Any]) -> list[str]:
    """The argv a runtime would exec: command+args, else the image's entrypoint and CMD."""
    command, args = container.get("command"), container.get("args")
    if command:
        return [*command, *(args or [])]
    repo = image_repository(container["image"])
    if repo not in IMAGE_ENTRYPOINTS:
        raise HarnessError(f"container {container['name']}: image {repo} has no command and no "
                           "entrypoint in IMAGE_ENTRYPOINTS")
    entrypoint, cmd = IMAGE_ENTRYPOINTS[repo]
    return [*entrypoint, *(cmd if args is None else args)]


def named_port(port: int | str, container: Mapping[str, Any]) -> int:
    """A probe's or Service's port: a number, or the name of one of the container's ports."""
    if isinstance(port, int) or str(port).isdigit():
        return int(port)
    for p in container.get("ports") or []:
        if p.get("name") == port:
            return int(p["containerPort"])
    raise HarnessError(f"container {container['name']}: no port named {port!r}")


@dataclasses.dataclass(frozen=True)
class Probe:
    """One kubelet probe of a container, as the harness polls it."""

    kind: str  # readiness | liveness | startup
    scheme: str  # HTTP | HTTPS | TCP
    path: str
    port: int

    def url(self, port_map: Mapping[int, int]) -> str:
        """The probe's URL on 127.0.0.1 after the test-only port remapping."""
        return f"{self.scheme.lower()}://127.0.0.1:{port_map.get(self.port, self.port)}{self.path}"


def probes_of(container: Mapping[str, Any]) -> list[Probe]:
    """The container's probes; `host` and exec probes are refused with the reason."""
    out = []
    for kind in ("startup", "readiness", "liveness"):
        spec = container.get(f"{kind}Probe")
        if not spec:
            continue
        where = f"container {container['name']} {kind}Probe"
        if "httpGet" in spec:
            get = spec["httpGet"]
            if get.get("host"):
                raise HarnessError(
                    f"{where} sets host: {get['host']!r}; the kubelet would send it to that host "
                    "as seen from the node, not to the pod, so it never reaches the container")
            out.append(Probe(kind, get.get("scheme", "HTTP").upper(), get.get("path", "/"),
                             named_port(get["port"], container)))
        elif "tcpSocket" in spec:
            if spec["tcpSocket"].get("host"):
                raise HarnessError(f"{where} sets host; the kubelet would connect to the node")
            out.append(Probe(kind, "TCP", "", named_port(spec["tcpSocket"]["port"], container)))
        else:
            raise HarnessError(f"{where}: only httpGet and tcpSocket probes are emulated")
    return out


def hosts_file(service_names: Sequence[str], namespace: str) -> str:
    """/etc/hosts with every spelling of the Services' DNS names on 127.0.0.1."""
    lines = ["127.0.0.1 localhost", "::1 localhost ip6-localhost ip6-loopback"]
    for svc in service_names:
        names = [svc, f"{svc}.{namespace}", f"{svc}.{namespace}.svc",
                 f"{svc}.{namespace}.svc.cluster.local"]
        lines.append("127.0.0.1 " + " ".join(names))
    return "\n".join(lines) + "\n"


def rewrite_paths(text: str, rewrites: Mapping[str, str]) -> str:
    """Replace each mount path (as a whole path prefix) in `text` with its local directory."""
    for target, local in sorted(rewrites.items(), key=lambda kv: -len(kv[0])):
        text = re.sub(rf"(?<![\w./-]){re.escape(target)}(?=/|$|[^\w.-])", local, text)
    return text


def _covers(target: str, path: str) -> bool:
    return path == target or path.startswith(target.rstrip("/") + "/")


def bind_order(binds: Sequence[tuple[str, str]]) -> list[tuple[str, str]]:
    """Bind mounts ordered so that none hides the source of a later one (e.g. /tmp last)."""
    hiding = [b for b in binds if any(_covers(b[1], src) for src, _ in binds)]
    return [b for b in binds if b not in hiding] + hiding


def sandbox_argv(binds: Sequence[tuple[str, str]], argv: Sequence[str],
                 keep: Sequence[str] = ()) -> list[str]:
    """`argv` in a fresh user+mount namespace with `binds` (source, target) mounted.

    /run becomes a tmpfs when a target lies under it, so that /var/run/secrets/... can be created
    without root; directories elsewhere must already exist (see the module docstring). Host paths
    in `keep` (the checkout, the virtualenv, the pod's directory) stay visible where a bind would
    hide them: a checkout under /tmp must survive the container's emptyDir on /tmp. The hidden
    originals are reached through a stash of the covering directory under /run.
    """
    lines = ["set -e"]
    hidden = [(i, target, path) for i, (_, target) in enumerate(binds) for path in keep
              if _covers(target, path)]
    if hidden or any(t.startswith(("/run/", "/var/run/")) for _, t in binds):
        lines.append("mount -t tmpfs tmpfs /run")
    stashes = {i: f"{HOST_STASH}/{i}" for i, _, _ in hidden}
    for i, stash in sorted(stashes.items()):
        lines.append(f"mkdir -p {stash}")
        lines.append(f"mount --bind {shlex.quote(binds[i][1])} {stash}")
    for source, target in bind_order(binds):
        if target.startswith(("/run/", "/var/run/")):
            lines.append(f"mkdir -p {shlex.quote(target)}")
        lines.append(f"mount --bind {shlex.quote(source)} {shlex.quote(target)}")
    for i, target, path in hidden:
        below = path[len(target.rstrip("/")):].lstrip("/")
        lines.append(f"mkdir -p {shlex.quote(path)}")
        lines.append(f"mount --bind {shlex.quote(f'{stashes[i]}/{below}')} {shlex.quote(path)}")
    lines.append('exec "$@"')
    return ["unshare", "--user", "--map-root-user", "--mount", "--propagation", "private", "--",
            "/bin/sh", "-c", "\n".join(lines), "pod-sandbox", *argv]


def sandbox_problem() -> str | None:
    """Why `sandbox_argv` cannot work on this machine (no unprivileged user namespaces), or
    None when it can."""
    try:
        out = subprocess.run(sandbox_argv([], ["/bin/true"]), capture_output=True, text=True,
                             timeout=30)
    except OSError as exc:
        return f"unshare is not available: {exc}"
    if out.returncode != 0:
        return ("the install test runs each container in a user+mount namespace, and `unshare "
                f"--user --map-root-user --mount` failed: {out.stderr.strip()} (allow "
                "unprivileged user namespaces, e.g. sysctl kernel.unprivileged_userns_clone=1)")
    return None


# ---------------------------------------------------------------------------------------------
# The cluster side: what the kubelet reads from the API


@dataclasses.dataclass(frozen=True)
class Cluster:
    """How the harness reaches the testbed: admin kubectl for reads, the apiserver for pods."""

    kubectl: Any  # testbed_pytest.Kubectl: called for text, .json(...) for objects
    api_host: str
    api_port: int
    ca_pem: bytes
    local_bins: Mapping[str, pathlib.Path]  # executable name -> local path

    def json(self, *args: str) -> Any:
        """`kubectl get ... -o json` as admin (the kubelet's own view)."""
        return self.kubectl.json(*args)

    def token(self, namespace: str, service_account: str, pod: Mapping[str, Any] | None,
              audience: str = "") -> str:
        """A TokenRequest token for `service_account`, bound to `pod` as the kubelet binds it;
        for `audience` when given (a projected token's), else the API server's."""
        args = ["create", "token", service_account, "-n", namespace,
                f"--duration={TOKEN_SECONDS}s"]
        if audience:
            args.append(f"--audience={audience}")
        if pod is not None:
            args += ["--bound-object-kind=Pod", f"--bound-object-name={pod['metadata']['name']}",
                     f"--bound-object-uid={pod['metadata']['uid']}"]
        return str(self.kubectl(*args).stdout.strip())


def _object_data(cluster: Cluster, kind: str, namespace: str, name: str) -> dict[str, bytes]:
    obj = cluster.json("get", kind, name, "-n", namespace)
    if kind == "secret":
        return {k: base64.b64decode(v) for k, v in (obj.get("data") or {}).items()}
    data = {k: v.encode() for k, v in (obj.get("data") or {}).items()}
    data.update({k: base64.b64decode(v) for k, v in (obj.get("binaryData") or {}).items()})
    return data


def _field_ref(path: str, pod: Mapping[str, Any], namespace: str, sa: str) -> str:
    fields = {"metadata.namespace": namespace, "metadata.name": pod["metadata"]["name"],
              "metadata.uid": pod["metadata"].get("uid", ""), "spec.serviceAccountName": sa,
              "spec.nodeName": pod.get("spec", {}).get("nodeName", ""),
              "status.podIP": "127.0.0.1", "status.hostIP": "127.0.0.1"}
    label = re.fullmatch(r"metadata\.(labels|annotations)\['(.+)'\]", path)
    if label:
        return str(pod["metadata"].get(label.group(1), {}).get(label.group(2), ""))
    if path not in fields:
        raise HarnessError(f"fieldRef {path} is not emulated")
    return fields[path]


def resolve_env(cluster: Cluster, container: Mapping[str, Any], pod: Mapping[str, Any],
                namespace: str, sa: str) -> dict[str, str]:
    """The container's environment as the kubelet builds it (envFrom first, then env)."""
    env: dict[str, str] = {}
    for source in container.get("envFrom") or []:
        kind, ref = (("configmap", source["configMapRef"]) if "configMapRef" in source
                     else ("secret", source["secretRef"]))
        data = _object_data(cluster, kind, namespace, ref["name"])
        env.update({source.get("prefix", "") + k: v.decode() for k, v in data.items()})
    for item in container.get("env") or []:
        if "valueFrom" not in item:
            env[item["name"]] = expand_vars(item.get("value", ""), env)
            continue
        ref = item["valueFrom"]
        if "secretKeyRef" in ref or "configMapKeyRef" in ref:
            kind, key_ref = (("secret", ref["secretKeyRef"]) if "secretKeyRef" in ref
                             else ("configmap", ref["configMapKeyRef"]))
            data = _object_data(cluster, kind, namespace, key_ref["name"])
            if key_ref["key"] not in data:
                raise HarnessError(f"env {item['name']}: {kind} {key_ref['name']} has no key "
                                   f"{key_ref['key']!r}")
            env[item["name"]] = data[key_ref["key"]].decode()
        elif "fieldRef" in ref:
            env[item["name"]] = _field_ref(ref["fieldRef"]["fieldPath"], pod, namespace, sa)
        else:
            raise HarnessError(f"env {item['name']}: valueFrom {sorted(ref)} is not emulated")
    return env


def _write_files(directory: pathlib.Path, files: Mapping[str, bytes]) -> None:
    for rel, blob in files.items():
        path = directory / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(blob)


def _selected(data: Mapping[str, bytes], items: Sequence[Mapping[str, Any]] | None
              ) -> dict[str, bytes]:
    if not items:
        return dict(data)
    return {i["path"]: data[i["key"]] for i in items}


def volume_files(cluster: Cluster, volume: Mapping[str, Any], namespace: str,
                 token: Callable[[str], str]) -> dict[str, bytes] | None:
    """A volume's files by relative path; None for an emptyDir (a fresh directory)."""
    if "emptyDir" in volume:
        return None
    if "configMap" in volume:
        ref = volume["configMap"]
        return _selected(_object_data(cluster, "configmap", namespace, ref["name"]),
                         ref.get("items"))
    if "secret" in volume:
        ref = volume["secret"]
        return _selected(_object_data(cluster, "secret", namespace, ref["secretName"]),
                         ref.get("items"))
    if "projected" in volume:
        files: dict[str, bytes] = {}
        for source in volume["projected"]["sources"]:
            if "serviceAccountToken" in source:
                projected = source["serviceAccountToken"]
                files[projected["path"]] = token(projected.get("audience", "")).encode()
            elif "configMap" in source or "secret" in source:
                kind = "configMap" if "configMap" in source else "secret"
                ref = source[kind]
                name = ref["name"]
                files.update(_selected(_object_data(cluster, kind.lower(), namespace, name),
                                       ref.get("items")))
            else:
                raise HarnessError(f"volume {volume['name']}: projected {sorted(source)} "
                                   "is not emulated")
        return files
    raise HarnessError(f"volume {volume['name']}: {sorted(set(volume) - {'name'})} is not "
                       "emulated (the install test runs without persistence)")


# ---------------------------------------------------------------------------------------------
# Running containers


@dataclasses.dataclass
class LocalContainer:
    """One container of one Deployment, run as a local process."""

    deployment: str
    name: str
    service_account: str
    argv: list[str]
    env: dict[str, str]
    binds: list[tuple[str, str]]
    rewrites: dict[str, str]
    keep: list[str]
    """Host paths that must stay visible in the sandbox (`sandbox_argv`)."""
    probes: list[Probe]
    port_map: dict[int, int]
    ports: list[int]
    log: pathlib.Path
    proc: subprocess.Popen[bytes] | None = None

    @property
    def label(self) -> str:
        """`deployment/container`, for messages."""
        return f"{self.deployment}/{self.name}"

    def log_text(self) -> str:
        """Everything the process wrote so far."""
        try:
            return self.log.read_text(errors="replace")
        except OSError:
            return ""

    def log_tail(self, lines: int = 30) -> str:
        """The last `lines` lines of its output, for assertion messages."""
        return "\n".join(self.log_text().splitlines()[-lines:])

    def local_port(self, port: int) -> int:
        """Where the container's `port` listens on this machine."""
        return self.port_map.get(port, port)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _port_in_use(port: int) -> bool:
    with socket.socket() as s:
        # As servers bind: a closed listener's TIME_WAIT connections do not count.
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("0.0.0.0", port))
        except OSError:
            return True
        return False


def deployment_pods(cluster: Cluster, namespace: str, deployment: Mapping[str, Any]
                    ) -> list[dict[str, Any]]:
    """The Deployment's pods (by its selector's matchLabels) that exist now."""
    labels = deployment["spec"]["selector"].get("matchLabels", {})
    selector = ",".join(f"{k}={v}" for k, v in labels.items())
    return list(cluster.json("get", "pods", "-n", namespace, "-l", selector)["items"])


def service_hosts(cluster: Cluster, namespace: str, deployments: Sequence[Mapping[str, Any]]
                  ) -> tuple[list[str], list[str]]:
    """(Services reachable as 127.0.0.1 by name, problems with those that are not)."""
    names, problems = [], []
    for svc in cluster.json("get", "services", "-n", namespace)["items"]:
        selector = svc["spec"].get("selector") or {}
        backends = [c for d in deployments
                    if selector and selector.items() <= d["spec"]["template"]["metadata"].get(
                        "labels", {}).items()
                    for c in d["spec"]["template"]["spec"]["containers"]]
        ok = True
        for port in svc["spec"].get("ports", []):
            target = port.get("targetPort", port["port"])
            numbers = set()
            for c in backends:
                with contextlib.suppress(HarnessError):
                    numbers.add(named_port(target, c))
            if numbers != {port["port"]}:
                ok = False
                problems.append(f"Service {svc['metadata']['name']} port {port['port']} -> "
                                f"targetPort {target} ({sorted(numbers)} in its pods): not the "
                                "same number, so /etc/hosts cannot stand in for it")
        if ok:
            names.append(svc["metadata"]["name"])
    return names, problems


def _hosts(cluster: Cluster, namespace: str, deployments: Sequence[Mapping[str, Any]],
           workdir: pathlib.Path) -> pathlib.Path:
    """The /etc/hosts file that resolves the namespace's Services to their local backends."""
    names, problems = service_hosts(cluster, namespace, deployments)
    if problems:
        raise HarnessError("; ".join(problems))
    workdir.mkdir(parents=True, exist_ok=True)
    hosts = workdir / "hosts"
    hosts.write_text(hosts_file(names, namespace))
    return hosts


def plan_containers(cluster: Cluster, namespace: str, workdir: pathlib.Path
                    ) -> list[LocalContainer]:
    """Every container of every Deployment in `namespace`, ready to start."""
    deployments = cluster.json("get", "deployments", "-n", namespace)["items"]
    hosts = _hosts(cluster, namespace, deployments, workdir)
    out = []
    for dep in deployments:
        out += _deployment_containers(cluster, namespace, dep, workdir, hosts)
    return out


def pod_containers(cluster: Cluster, namespace: str, pod: Mapping[str, Any],
                   workdir: pathlib.Path) -> list[LocalContainer]:
    """The containers of one bare Pod (a Helm test hook), ready to start; the namespace's
    Services resolve to the Deployments' local processes as for `plan_containers`."""
    deployments = cluster.json("get", "deployments", "-n", namespace)["items"]
    hosts = _hosts(cluster, namespace, deployments, workdir)
    labels = pod["metadata"].get("labels") or {}
    as_owner = {"metadata": {"name": pod["metadata"]["name"]},
                "spec": {"selector": {"matchLabels": labels},
                         "template": {"metadata": {"labels": labels}, "spec": pod["spec"]}}}
    return _deployment_containers(cluster, namespace, as_owner, workdir, hosts)


def report_exit(cluster: Cluster, namespace: str, pod: Mapping[str, Any], exit_code: int) -> None:
    """Write a finished container's outcome to its pod's status, as the kubelet would: phase
    Succeeded on exit 0, else Failed (kwok runs no containers, so it never ends a bare pod)."""
    phase = "Succeeded" if exit_code == 0 else "Failed"
    status = {"status": {"phase": phase, "conditions": [
        {"type": "Ready", "status": "False", "reason": "PodCompleted"}]}}
    cluster.kubectl("patch", "pod", pod["metadata"]["name"], "-n", namespace,
                    "--subresource=status", "--type=merge", "-p", json.dumps(status))


def _deployment_containers(cluster: Cluster, namespace: str, dep: Mapping[str, Any],
                           workdir: pathlib.Path, hosts: pathlib.Path) -> list[LocalContainer]:
    spec = dep["spec"]["template"]["spec"]
    sa = spec.get("serviceAccountName") or spec.get("serviceAccount") or "default"
    pods = deployment_pods(cluster, namespace, dep)
    pod = pods[0] if pods else {"metadata": {"name": dep["metadata"]["name"] + "-local"},
                                "spec": spec}
    bound = pod if pods else None
    token_cache: dict[str, str] = {}

    def token(audience: str = "") -> str:
        if audience not in token_cache:
            token_cache[audience] = cluster.token(namespace, sa, bound, audience)
        return token_cache[audience]

    pod_dir = workdir / dep["metadata"]["name"]
    volumes: dict[str, pathlib.Path] = {}
    for volume in spec.get("volumes") or []:
        vdir = pod_dir / "volumes" / volume["name"]
        vdir.mkdir(parents=True)
        files = volume_files(cluster, volume, namespace, token)
        if files is not None:
            _write_files(vdir, files)
        volumes[volume["name"]] = vdir
    sa_obj = cluster.json("get", "serviceaccount", sa, "-n", namespace)
    automount = spec.get("automountServiceAccountToken",
                         sa_obj.get("automountServiceAccountToken", True))
    if automount:
        sa_dir = pod_dir / "serviceaccount"
        _write_files(sa_dir, {"token": token().encode(), "ca.crt": cluster.ca_pem,
                              "namespace": namespace.encode()})
    out = []
    for c in spec["containers"]:
        mounts = {m["mountPath"]: volumes[m["name"]] / m.get("subPath", "")
                  for m in c.get("volumeMounts") or []}
        if automount and SA_MOUNT not in mounts:
            mounts[SA_MOUNT] = sa_dir
        out.append(_local_container(cluster, namespace, dep, c, pod, sa, mounts, hosts,
                                    pod_dir))
    return out


def _local_container(cluster: Cluster, namespace: str, dep: Mapping[str, Any],
                     c: Mapping[str, Any], pod: Mapping[str, Any], sa: str,
                     mounts: Mapping[str, pathlib.Path], hosts: pathlib.Path,
                     pod_dir: pathlib.Path) -> LocalContainer:
    binds = [(str(hosts), "/etc/hosts")]
    rewrites = {}
    for i, (target, local) in enumerate(sorted(mounts.items())):
        if target.startswith(BIND_IN_PLACE) or target in ("/tmp", "/run") or (
                pathlib.Path(target).is_dir() and not target.startswith(("/proc", "/sys"))):
            binds.append((str(local), target))
        else:
            # Under the sandbox's own tmpfs /run, so that a /tmp mount cannot hide it.
            rewrites[target] = f"{REWRITTEN_MOUNTS}/{i}"
            binds.append((str(local), rewrites[target]))
    env = {"PATH": f"{cluster.local_bins['gpuplan'].parent}:/usr/local/bin:/usr/bin:/bin",
           "HOME": str(pod_dir / "home"), "LANG": "C.UTF-8",
           "PYTHONDONTWRITEBYTECODE": "1",
           "KUBERNETES_SERVICE_HOST": cluster.api_host,
           "KUBERNETES_SERVICE_PORT": str(cluster.api_port),
           "KUBERNETES_SERVICE_PORT_HTTPS": str(cluster.api_port)}
    if os.environ.get("PYTHONPATH"):  # the code under test is the image's (another checkout)
        env["PYTHONPATH"] = os.environ["PYTHONPATH"]
    (pod_dir / "home").mkdir(parents=True, exist_ok=True)
    env.update(resolve_env(cluster, c, pod, namespace, sa))
    env = {k: rewrite_paths(v, rewrites) for k, v in env.items()}
    argv = [rewrite_paths(expand_vars(a, env), rewrites) for a in container_argv(c)]
    program = pathlib.PurePath(argv[0]).name
    if program not in cluster.local_bins:
        raise HarnessError(f"{dep['metadata']['name']}/{c['name']}: no local executable for "
                           f"{argv[0]!r} (known: {sorted(cluster.local_bins)})")
    argv[0] = str(cluster.local_bins[program])
    port_map = {}
    for port, flag in IMPLICIT_PORT_FLAGS.get(program, {}).items():
        port_map[port] = _free_port()
        argv.append(flag.format(port=port_map[port]))
    declared = [int(p["containerPort"]) for p in c.get("ports") or []]
    return LocalContainer(
        deployment=dep["metadata"]["name"], name=c["name"], service_account=sa, argv=argv,
        env=env, binds=binds, rewrites=rewrites, keep=_host_paths_to_keep(cluster, pod_dir),
        probes=probes_of(c), port_map=port_map,
        ports=declared, log=pod_dir / f"{c['name']}.log")


def _host_paths_to_keep(cluster: Cluster, pod_dir: pathlib.Path) -> list[str]:
    """The checkout, the interpreter's prefixes, the local executables and the pod's directory:
    the outermost of each nested set (a path inside another is kept with it)."""
    paths = {str(p) for p in (ROOT, pathlib.Path(sys.prefix), pathlib.Path(sys.base_prefix),
                              pod_dir, *(b.parent for b in cluster.local_bins.values()))}
    return sorted(p for p in paths if not any(q != p and _covers(q, p) for q in paths))


def start(container: LocalContainer) -> None:
    """Start the container's process in its sandbox; its declared ports must be free."""
    taken = [p for p in container.ports if _port_in_use(container.local_port(p))]
    if taken:
        raise HarnessError(f"{container.label}: ports {taken} are already in use on this "
                           "machine; give the chart value a free port")
    with open(container.log, "ab") as log:
        container.proc = subprocess.Popen(
            sandbox_argv(container.binds, container.argv, container.keep), env=container.env,
            stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
            start_new_session=True)


def stop(container: LocalContainer, grace_s: float = 10.0) -> None:
    """SIGTERM the process group (the kubelet's termination), SIGKILL after `grace_s`."""
    proc = container.proc
    if proc is None or proc.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(grace_s)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(5)


def _insecure() -> ssl.SSLContext:
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE  # the kubelet does not verify probe certificates either
    return ctx


def probe_ok(probe: Probe, port_map: Mapping[int, int]) -> bool:
    """One probe attempt: HTTP 200-399, or a TCP connect, within the timeout."""
    port = port_map.get(probe.port, probe.port)
    if probe.scheme == "TCP":
        try:
            socket.create_connection(("127.0.0.1", port), PROBE_TIMEOUT_S).close()
        except OSError:
            return False
        return True
    try:
        context = _insecure() if probe.scheme == "HTTPS" else None
        with urllib.request.urlopen(probe.url(port_map), timeout=PROBE_TIMEOUT_S,
                                    context=context) as resp:
            return 200 <= int(resp.status) < 400
    except urllib.error.HTTPError as exc:
        return 200 <= exc.code < 400
    except (OSError, ssl.SSLError):
        return False


def wait_ready(containers: Sequence[LocalContainer], timeout_s: float) -> dict[str, float]:
    """Poll every probe until each container is Ready (readiness and startup probes pass) and
    live (each liveness probe passed once); fail naming the container, with its log, when a
    process exits or time runs out. Returns seconds to ready per container."""
    started = time.monotonic()
    pending = {c.label: c for c in containers}
    ready_after: dict[str, float] = {}
    while pending:
        for label, c in list(pending.items()):
            assert c.proc is not None, f"{label} was never started"
            if c.proc.poll() is not None:
                raise HarnessError(f"{label} exited with {c.proc.returncode} before it was "
                                   f"ready (CrashLoopBackOff):\n{c.log_tail()}")
            if all(probe_ok(p, c.port_map) for p in c.probes):
                ready_after[label] = time.monotonic() - started
                del pending[label]
        if pending and time.monotonic() - started > timeout_s:
            details = "\n".join(f"--- {label}: probes {[p.url(c.port_map) for p in c.probes]}\n"
                                f"{c.log_tail()}" for label, c in pending.items())
            raise HarnessError(f"not ready after {timeout_s:.0f} s:\n{details}")
        time.sleep(0.5)
    return ready_after


@contextlib.contextmanager
def running(containers: Sequence[LocalContainer]) -> Iterator[Sequence[LocalContainer]]:
    """Start every container; stop them all on the way out."""
    try:
        for c in containers:
            start(c)
        yield containers
    finally:
        for c in containers:
            stop(c)


def forbidden_lines(text: str) -> list[str]:
    """Log lines where the API server refused the ServiceAccount (RBAC)."""
    return [line for line in text.splitlines()
            if re.search(r"forbidden|403", line, re.IGNORECASE) and "cannot" in line]


def kubeconfig_ca(kubeconfig: pathlib.Path) -> bytes:
    """The cluster CA of the testbed's kubeconfig (a file path or inline data)."""
    import yaml

    doc = yaml.safe_load(kubeconfig.read_text())
    cluster = doc["clusters"][0]["cluster"]
    if "certificate-authority-data" in cluster:
        return base64.b64decode(cluster["certificate-authority-data"])
    return pathlib.Path(cluster["certificate-authority"]).read_bytes()


def free_port_values(values: Any) -> Any:
    """An overlay giving every port-valued key of the chart's values (`port`, `*Port`, an
    integer) a free port: the release's containers share this machine's loopback with the
    testbed and with other test sessions, where a pod would have its own."""
    if not isinstance(values, dict):
        return None
    out = {}
    for key, value in values.items():
        if re.fullmatch(r"port|\w*Port", key) and isinstance(value, int) \
                and not isinstance(value, bool):
            out[key] = _free_port()
        else:
            sub = free_port_values(value)
            if sub:
                out[key] = sub
    return out


def merge(base: dict[str, Any], overlay: Mapping[str, Any]) -> dict[str, Any]:
    """`overlay` merged into a copy of `base`, recursively (Helm's order of values files)."""
    out = dict(base)
    for key, value in overlay.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), dict):
            out[key] = merge(out[key], value)
        else:
            out[key] = value
    return out


def local_bins(*directories: pathlib.Path) -> dict[str, pathlib.Path]:
    """Executable name -> path over `directories` (first wins): console scripts, testbed bins."""
    out: dict[str, pathlib.Path] = {}
    for directory in directories:
        for path in sorted(directory.iterdir()):
            if path.is_file() and os.access(path, os.X_OK):
                out.setdefault(path.name, path)
    return out


def scrape(url: str) -> str:
    """GET a /metrics page."""
    with urllib.request.urlopen(url, timeout=10) as resp:
        return str(resp.read().decode())


def dump(obj: Any) -> str:
    """Compact JSON for messages."""
    return json.dumps(obj, sort_keys=True)[:2000]
