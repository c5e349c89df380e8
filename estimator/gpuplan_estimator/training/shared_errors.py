"""The shared (model-wide) error a bundle makes on a GPU it has not measured, from op rows.

Leave one GPU out: a bundle fitted without GPU g prices g's op rows with its transfer models;
the rows of each kernel family are drawn into synthetic models (`planning.intervals`), over all
sizes and per duration band, and the log error of each synthetic model's family total is kept.
Pooled over the left-out GPUs, its RMS is the shared log-sigma `planning.intervals.step_interval`
adds for an unseen device. Only op rows enter: whole-model labels stay a test set.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

import numpy as np
import pandas as pd

from gpuplan_estimator import devices
from gpuplan_estimator.cost import features
from gpuplan_estimator.latency.bundles import Bundle
from gpuplan_estimator.planning import intervals
from gpuplan_estimator.training import fitting

FloatArray = intervals.FloatArray


HeldOut = tuple[FloatArray, FloatArray]
"""One kernel's op rows of a GPU left out: (measured ms, ms its transfer model predicted)."""


def transfer_predictions(bundle: Bundle, unseen_rows: pd.DataFrame, *,
                         resolve: fitting.DeviceResolver | None = None) -> dict[str, HeldOut]:
    """Per kernel: `unseen_rows` (op rows of one GPU the bundle was fitted without), measured
    and priced by `bundle`'s transfer models as an unseen GPU is."""
    resolve = resolve if resolve is not None else devices.resolve_device
    manifest = bundle.manifest
    default = manifest.get("default_backends", {}).get("gpu")
    out: dict[str, HeldOut] = {}
    for kernel, rows in unseen_rows.groupby("kernel"):
        transfer = bundle.transfer_models.get(str(kernel))
        if transfer is None or default is None:
            continue
        # Priced as `fitting.with_probes` prices probe rows: the transfer model on the GPU
        # default backend.
        kind = fitting.transfer_kind_of(manifest)
        data = fitting.kernel_data(rows.assign(backend=default), str(kernel), resolve,
                                   manifest["backends"], kind)
        predicted = data.transfer_base_ms * np.exp(features.bounded_log_ratio(
            str(kernel), transfer.predict(data.transfer_x), kind))
        out[str(kernel)] = (np.asarray(data.latency_ms, dtype=np.float64),
                            np.asarray(predicted, dtype=np.float64))
    return out


def pooled_sigmas(held_out_by_device: Mapping[str, Mapping[str, HeldOut]], *, seed: int = 0
                  ) -> dict[str, intervals.SharedSigma]:
    """Per kernel: `intervals.shared_sigma` over the devices that have rows of it."""
    kernels = sorted({k for rows in held_out_by_device.values() for k in rows})
    return {k: intervals.shared_sigma(
        {d: rows[k] for d, rows in held_out_by_device.items() if k in rows}, seed=seed)
        for k in kernels}


def with_shared_sigmas(bundle: Bundle, sigmas: Mapping[str, intervals.SharedSigma]) -> Bundle:
    """`bundle` whose manifest carries `sigmas` for unseen devices. A probed GPU gets the
    unseen GPU's figure: a probe lowers the bias, so that is the conservative side."""
    return dataclasses.replace(bundle, manifest={
        **bundle.manifest, intervals.MANIFEST_KEY: fitting.interval_sigma_table(sigmas)})
