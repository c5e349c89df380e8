"""Estimates priced with the host probes the performance database holds (issue #30): per
device key, the newest probe of the version `step.host` reads, measured by a benchmark Job on a
node of that GPU type. The service reads them at each context load
(`interfaces.cli.serving.context_with_host_probes`), `gpuplan estimate|plan --host-probes-db URL`
once; a device without a stored probe keeps the bundle's default."""

from __future__ import annotations

import logging

from gpuplan_estimator.perfdb.store import PerfStore
from gpuplan_estimator.step import host

log = logging.getLogger(__name__)
READ_RETRIES = 2
"""Retries of the read at context load: a database that is down must not hold the service's
start-up for the store's full backoff (its estimates then use the bundle's default)."""


def probes_for_estimates(store: PerfStore) -> dict[str, host.HostProbe]:
    """Per device key, the newest stored probe `HostProbe` can read; a row it cannot read
    (figures missing) is logged and left out."""
    out = {}
    latest = store.latest_host_probes(per="device", probe_version=host.PROBE_VERSION)
    for device, stored in latest.items():
        try:
            out[device] = stored.host_probe()
        except ValueError as exc:
            log.warning("host probe %d of %s is not usable: %s", stored.id, device, exc)
    return out


def read_probes(db_url: str | None, *, retries: int = READ_RETRIES
                ) -> dict[str, host.HostProbe]:
    """`probes_for_estimates` of the database at `db_url` (None: the default one);
    `DatabaseError` when it cannot be read."""
    with PerfStore.open(db_url, retries=retries) as store:
        return probes_for_estimates(store)

