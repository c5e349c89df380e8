"""The `restricted` Pod Security Standard's checks, for pod specs the chart and operator build.

Transcribed from https://kubernetes.io/docs/concepts/security/pod-security-standards/ (the
Baseline controls, which Restricted includes, then the Restricted ones), so a test can check a
pod spec before an API server labelled `pod-security.kubernetes.io/enforce=restricted` would.
Each violation names its control and field path.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

# Restricted "Volume Types": only these volume sources.
ALLOWED_VOLUME_SOURCES = frozenset({
    "configMap", "csi", "downwardAPI", "emptyDir", "ephemeral", "persistentVolumeClaim",
    "projected", "secret"})
# Baseline "Capabilities" allows adding these; Restricted allows only NET_BIND_SERVICE.
RESTRICTED_ADDABLE_CAPABILITIES = frozenset({"NET_BIND_SERVICE"})
SECCOMP_ALLOWED = frozenset({"RuntimeDefault", "Localhost"})
SAFE_SYSCTLS = frozenset({
    "kernel.shm_rmid_forced", "net.ipv4.ip_local_port_range", "net.ipv4.ip_unprivileged_port_start",
    "net.ipv4.tcp_syncookies", "net.ipv4.ping_group_range", "net.ipv4.ip_local_reserved_ports",
    "net.ipv4.tcp_keepalive_time", "net.ipv4.tcp_fin_timeout", "net.ipv4.tcp_keepalive_intvl",
    "net.ipv4.tcp_keepalive_probes"})


def _containers(pod: Mapping[str, Any]) -> Iterator[tuple[str, Mapping[str, Any]]]:
    for kind in ("initContainers", "containers", "ephemeralContainers"):
        for i, container in enumerate(pod.get(kind) or ()):
            yield f"spec.{kind}[{i}]", container


def _baseline(pod: Mapping[str, Any]) -> Iterator[str]:
    pod_sc = pod.get("securityContext") or {}
    for field in ("hostNetwork", "hostPID", "hostIPC"):
        if pod.get(field):
            yield f"Host Namespaces: spec.{field} must be unset or false"
    for i, volume in enumerate(pod.get("volumes") or ()):
        if "hostPath" in volume:
            yield f"HostPath Volumes: spec.volumes[{i}].hostPath is forbidden"
    for i, sysctl in enumerate(pod_sc.get("sysctls") or ()):
        if sysctl.get("name") not in SAFE_SYSCTLS:
            yield f"Sysctls: spec.securityContext.sysctls[{i}] {sysctl.get('name')!r} is unsafe"
    for where, c in _containers(pod):
        sc = c.get("securityContext") or {}
        if sc.get("privileged"):
            yield f"Privileged Containers: {where}.securityContext.privileged must be false"
        if (sc.get("windowsOptions") or {}).get("hostProcess"):
            yield f"HostProcess: {where}.securityContext.windowsOptions.hostProcess is forbidden"
        for j, port in enumerate(c.get("ports") or ()):
            if port.get("hostPort"):
                yield f"Host Ports: {where}.ports[{j}].hostPort must be unset or 0"
        if sc.get("procMount", "Default") != "Default":
            yield f"/proc Mount Type: {where}.securityContext.procMount must be Default"
        seccomp = (sc.get("seccompProfile") or {}).get("type")
        if seccomp == "Unconfined":
            yield f"Seccomp: {where}.securityContext.seccompProfile.type must not be Unconfined"


def violations(pod: Mapping[str, Any]) -> list[str]:
    """Every Baseline and Restricted control that pod spec `pod` breaks ([] when compliant)."""
    out = list(_baseline(pod))
    pod_sc = pod.get("securityContext") or {}
    for i, volume in enumerate(pod.get("volumes") or ()):
        sources = set(volume) - {"name"}
        if not sources <= ALLOWED_VOLUME_SOURCES:
            out.append(f"Volume Types: spec.volumes[{i}] uses {sorted(sources)}")
    if pod_sc.get("runAsUser") == 0:
        out.append("Running as Non-root user: spec.securityContext.runAsUser must not be 0")
    for where, c in _containers(pod):
        sc = c.get("securityContext") or {}
        if sc.get("allowPrivilegeEscalation") is not False:
            out.append(f"Privilege Escalation: {where}.securityContext.allowPrivilegeEscalation "
                       "must be false")
        if sc.get("runAsNonRoot", pod_sc.get("runAsNonRoot")) is not True:
            out.append(f"Running as Non-root: {where} needs runAsNonRoot: true (pod or container)")
        if sc.get("runAsUser") == 0:
            out.append(f"Running as Non-root user: {where}.securityContext.runAsUser must not "
                       "be 0")
        seccomp = (sc.get("seccompProfile") or pod_sc.get("seccompProfile") or {}).get("type")
        if seccomp not in SECCOMP_ALLOWED:
            out.append(f"Seccomp: {where} needs seccompProfile RuntimeDefault or Localhost "
                       "(pod or container)")
        caps = sc.get("capabilities") or {}
        if "ALL" not in (caps.get("drop") or ()):
            out.append(f"Capabilities: {where}.securityContext.capabilities.drop must hold ALL")
        added = set(caps.get("add") or ()) - RESTRICTED_ADDABLE_CAPABILITIES
        if added:
            out.append(f"Capabilities: {where} may add only NET_BIND_SERVICE, adds {sorted(added)}")
    return out


def pod_specs(docs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """`Kind/name` -> pod spec of every pod-bearing object among rendered manifests."""
    out: dict[str, dict[str, Any]] = {}
    for doc in docs:
        kind = doc.get("kind")
        if kind == "Pod":
            out[f"Pod/{doc['metadata']['name']}"] = doc["spec"]
        elif kind in {"Deployment", "StatefulSet", "DaemonSet", "ReplicaSet", "Job"}:
            out[f"{kind}/{doc['metadata']['name']}"] = doc["spec"]["template"]["spec"]
        elif kind == "CronJob":
            spec = doc["spec"]["jobTemplate"]["spec"]["template"]["spec"]
            out[f"{kind}/{doc['metadata']['name']}"] = spec
    return out
