"""Which operator replica runs the cluster-wide loops: the holder of a coordination Lease
(issue #33).

kopf's peering pauses the event handlers of all but one replica, but the benchmark and
retraining loop is a plain task that every replica started, so each counted the same finished
Jobs and could start the same training twice. The holder of the Lease renews it every
`renew_s`; another replica takes it only once `duration_s` passed without a renewal. Pure: the
decision takes the Lease as read and the time; `leases` reads and writes it.
"""

from __future__ import annotations

import dataclasses
import datetime
import enum
from collections.abc import Mapping
from typing import Any

MICRO_TIME = "%Y-%m-%dT%H:%M:%S.%fZ"
"""`metav1.MicroTime` as the API server writes it."""


class LeaseStep(enum.Enum):
    """What a replica does with the Lease it read."""
    CREATE = "create"
    """No Lease yet: create it, holding it."""
    RENEW = "renew"
    """It holds the Lease: write a new renew time."""
    TAKE = "take"
    """Its holder stopped renewing: write this replica as holder."""
    FOLLOW = "follow"
    """Another replica holds a live Lease: leave it."""


@dataclasses.dataclass(frozen=True)
class LeaseView:
    """The fields of a Lease the decision reads."""
    holder: str
    renewed_at: datetime.datetime | None
    duration_s: float
    resource_version: str


def parse_lease(lease: Mapping[str, Any]) -> LeaseView:
    """The decision's view of a Lease object (JSON as the API server returns it)."""
    spec = lease.get("spec") or {}
    renewed = spec.get("renewTime")
    renewed_at = (datetime.datetime.fromisoformat(renewed.replace("Z", "+00:00"))
                  if isinstance(renewed, str) else None)
    return LeaseView(holder=str(spec.get("holderIdentity") or ""), renewed_at=renewed_at,
                     duration_s=float(spec.get("leaseDurationSeconds") or 0),
                     resource_version=str((lease.get("metadata") or {})
                                          .get("resourceVersion", "")))


def next_step(lease: LeaseView | None, me: str, now: datetime.datetime) -> LeaseStep:
    """What `me` does with `lease` at `now`."""
    if lease is None:
        return LeaseStep.CREATE
    if lease.holder == me:
        return LeaseStep.RENEW
    expired = (lease.renewed_at is None or not lease.holder
               or (now - lease.renewed_at).total_seconds() > lease.duration_s)
    return LeaseStep.TAKE if expired else LeaseStep.FOLLOW


def lease_body(name: str, namespace: str, me: str, now: datetime.datetime, duration_s: float,
               resource_version: str | None = None) -> dict[str, Any]:
    """A Lease held by `me`, renewed at `now`; with `resource_version`, a replace that fails
    (409) when another replica wrote the Lease since it was read."""
    metadata: dict[str, Any] = {"name": name, "namespace": namespace}
    if resource_version:
        metadata["resourceVersion"] = resource_version
    return {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": metadata,
            "spec": {"holderIdentity": me, "leaseDurationSeconds": int(duration_s),
                     "renewTime": now.astimezone(datetime.UTC).strftime(MICRO_TIME)}}
