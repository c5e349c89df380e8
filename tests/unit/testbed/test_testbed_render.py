"""Pure parts of the testbed: node pools, scheduler configs, kubeconfig, command lines, stages."""

from __future__ import annotations

import copy
import pathlib
from typing import Any

import pytest
import yaml
from testbed_commands import component_argvs
from testbed_common import COMPONENTS, TESTBED_DIR, Layout, Ports, TestbedError
from testbed_render import (
    coscheduling_scheduler_config,
    gpuplan_scheduler_config,
    kubeconfig,
    node_manifests,
    scheduler_config,
)

NODES_YAML = TESTBED_DIR / "nodes.yaml"


def shipped_pools() -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load(NODES_YAML.read_text())
    return doc


def test_shipped_node_pools_render_the_planned_cluster() -> None:
    nodes = node_manifests(shipped_pools(), str(NODES_YAML))
    by_product: dict[str, list[dict[str, Any]]] = {}
    for n in nodes:
        product = n["metadata"]["labels"].get("nvidia.com/gpu.product", "cpu")
        by_product.setdefault(product, []).append(n)
    assert {k: len(v) for k, v in by_product.items()} == {
        "NVIDIA-H100-80GB-HBM3": 4, "NVIDIA-A100-SXM4-80GB": 4, "NVIDIA-L4": 8, "cpu": 2}
    l4 = by_product["NVIDIA-L4"][0]
    assert l4["status"]["allocatable"]["nvidia.com/gpu"] == "4"
    assert l4["status"]["capacity"] == l4["status"]["allocatable"]
    assert l4["metadata"]["labels"]["nvidia.com/gpu.count"] == "4"
    assert l4["metadata"]["labels"]["nvidia.com/gpu.memory"] == "23034"
    assert l4["metadata"]["annotations"]["kwok.x-k8s.io/node"] == "fake"
    cpu = by_product["cpu"][0]
    assert "nvidia.com/gpu" not in cpu["status"]["allocatable"]
    assert not any(k.startswith("nvidia.com/") for k in cpu["metadata"]["labels"])
    assert len({n["metadata"]["name"] for n in nodes}) == len(nodes)


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda d: d["pools"][0].pop("count"), "pools[0].count: missing"),
        (lambda d: d["pools"][1].update(count="4"), "pools[1].count: expected int"),
        (lambda d: d["pools"][0]["gpu"].update(product="NVIDIA H100"), "pools[0].gpu.product"),
        (lambda d: d["pools"][2].update(namePrefix="L4_nodes"), "pools[2].namePrefix"),
        (lambda d: d["pools"][3].update(namePrefix="h100"), "duplicate node names"),
        (lambda d: d["pools"][0].update(count=10_000), "pools[0].count: 10000 not in"),
        (lambda d: d.update(kind="Nodes"), "kind: NodePools"),
        (lambda d: d.update(pools=[]), "'pools' must be a non-empty list"),
    ],
)
def test_bad_node_pools_name_the_field(mutate: Any, message: str) -> None:
    doc = copy.deepcopy(shipped_pools())
    mutate(doc)
    with pytest.raises(TestbedError, match=r"nodes\.yaml") as err:
        node_manifests(doc, str(NODES_YAML))
    assert message in str(err.value)


def test_gpuplan_scheduler_has_its_profile_and_an_ignorable_extender() -> None:
    config = gpuplan_scheduler_config("/s/kubeconfig", 18080)
    assert config["profiles"] == [{"schedulerName": "gpuplan-scheduler"}]
    assert config["clientConnection"] == {"kubeconfig": "/s/kubeconfig"}
    assert config["leaderElection"] == {"leaderElect": False}
    (extender,) = config["extenders"]
    assert extender["urlPrefix"] == "http://127.0.0.1:18080/extender"
    assert extender["ignorable"] is True
    assert extender["managedResources"] == [{"name": "nvidia.com/gpu", "ignoredByScheduler": False}]
    strict = gpuplan_scheduler_config("/s/kubeconfig", 18080, extender_ignorable=False)
    assert strict["extenders"][0]["ignorable"] is False


