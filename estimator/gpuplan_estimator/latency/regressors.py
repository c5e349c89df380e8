"""Learned per-kernel latency: sklearn-shaped LightGBM regressors and the probe correction.

Each `LayerLatencyModel` learns ``log(latency_ms / features.base_ms)`` for one kernel across
devices; `ProbeCorrection` shifts a transfer model toward a few probed rows of a new device.
`learned.LearnedPredictor` prices work items with them (one `predict` call per kernel) and falls
back to the roofline (named in `LatencyPrediction.predictor`) for kernels without a model.
"""

from __future__ import annotations

import math
import sys
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from types import ModuleType
from typing import TYPE_CHECKING, Any

import numpy as np

from gpuplan_estimator.core import errors
from gpuplan_estimator.cost.predictors import FloatArray

if TYPE_CHECKING:  # imported where it fits: LightGBM's import costs the CLI ~0.5 s (#34)
    import lightgbm as lgb

QUANTILES: Mapping[str, float] = {"p10": 0.1, "p90": 0.9}
_IMPORT_LOCK = threading.Lock()


def lightgbm_module() -> ModuleType:
    """LightGBM, imported without its pandas support when pandas is not loaded yet.

    `lightgbm.compat` imports pandas (and pyarrow behind it) only to accept DataFrames; this
    project hands LightGBM float64 numpy arrays only (`fit`, `predict`, bundle reads), and
    that import was ~0.5 s of the CPU time of `gpuplan estimate` (#34). A process that has
    pandas loaded already (training, eval) imports LightGBM as usual."""
    with _IMPORT_LOCK:
        if "lightgbm" in sys.modules or "pandas" in sys.modules:
            import lightgbm
            return lightgbm
        sys.modules["pandas"] = None  # type: ignore[assignment]  # `import pandas` fails
        try:
            import lightgbm
        finally:
            del sys.modules["pandas"]  # pandas imports normally afterwards
        return lightgbm


