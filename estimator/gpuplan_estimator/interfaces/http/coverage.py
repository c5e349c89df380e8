"""`GET /v1/coverage`'s answer: measured rows per device beside the rows the bundle rests on."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import Any


def bundle_heldout_rows(manifest: Mapping[str, Any]) -> dict[str, int]:
    """Per device: held-out rows of the manifest's random-split metrics, over all kernels
    (``metrics[kernel]["random_split_by_device"][device]["rows"]``)."""
    out: dict[str, int] = {}
    metrics = manifest.get("metrics")
    for per_kernel in (metrics.values() if isinstance(metrics, Mapping) else ()):
        by_device = per_kernel.get("random_split_by_device") if isinstance(
            per_kernel, Mapping) else None
        for device, m in (by_device.items() if isinstance(by_device, Mapping) else ()):
            rows = m.get("rows") if isinstance(m, Mapping) else None
            if isinstance(rows, int | float) and not isinstance(rows, bool):
                out[str(device)] = out.get(str(device), 0) + int(rows)
    return out


def bundle_training_rows(manifest: Mapping[str, Any]) -> dict[str, int]:
    """Per device: the rows the bundle was trained on (the manifest's ``device_rows``, written
    by `gpuplan train` since issue #17); bundles from before it fall back to
    `bundle_heldout_rows`, the held-out rows their accuracy for the device rests on."""
    rows = manifest.get("device_rows")
    if not isinstance(rows, Mapping):
        return bundle_heldout_rows(manifest)
    return {str(d): int(n) for d, n in rows.items()
            if isinstance(n, int | float) and not isinstance(n, bool)}


def coverage_json(
    stored: Mapping[str, tuple[int, datetime | None]], bundle_devices: Iterable[str],
    catalog_keys: Iterable[str], *, bundle_rows: Mapping[str, int] | None = None,
    bundle_version: int | None = None,
) -> dict[str, Any]:
    """`GET /v1/coverage`: every catalog, bundle or database device, so absence means 0 rows;
    `bundle_rows` per device from `bundle_training_rows`."""
    in_bundle = set(bundle_devices)
    trained = bundle_rows or {}
    out: dict[str, Any] = {}
    for key in sorted({*catalog_keys, *in_bundle, *stored}):
        rows, newest = stored.get(key, (0, None))
        out[key] = {"measurements": rows,
                    "newest_run_unix": newest.timestamp() if newest is not None else None,
                    "in_bundle": key in in_bundle,
                    "bundle_rows": int(trained.get(key, 0))}
    return {"bundle_version": bundle_version, "devices": out}
