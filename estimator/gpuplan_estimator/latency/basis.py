"""What a device's prediction rests on: its own measurements, a probe, or the spec sheet.

A user comparing GPUs should know that an H100 figure is extrapolated from its datasheet while a
T4 figure comes from T4 kernel measurements; every estimate carries this label.
"""

from __future__ import annotations

from typing import Any

from gpuplan_estimator.devices import user_catalog
from gpuplan_estimator.devices.catalog import DeviceSpec

MEASURED = "measured"
"""The bundle was trained on kernel measurements of this device."""
PROBED = "probed"
"""Spec-sheet transfer corrected by a few probe measurements of this device."""
EXTRAPOLATED = "extrapolated"
"""Spec-sheet transfer only: the bundle has no measurement of this device."""
ROOFLINE = "roofline"
"""No learned model at all: the analytic roofline."""
BASES: tuple[str, ...] = (MEASURED, PROBED, EXTRAPOLATED, ROOFLINE)


def data_basis(predictor: Any, device: DeviceSpec) -> str:
    """The basis of `predictor`'s figures for `device` (one of `BASES`)."""
    bundle = getattr(predictor, "bundle", None)
    if bundle is None:
        return ROOFLINE
    if bundle.has_seen(device):
        return MEASURED
    if (device.key in bundle.manifest.get("probe_offsets", {})
            and not user_catalog.respecified(device)):
        return PROBED
    return EXTRAPOLATED