class LayerLatencyModel:
    """LightGBM regressor of the log efficiency ratio for one kernel, with P10/P90 quantiles.

    Keyword-only constructor that only stores (scikit-learn convention); `fit` validates and
    sets `boosters_` (keys ``median`` and, with ``quantiles=True``, ``p10``/``p90``).
    """

    def __init__(
        self, *, n_estimators: int = 200, num_leaves: int = 31, learning_rate: float = 0.05,
        min_child_samples: int = 20, subsample: float = 0.8, colsample_bytree: float = 0.8,
        linear_tree: bool = False, quantiles: bool = True, quantile_n_estimators: int = 100,
        random_state: int = 0, n_jobs: int = 2,
    ) -> None:
        self.n_estimators = n_estimators
        self.num_leaves = num_leaves
        self.learning_rate = learning_rate
        self.min_child_samples = min_child_samples
        self.subsample = subsample
        self.colsample_bytree = colsample_bytree
        self.linear_tree = linear_tree
        self.quantiles = quantiles
        self.quantile_n_estimators = quantile_n_estimators
        self.random_state = random_state
        self.n_jobs = n_jobs

    def get_params(self) -> dict[str, Any]:
        """The constructor's keyword arguments and their current values."""
        return {k: getattr(self, k) for k in (
            "n_estimators", "num_leaves", "learning_rate", "min_child_samples", "subsample",
            "colsample_bytree", "linear_tree", "quantiles", "quantile_n_estimators",
            "random_state", "n_jobs")}

    def fit(
        self, X: FloatArray, y: FloatArray, sample_weight: FloatArray | None = None
    ) -> LayerLatencyModel:
        """Fit on features ``X`` (n × d) and targets ``y`` = log(latency / base)."""
        lgb = lightgbm_module()
        X, y = np.asarray(X, dtype=np.float64), np.asarray(y, dtype=np.float64)
        if sample_weight is not None and (
                len(sample_weight) != len(y) or not (np.asarray(sample_weight) > 0).all()):
            raise errors.InvalidRequestError("sample_weight", "need one positive weight per row")
        if X.ndim != 2 or y.ndim != 1 or len(X) != len(y):
            raise errors.InvalidRequestError(
                "X", f"need X (n, d) and y (n,), got {X.shape}, {y.shape}")
        if len(y) < 2 * self.min_child_samples:
            raise errors.InvalidRequestError("y", f"{len(y)} rows are too few to fit")
        if not np.isfinite(y).all():
            raise errors.InvalidRequestError("y", "targets must be finite (latency > 0)")
        if self.n_estimators < 1 or self.num_leaves < 2 or self.quantile_n_estimators < 1:
            raise errors.InvalidRequestError(
                "n_estimators", "need n_estimators >= 1, num_leaves >= 2")
        objectives: dict[str, dict[str, Any]] = {"median": {"objective": "regression"}}
        if self.quantiles:
            objectives.update(
                {k: {"objective": "quantile", "alpha": a} for k, a in QUANTILES.items()})
        # Interval bounds need less resolution than the median, so they get fewer trees.
        self.boosters_ = {
            name: lgb.train({**self._params(), **obj}, lgb.Dataset(X, y, weight=sample_weight),
                            self.n_estimators if name == "median" else self.quantile_n_estimators)
            for name, obj in objectives.items()
        }
        self.n_features_in_ = X.shape[1]
        return self

    def predict(self, X: FloatArray) -> FloatArray:
        """Median log ratio per row."""
        return self.predict_quantiles(X)["median"]

    def predict_quantiles(self, X: FloatArray) -> dict[str, FloatArray]:
        """Log ratios per booster key; p10 ≤ median ≤ p90 is enforced row-wise."""
        boosters = self._fitted()
        X = np.asarray(X, dtype=np.float64)
        if X.ndim != 2 or X.shape[1] != self.n_features_in_:
            raise errors.InvalidRequestError(
                "X", f"expected {self.n_features_in_} features, got shape {X.shape}")
        out = {k: np.asarray(b.predict(X), dtype=np.float64) for k, b in boosters.items()}
        med = out["median"]
        out["p10"] = np.minimum(out.get("p10", med), med)
        out["p90"] = np.maximum(out.get("p90", med), med)
        return out

    @classmethod
    def from_boosters(
        cls, boosters: Mapping[str, lgb.Booster], params: Mapping[str, Any]
    ) -> LayerLatencyModel:
        """Rebuild a fitted model (used by `bundle` when loading text models)."""
        if "median" not in boosters:
            raise errors.BundleError("a latency model needs a 'median' booster")
        model = cls(**params)
        model.boosters_ = dict(boosters)
        model.n_features_in_ = boosters["median"].num_feature()
        return model

    def _fitted(self) -> dict[str, lgb.Booster]:
        boosters: dict[str, lgb.Booster] | None = getattr(self, "boosters_", None)
        if boosters is None:
            raise errors.BundleError("LayerLatencyModel is not fitted; call fit() first")
        return boosters

    def _params(self) -> dict[str, Any]:
        return {
            "num_leaves": self.num_leaves, "learning_rate": self.learning_rate,
            "min_data_in_leaf": self.min_child_samples, "bagging_fraction": self.subsample,
            "bagging_freq": 1 if self.subsample < 1.0 else 0,
            "feature_fraction": self.colsample_bytree, "linear_tree": self.linear_tree,
            "seed": self.random_state, "deterministic": True, "force_row_wise": True,
            "num_threads": self.n_jobs, "verbose": -1,
        }


@dataclass(frozen=True)
class ProbeCorrection:
    """Correction of the transfer model on one probed device and kernel, in log space.

    log(measured / predicted) ≈ log_offset + log_base_slope · clip(log(base_ms)). The offset is
    the device's constant (its launch floor, sustained clocks: no spec sheet gives them); the
    slope, kept small, how that gap changes from tiny kernels to big ones (layernorm leaving one
    GPU out, 20 probe rows: mean MAPE 15.6 % with the offset alone, 12.4 % with the slope).
    log(base_ms) is clipped to the probe rows' own range (`log_base_min`, `log_base_max`): a
    line through a few small kernels says nothing of kernels 100x larger, and extrapolating it
    made whole-model predictions worse than none (docs/latency-method.md).
    """

    log_offset: float
    log_base_slope: float
    log_base_min: float = -math.inf
    log_base_max: float = math.inf

    def factor(self, base_ms: FloatArray) -> FloatArray:
        """Multiplier of the transfer model's prediction per row."""
        log_base = np.clip(np.log(base_ms), self.log_base_min, self.log_base_max)
        return np.exp(self.log_offset + self.log_base_slope * log_base)


NO_CORRECTION = ProbeCorrection(0.0, 0.0)
