"""Small real model bundles (one LightGBM softmax model) for tests of bundle storage: fitted in
well under a second, saved with `latency.bundles.save_bundle`, with the provenance fields a
trained bundle's manifest carries (`data_digest`, `rows`, `commit`, `metrics`, `devices`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from gpuplan_estimator.cost import features
from gpuplan_estimator.latency import bundles, regressors

FAST: dict[str, Any] = {"n_estimators": 15, "num_leaves": 7, "min_child_samples": 5, "n_jobs": 1}


def tiny_bundle(directory: Path, *, seed: int = 0, commit: str = "abc1234", rows: int = 300,
                devices: tuple[str, ...] = ("t4",)) -> Path:
    """A bundle in `directory` whose softmax model depends on `seed` (different seeds predict
    differently); its manifest names `commit`, `rows` and held-out metrics for `devices`."""
    rng = np.random.default_rng(seed)
    n_feat = len(features.feature_names("softmax"))
    x = rng.normal(size=(rows, n_feat))
    y = (0.5 + seed) * x[:, 0] + rng.normal(0, 0.05, rows)
    model = regressors.LayerLatencyModel(**FAST).fit(x, y)
    cols = features.transfer_columns("softmax")
    transfer = regressors.LayerLatencyModel(**FAST).fit(x[:, cols], y)
    metrics = {"softmax": {
        "random_split": {"mape_pct": 10.0 + seed, "rows": rows // 5},
        "random_split_by_device": {d: {"mape_pct": 10.0 + seed, "rows": rows // 5}
                                   for d in devices}}}
    manifest = {"created": f"2026-01-0{seed % 9 + 1}T00:00:00+00:00", "backends": ["b"],
                "metrics": metrics, "commit": commit, "rows": rows, "devices": list(devices),
                "data_digest": f"sha256:{seed:064x}"}
    bundle = bundles.Bundle(models={"softmax": model}, manifest=manifest,
                            transfer_models={"softmax": transfer})
    return bundles.save_bundle(bundle, directory)
