"""The operator may read Kueue's queues and flavors only when `kueue.enabled` says so."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from gpuplan_testing.helm_render import render


def operator_rules(*sets: str) -> list[dict[str, Any]]:
    out = render(*sets)
    assert out.returncode == 0, out.stderr
    docs = [d for d in yaml.safe_load_all(out.stdout) if d]
    role = next(d for d in docs if d["kind"] == "ClusterRole"
                and d["metadata"]["name"] == "t-gpuplan-operator")
    return list(role["rules"])


def test_kueue_rules_are_off_by_default() -> None:
    assert not [r for r in operator_rules() if "kueue.x-k8s.io" in r["apiGroups"]]


def test_kueue_enabled_grants_read_only_access() -> None:
    [rule] = [r for r in operator_rules("kueue.enabled=true")
              if "kueue.x-k8s.io" in r["apiGroups"]]
    assert rule["resources"] == ["localqueues", "clusterqueues", "resourceflavors"]
    assert rule["verbs"] == ["get", "list", "watch"]


@pytest.mark.parametrize("value", ["kueue.enabled=maybe", "kueue.queue=x"])
def test_kueue_values_are_checked(value: str) -> None:
    assert render(value).returncode != 0