def test_default_scheduler_config_has_no_profile_or_extender() -> None:
    config = scheduler_config("/s/kubeconfig", scheduler_name=None)
    assert "profiles" not in config and "extenders" not in config


def test_coscheduling_profile_owns_the_queue_sort_and_sets_its_timeouts() -> None:
    config = coscheduling_scheduler_config("/s/kubeconfig", "gangs", permit_wait_s=7,
                                           backoff_s=1)
    (profile,) = config["profiles"]
    assert profile["schedulerName"] == "gangs" and "extenders" not in config
    assert profile["plugins"]["queueSort"] == {"enabled": [{"name": "Coscheduling"}],
                                               "disabled": [{"name": "*"}]}
    assert profile["plugins"]["multiPoint"] == {"enabled": [{"name": "Coscheduling"}]}
    assert profile["pluginConfig"] == [{"name": "Coscheduling", "args": {
        "permitWaitingTimeSeconds": 7, "podGroupBackoffSeconds": 1}}]


def test_kubeconfig_needs_absolute_paths() -> None:
    good = kubeconfig("https://127.0.0.1:1", "/p/ca.crt", "/p/admin.crt", "/p/admin.key")
    assert good["clusters"][0]["cluster"]["certificate-authority"] == "/p/ca.crt"
    with pytest.raises(TestbedError, match="cert path must be absolute"):
        kubeconfig("https://127.0.0.1:1", "/p/ca.crt", "admin.crt", "/p/admin.key")


def test_component_command_lines_use_the_chosen_ports_and_absolute_paths() -> None:
    ports = Ports(etcd_client=1001, etcd_peer=1002, apiserver=1003, controller_manager=1004,
                  scheduler_default=1005, scheduler_gpuplan=1006, kwok=1007, extender=1008)
    argvs = component_argvs(pathlib.Path("/bin-dir"), Layout(pathlib.Path("/state")), ports)
    assert tuple(argvs) == COMPONENTS
    assert "--etcd-servers=http://127.0.0.1:1001" in argvs["kube-apiserver"]
    assert "--secure-port=1003" in argvs["kube-apiserver"]
    assert "--secure-port=1006" in argvs["gpuplan-scheduler"]
    assert "--config=/state/config/sched-gpuplan.yaml" in argvs["gpuplan-scheduler"]
    assert "--server-address=127.0.0.1:1007" in argvs["kwok"]
    for name, argv in argvs.items():
        assert argv[0].startswith("/bin-dir/"), name
        listeners = [a for a in argv if a.startswith(("--bind-address", "--listen-",
                                                      "--server-address"))]
        assert listeners, name
        assert all("127.0.0.1" in a for a in listeners), (name, listeners)


def test_kwok_stage_file_covers_the_documented_lifecycle() -> None:
    stages = list(yaml.safe_load_all((TESTBED_DIR / "kwok-stages.yaml").read_text()))
    names = {s["metadata"]["name"] for s in stages}
    assert names == {"node-initialize", "node-heartbeat-with-lease", "pod-ready",
                     "pod-succeed-after", "pod-fail-after", "pod-complete-job", "pod-delete"}
    by_name = {s["metadata"]["name"]: s["spec"] for s in stages}
    job = by_name["pod-complete-job"]
    keys = {e["key"]: e["operator"] for e in job["selector"]["matchExpressions"]}
    assert keys['.metadata.annotations["testbed.io/fail-after"]'] == "DoesNotExist"
    assert keys['.metadata.annotations["testbed.io/succeed-after"]'] == "DoesNotExist"
    assert job["delay"]["durationMilliseconds"] == 2000
    assert "phase: Failed" in by_name["pod-fail-after"]["next"]["statusTemplate"]
    assert by_name["pod-delete"]["next"] == {"finalizers": {"empty": True}, "delete": True}
