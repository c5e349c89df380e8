"""Command lines of the control-plane processes (pure: paths and ports in, argv lists out).

Flags were checked against the pinned binaries (k8s v1.34.4 and v1.37.2, etcd v3.6.4, kwok
v0.7.0); see docs/testbed.md for what each non-obvious flag avoids.
"""

from __future__ import annotations

import pathlib

from testbed_common import Layout, Ports

SERVICE_CIDR = "10.0.0.0/24"
POD_CIDR = "10.244.0.0/16"


def component_argvs(bin_dir: pathlib.Path, layout: Layout, ports: Ports) -> dict[str, list[str]]:
    """argv per component name (keys match `testbed_common.COMPONENTS`)."""
    kcfg = str(layout.kubeconfig)
    return {
        "etcd": etcd_argv(bin_dir, layout, ports),
        "kube-apiserver": apiserver_argv(bin_dir, layout, ports),
        "kube-controller-manager": [
            str(bin_dir / "kube-controller-manager"),
            f"--kubeconfig={kcfg}",
            f"--authentication-kubeconfig={kcfg}",
            f"--authorization-kubeconfig={kcfg}",
            "--bind-address=127.0.0.1",
            f"--secure-port={ports.controller_manager}",
            "--leader-elect=false",
            f"--service-account-private-key-file={layout.pki_file('sa.key')}",
            f"--root-ca-file={layout.pki_file('ca.crt')}",
            f"--service-cluster-ip-range={SERVICE_CIDR}",
            # The node-lifecycle controller would evict pods after this long without kwok's lease.
            "--node-monitor-grace-period=60s",
        ],
        "kube-scheduler": scheduler_argv(bin_dir, layout, "sched-default.yaml",
                                         ports.scheduler_default),
        "gpuplan-scheduler": scheduler_argv(bin_dir, layout, "sched-gpuplan.yaml",
                                            ports.scheduler_gpuplan),
        "kwok": [
            str(bin_dir / "kwok"),
            f"--kubeconfig={kcfg}",
            f"--config={layout.config / 'kwok.yaml'}",
            "--manage-all-nodes=false",
            "--manage-nodes-with-annotation-selector=kwok.x-k8s.io/node=fake",
            "--node-lease-duration-seconds=40",
            f"--cidr={POD_CIDR}",
            "--node-ip=10.255.0.1",
            f"--server-address=127.0.0.1:{ports.kwok}",
        ],
    }


def etcd_argv(bin_dir: pathlib.Path, layout: Layout, ports: Ports) -> list[str]:
    client = f"http://127.0.0.1:{ports.etcd_client}"
    peer = f"http://127.0.0.1:{ports.etcd_peer}"
    return [
        str(bin_dir / "etcd"),
        "--name=testbed",
        f"--data-dir={layout.etcd_data}",
        f"--listen-client-urls={client}",
        f"--advertise-client-urls={client}",
        f"--listen-peer-urls={peer}",
        f"--initial-advertise-peer-urls={peer}",
        f"--initial-cluster=testbed={peer}",
        # Throw-away data: skipping fsync saves seconds per test on slow disks.
        "--unsafe-no-fsync=true",
        "--log-level=warn",
        "--quota-backend-bytes=2147483648",
    ]


def apiserver_argv(bin_dir: pathlib.Path, layout: Layout, ports: Ports) -> list[str]:
    pki = layout.pki_file
    return [
        str(bin_dir / "kube-apiserver"),
        f"--etcd-servers=http://127.0.0.1:{ports.etcd_client}",
        "--etcd-prefix=/registry",
        "--bind-address=127.0.0.1",
        # Without it, a machine with no default route fails with
        # "Unable to find suitable network address".
        "--advertise-address=127.0.0.1",
        f"--secure-port={ports.apiserver}",
        f"--tls-cert-file={pki('apiserver.crt')}",
        f"--tls-private-key-file={pki('apiserver.key')}",
        f"--cert-dir={layout.state_dir / 'apiserver-certs'}",
        f"--client-ca-file={pki('ca.crt')}",
        "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
        f"--service-account-key-file={pki('sa.pub')}",
        f"--service-account-signing-key-file={pki('sa.key')}",
        f"--service-cluster-ip-range={SERVICE_CIDR}",
        "--authorization-mode=RBAC",
        "--allow-privileged=true",
        # ServiceAccount: kwok pods need no token. TaintNodesByCondition: new Nodes would carry
        # node.kubernetes.io/not-ready until the node-lifecycle controller removed it.
        "--disable-admission-plugins=ServiceAccount,TaintNodesByCondition",
        # The loopback address would be written into the `kubernetes` Endpoints, which is invalid.
        "--endpoint-reconciler-type=none",
        "--enable-priority-and-fairness=false",
        "--profiling=false",
    ]


def scheduler_argv(bin_dir: pathlib.Path, layout: Layout, config_name: str, port: int) -> list[str]:
    kcfg = str(layout.kubeconfig)
    return [
        str(bin_dir / "kube-scheduler"),
        f"--config={layout.config / config_name}",
        f"--authentication-kubeconfig={kcfg}",
        f"--authorization-kubeconfig={kcfg}",
        "--bind-address=127.0.0.1",
        f"--secure-port={port}",
    ]
