"""Learned per-kernel latency: sklearn-shaped LightGBM models and the predictor built on them.

Each `LayerLatencyModel` learns ``log(latency_ms / features.base_ms)`` for one kernel across
devices; `LearnedPredictor` prices work items with one `predict` call per kernel and falls back
to the roofline (named in `LatencyPrediction.predictor`) for kernels without a model.
"""

from __future__ import annotations

import operator
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

import lightgbm as lgb
import numpy as np
import numpy.typing as npt

from gpuplan_estimator import errors, features
from gpuplan_estimator.devices import DeviceSpec
from gpuplan_estimator.framework import LAYOUT_CREDIT
from gpuplan_estimator.layers import OpFamily
from gpuplan_estimator.predictors import FloatArray, LatencyPrediction, LatencyPredictor
from gpuplan_estimator.roofline import RooflinePredictor
from gpuplan_estimator.workload import Phase, WorkItem

if TYPE_CHECKING:
    from gpuplan_estimator.bundle import Bundle

QUANTILES: Mapping[str, float] = {"p10": 0.1, "p90": 0.9}


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
        return {k: getattr(self, k) for k in (
            "n_estimators", "num_leaves", "learning_rate", "min_child_samples", "subsample",
            "colsample_bytree", "linear_tree", "quantiles", "quantile_n_estimators",
            "random_state", "n_jobs")}

    def fit(
        self, X: FloatArray, y: FloatArray, sample_weight: FloatArray | None = None
    ) -> LayerLatencyModel:
        """Fit on features ``X`` (n × d) and targets ``y`` = log(latency / base)."""
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
    """log(measured / predicted) ≈ log_offset + log_base_slope · log(base_ms) on one device
    and kernel. The offset is the device's constant (its launch floor, sustained clocks: no
    spec sheet gives them); the slope, kept small, how that gap changes from tiny kernels to
    big ones (layernorm leaving one GPU out, 20 probe rows: mean MAPE 15.6 % with the
    offset alone, 12.4 % with the slope)."""

    log_offset: float
    log_base_slope: float

    def factor(self, base_ms: FloatArray) -> FloatArray:
        """Multiplier of the transfer model's prediction per row."""
        return np.exp(self.log_offset + self.log_base_slope * np.log(base_ms))


NO_CORRECTION = ProbeCorrection(0.0, 0.0)
MAX_LAYOUT_CREDIT = 0.5
"""Largest share of a conv's time its layout credit may remove (the profiled reorders were
8-36 % of a single-Conv session)."""


