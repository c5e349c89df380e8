"""Keeps (or follows) the operator's leader Lease in the background (`core.leadership`)."""

from __future__ import annotations

import asyncio
import datetime
import logging
from collections.abc import Callable

from gpuplan_operator import kube
from gpuplan_operator.core import errors, leadership

LOG = logging.getLogger(__name__)


class LeaseKeeper:
    """`leading` is True while this replica holds the Lease; `run_forever` keeps it so."""

    def __init__(self, api: kube.Kube, *, namespace: str, name: str, me: str,
                 duration_s: float, clock: Callable[[], datetime.datetime]) -> None:
        self.api = api
        self.namespace = namespace
        self.name = name
        self.me = me
        self.duration_s = duration_s
        self.clock = clock
        self.leading = False

    async def once(self) -> bool:
        """Read the Lease, create, renew, take or follow it; returns `leading`."""
        found = await self.api.get_lease(self.namespace, self.name)
        view = leadership.parse_lease(found) if found is not None else None
        now = self.clock()
        step = leadership.next_step(view, self.me, now)
        if step is leadership.LeaseStep.FOLLOW:
            self._set(False)
            return False
        version = view.resource_version if view is not None else None
        written = await self.api.write_lease(self.namespace, leadership.lease_body(
            self.name, self.namespace, self.me, now, self.duration_s, version))
        self._set(written)
        return written

    def _set(self, leading: bool) -> None:
        if leading != self.leading:
            LOG.info("%s the lease %s/%s: cluster-wide loops %s here", "holding" if leading
                     else "not holding", self.namespace, self.name,
                     "run" if leading else "pause")
        self.leading = leading

    async def run_forever(self) -> None:
        """Renew three times per duration; a failure to reach the API stops leading (another
        replica may take over once the duration passes)."""
        while True:
            try:
                await self.once()
            except (errors.KubeApiUnavailableError, kube.ApiError) as exc:
                LOG.warning("lease %s/%s: %s", self.namespace, self.name, exc)
                self._set(False)
            await asyncio.sleep(self.duration_s / 3)
