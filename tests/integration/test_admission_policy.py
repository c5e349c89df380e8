"""The chart's admission policy on the real apiserver: writing a TrainingJob's spec needs the
right to create Jobs in its namespace, and its pods' service account may not hold escalating
rights its writer lacks (docs/security.md).

The policy is rendered from the chart with the testbed's helm, renamed per test and bound to the
test's namespace only, so concurrent sessions on the shared testbed are not affected. Users are
impersonated by the admin (`kubectl --as`); RBAC and the policy's SubjectAccessReviews are the
apiserver's own.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
import yaml
from testbed_pytest import Kubectl, wait_for

from gpuplan_testing import operator_harness as h
from gpuplan_testing.helm_render import render

POLICY_KINDS = ("ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding")
JOBS_DENIED = "may not create jobs.batch in namespace"


def chart_policy(*sets: str) -> list[dict[str, Any]]:
    out = render(*sets)
    assert out.returncode == 0, out.stderr
    return [d for d in yaml.safe_load_all(out.stdout) if d and d["kind"] in POLICY_KINDS]


@pytest.fixture
def policy(kubectl: Kubectl, namespace: str, testbed: Any) -> Iterator[str]:
    h.install_crd(kubectl)
    docs = chart_policy()
    assert [d["kind"] for d in docs] == list(POLICY_KINDS)
    name = f"tj-creator-{namespace}"[:63].rstrip("-")
    docs[0]["metadata"]["name"] = docs[1]["metadata"]["name"] = name
    docs[1]["spec"]["policyName"] = name
    docs[1]["spec"]["matchResources"] = {
        "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}}}
    kubectl("apply", "-f", "-", input=json.dumps({"kind": "List", "apiVersion": "v1",
                                                  "items": docs}))
    status = wait_for(
        lambda: (s := kubectl.json("get", "validatingadmissionpolicy", name).get("status", {}))
        and "typeChecking" in s and s, 60, "the policy's type check")
    assert not status["typeChecking"].get("expressionWarnings"), status
    yield name
    kubectl("delete", "validatingadmissionpolicybinding,validatingadmissionpolicy", name,
            "--ignore-not-found", "--wait=false")


def grant(kubectl: Kubectl, namespace: str, role: str, subject: dict[str, str],
          rules: list[dict[str, Any]]) -> None:
    kubectl("apply", "-n", namespace, "-f", "-", input=json.dumps({
        "apiVersion": "v1", "kind": "List", "items": [
            {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
             "metadata": {"name": role}, "rules": rules},
            {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
             "metadata": {"name": role},
             "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": role},
             "subjects": [subject]}]}))


def user(name: str) -> dict[str, str]:
    return {"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": name}


TJ_RIGHTS = [{"apiGroups": ["gpuplan.io"], "resources": ["trainingjobs"],
              "verbs": ["create", "get", "list", "patch", "update"]}]
JOB_RIGHTS = [{"apiGroups": ["batch"], "resources": ["jobs"], "verbs": ["create"]}]
SECRET_RIGHTS = [{"apiGroups": [""], "resources": ["secrets"], "verbs": ["get"]}]


def create_as(kubectl: Kubectl, namespace: str, who: str, body: dict[str, Any],
              dry_run: bool = False) -> Any:
    args = ["create", "-n", namespace, f"--as={who}", "-f", "-"]
    return kubectl(*args, *(["--dry-run=server"] if dry_run else []), input=json.dumps(body),
                   check=False)


def tj(name: str, service_account: str | None = None, field: str = "serviceAccountName") -> Any:
    body = h.trainingjob(name)
    if service_account is not None:
        body["spec"]["template"]["spec"][field] = service_account
    return body


def test_creating_a_trainingjob_needs_the_right_to_create_jobs(
        kubectl: Kubectl, namespace: str, policy: str) -> None:
    grant(kubectl, namespace, "tj-author", user("alice"), TJ_RIGHTS)
    # alice may create TrainingJobs (RBAC) but not Jobs: the policy refuses, naming why.
    denied = wait_for(lambda: (p := create_as(kubectl, namespace, "alice", tj("a"), True))
                      .returncode != 0 and JOBS_DENIED in p.stderr and p, 60,
                      "the policy to refuse alice")
    assert f"alice {JOBS_DENIED} {namespace}" in denied.stderr
    real = create_as(kubectl, namespace, "alice", tj("a"))
    assert real.returncode != 0 and JOBS_DENIED in real.stderr
    assert kubectl("get", "trainingjob", "a", "-n", namespace, check=False).returncode != 0
    # Granted Jobs, the same request passes and the object exists.
    grant(kubectl, namespace, "job-author", user("alice"), JOB_RIGHTS)
    wait_for(lambda: create_as(kubectl, namespace, "alice", tj("a"), True).returncode == 0, 60,
             "alice's create to pass once she may create Jobs")
    created = create_as(kubectl, namespace, "alice", tj("a"))
    assert created.returncode == 0, created.stderr
    assert kubectl.json("get", "trainingjob", "a", "-n", namespace)["metadata"]["name"] == "a"


def test_spec_updates_are_checked_and_metadata_updates_are_not(
        kubectl: Kubectl, namespace: str, policy: str) -> None:
    grant(kubectl, namespace, "tj-author", user("bob"), TJ_RIGHTS)
    kubectl("create", "-n", namespace, "-f", "-", input=json.dumps(tj("b")))  # as admin
    wait_for(lambda: JOBS_DENIED in create_as(kubectl, namespace, "bob", tj("probe"), True)
             .stderr, 60, "the policy to be live")
    spec = kubectl("patch", "trainingjob", "b", "-n", namespace, "--as=bob", "--type=merge",
                   "-p", '{"spec":{"training":{"epochs":2}}}', check=False)
    assert spec.returncode != 0 and f"bob {JOBS_DENIED}" in spec.stderr
    meta = kubectl("annotate", "trainingjob", "b", "-n", namespace, "--as=bob", "note=x",
                   check=False)
    assert meta.returncode == 0, meta.stderr


@pytest.mark.parametrize("field", ["serviceAccountName", "serviceAccount"])
def test_pods_service_account_may_not_hold_rights_its_writer_lacks(
        kubectl: Kubectl, namespace: str, policy: str, field: str) -> None:
    grant(kubectl, namespace, "author", user("carol"), TJ_RIGHTS + JOB_RIGHTS)
    kubectl("create", "serviceaccount", "reader", "-n", namespace)
    grant(kubectl, namespace, "reader", {"kind": "ServiceAccount", "name": "reader",
                                         "namespace": namespace}, SECRET_RIGHTS)
    denied = wait_for(
        lambda: (p := create_as(kubectl, namespace, "carol", tj("c", "reader", field), True))
        .returncode != 0 and p, 60, "the policy to refuse the secret-reading account")
    assert (f"serviceaccount {namespace}/reader, which may get secrets while carol may not"
            in denied.stderr), denied.stderr
    # An account without such rights (here the namespace's default) is fine.
    plain = create_as(kubectl, namespace, "carol", tj("c"))
    assert plain.returncode == 0, plain.stderr
    # Once carol may read secrets herself, the account adds nothing she lacks.
    grant(kubectl, namespace, "carol-secrets", user("carol"), SECRET_RIGHTS)
    wait_for(lambda: create_as(kubectl, namespace, "carol", tj("d", "reader", field))
             .returncode == 0, 60, "carol's TrainingJob with the reader account")