class LearnedPredictor:
    """`predictors.LatencyPredictor` over a bundle; roofline (or `fallback`) for other kernels."""

    name = "lightgbm"

    def __init__(
        self, bundle: Bundle, fallback: LatencyPredictor | None = None, *,
        backend: str | Mapping[str, str] | None = None,
    ) -> None:
        """`backend`: one bundle backend name for every device, or one per platform
        (``{"cpu": "torch-2.15.0+cu132-cpu"}``); None or a missing platform = the bundle's
        default for the device."""
        self.bundle = bundle
        self.fallback: LatencyPredictor = fallback if fallback is not None else RooflinePredictor()
        self.backend = backend
        self._cache: tuple[tuple[WorkItem, ...], list[_KernelGroup]] | None = None

    def predict(self, items: Sequence[WorkItem], device: DeviceSpec) -> LatencyPrediction:
        n = len(items)
        median, p10, p90 = np.zeros(n), np.zeros(n), np.zeros(n)
        names = ["none"] * n
        backend = (self.backend.get(device.platform) if isinstance(self.backend, Mapping)
                   else self.backend)
        backend_code = self.bundle.backend_code(device, backend)
        for group in self._groups(items):
            if group.kernel == "none":
                continue  # metadata-only work launches no kernel
            parts, label = self._price(group, device, backend_code)
            median[group.index], p10[group.index], p90[group.index] = parts
            for j, i in enumerate(group.index):
                names[i] = label[j]
        if device.platform == "cpu":
            self._take_off_layout_credits(items, device, backend_code, (median, p10, p90))
        return LatencyPrediction(median_ms=median, p10_ms=p10, p90_ms=p90, predictor=tuple(names))

    def _price(
        self, group: _KernelGroup, device: DeviceSpec, backend_code: int | None
    ) -> tuple[tuple[FloatArray, FloatArray, FloatArray], Sequence[str]]:
        """(median, P10, P90) ms and predictor labels of one kernel's items."""
        model, columns, tag, correction = self._model_for(group.kernel, device)
        if model is None or backend_code is None or group.unique is None:
            pred = self.fallback.predict(group.items, device)
            return (pred.median_ms, pred.p10_ms, pred.p90_ms), pred.predictor
        med, lo, hi = _predict_kernel(model, columns, group.unique, device, backend_code,
                                      correction)
        return ((med[group.inverse], lo[group.inverse], hi[group.inverse]),
                (f"lightgbm:{group.kernel}{tag}",) * len(group.items))

    def _take_off_layout_credits(
        self, items: Sequence[WorkItem], device: DeviceSpec, backend_code: int | None,
        parts: tuple[FloatArray, FloatArray, FloatArray],
    ) -> None:
        """Subtract, in place, the NCHWc reorders a conv's single-node rows timed but its
        model skips (`framework.layout_credits`), priced as this host's copies (transpose
        rows: ResNet-50 at batch 8, 74 ms predicted for 78 ms profiled). At most
        `MAX_LAYOUT_CREDIT` of the conv's own time comes off."""
        idx = [i for i, it in enumerate(items) if it.attributes.get(LAYOUT_CREDIT)]
        if not idx:
            return
        copies = [_copy_item(int(items[i].attributes[LAYOUT_CREDIT])) for i in idx]
        group = self._group("memcpy", list(range(len(copies))), copies)
        (copy_med, _, _), _ = self._price(group, device, backend_code)
        at = np.asarray(idx, dtype=np.intp)
        for values in parts:
            values[at] = np.maximum(values[at] - copy_med,
                                    (1.0 - MAX_LAYOUT_CREDIT) * values[at])

    def _groups(self, items: Sequence[WorkItem]) -> list[_KernelGroup]:
        """Items grouped by kernel with their distinct shapes; reused while the same items
        are priced on one device after another (a plan prices one step on ~20 devices)."""
        cached = self._cache
        if cached is not None and len(cached[0]) == len(items) and all(
                map(operator.is_, cached[0], items)):
            return cached[1]
        by_kernel: dict[str, list[int]] = {}
        for i, item in enumerate(items):
            by_kernel.setdefault(item.kernel, []).append(i)
        groups = [self._group(kernel, idx, items) for kernel, idx in by_kernel.items()]
        self._cache = (tuple(items), groups)
        return groups

    def _group(self, kernel: str, idx: list[int], items: Sequence[WorkItem]) -> _KernelGroup:
        sub = tuple(items[i] for i in idx)
        index = np.asarray(idx, dtype=np.intp)
        has_model = (kernel in self.bundle.models or kernel in self.bundle.transfer_models
                     or kernel in self.bundle.cpu_models)
        if kernel == "none" or not has_model:
            return _KernelGroup(kernel, index, sub, None, index)
        keys = features.KERNEL_DIMS[kernel]
        first: dict[tuple[object, ...], int] = {}
        reps: list[WorkItem] = []
        inverse = np.empty(len(sub), dtype=np.intp)
        for j, item in enumerate(sub):
            key = (item.dtype, item.op, *(item.dims.get(k) for k in keys))
            pos = first.get(key)
            if pos is None:
                pos = first[key] = len(reps)
                reps.append(item)
            inverse[j] = pos
        unique = features.columns_from_items(kernel, reps)
        return _KernelGroup(kernel, index, sub, unique, inverse)

    def _model_for(
        self, kernel: str, device: DeviceSpec
    ) -> tuple[LayerLatencyModel | None, npt.NDArray[np.intp] | None, str, ProbeCorrection]:
        """(model, its feature columns, label tag, probe correction): the full model for
        devices in the training data, else the transfer model, corrected by the device's probe
        when it was probed; no model when the kernel's model never saw the device's platform."""
        if not self.bundle.covers(kernel, device):
            return None, None, "", NO_CORRECTION
        if device.platform == "cpu" and kernel in self.bundle.cpu_models:
            return self.bundle.cpu_models[kernel], None, "", NO_CORRECTION
        transfer = self.bundle.transfer_models.get(kernel)
        probe = self.bundle.probe_correction(kernel, device)
        if transfer is not None and probe is not None:
            return transfer, features.transfer_columns(kernel), ":transfer+probe", probe
        if transfer is not None and not self.bundle.has_seen(device):
            return transfer, features.transfer_columns(kernel), ":transfer", NO_CORRECTION
        return self.bundle.models.get(kernel), None, "", NO_CORRECTION


def _copy_item(elements: int) -> WorkItem:
    """A reorder of `elements` float32 values: one strided copy (the memcpy bench kernel)."""
    return WorkItem(layer="layout", family=OpFamily.DATA_MOVEMENT, kernel="memcpy",
                    phase=Phase.FORWARD, dims=MappingProxyType({"elements": elements}),
                    dtype="float32", flops=0, bytes_moved=8 * elements, op="transpose",
                    role="layout_reorder")


@dataclass(frozen=True)
class _KernelGroup:
    kernel: str
    index: npt.NDArray[np.intp]  # positions of this kernel's items in the request
    items: tuple[WorkItem, ...]
    unique: features.WorkColumns | None  # distinct shapes; None when no model prices them
    inverse: npt.NDArray[np.intp]  # row of `unique` for each item


def _predict_kernel(
    model: LayerLatencyModel, columns: npt.NDArray[np.intp] | None,
    cols: features.WorkColumns, device: DeviceSpec, backend_code: int,
    correction: ProbeCorrection = NO_CORRECTION,
) -> tuple[FloatArray, FloatArray, FloatArray]:
    """Median, P10, P90 ms, times the device's probe `correction`."""
    dev = features.broadcast_device(device, cols.dtype, backend_code)
    x, base = features.feature_matrix(cols, dev)
    if columns is not None:
        x = x[:, columns]
    q = model.predict_quantiles(x)
    scale = base * correction.factor(base)
    return scale * np.exp(q["median"]), scale * np.exp(q["p10"]), scale * np.exp(q["p90"])
