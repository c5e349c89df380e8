"""The learned predictor: a bundle's kernel models price work items; roofline for the rest."""

from __future__ import annotations

import operator
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from gpuplan_estimator.core import kernels, measurements, workload
from gpuplan_estimator.core.workload import WorkItem
from gpuplan_estimator.cost import aligned_gemm, features, roofline
from gpuplan_estimator.cost.predictors import FloatArray, LatencyPrediction, LatencyPredictor
from gpuplan_estimator.cost.roofline import RooflinePredictor
from gpuplan_estimator.devices.catalog import DeviceSpec
from gpuplan_estimator.latency import batch_split
from gpuplan_estimator.latency.bundles import Bundle
from gpuplan_estimator.latency.regressors import NO_CORRECTION, LayerLatencyModel, ProbeCorrection
from gpuplan_estimator.step import host, layout_credits


def _price_fused_io(items: Sequence[WorkItem], device: DeviceSpec,
                    parts: tuple[FloatArray, FloatArray, FloatArray], names: list[str]) -> None:
    """Rows a bundle model priced as their unfused kernel, moved to their fused kernel's
    roofline at the same efficiency (`roofline.fused_io_factors`), in place. Rows the fallback
    priced are its own business (the roofline applies it itself)."""
    idx, factor = roofline.fused_io_factors(items, device)
    learned = model_priced([names[i] for i in idx])
    for values in parts:
        values[idx[learned]] *= factor[learned]


LABEL_PREFIX = "lightgbm:"
"""`LatencyPrediction.predictor` labels of rows a bundle's models priced begin with this."""


def model_priced(labels: Sequence[str]) -> npt.NDArray[np.bool_]:
    """Per row, whether a bundle model priced it (its label begins with `LABEL_PREFIX`)."""
    return np.array([label.startswith(LABEL_PREFIX) for label in labels], dtype=bool)


def kernel_timing(predictor: LatencyPredictor, device: DeviceSpec) -> str:
    """How the rows whose models price `device` were timed (`host.KERNEL_TIMINGS`): eager calls
    for the shared gpu-ops backend, the stream for every other (`gpuplan bench`'s)."""
    backend_name = getattr(predictor, "backend_name", None)
    backend = backend_name(device) if callable(backend_name) else None
    return (host.EAGER_CALL_TIMING if backend in (None, measurements.SHARED_OPS_BACKEND)
            else host.STREAM_TIMING)


def backward_factors(predictor: LatencyPredictor, device: DeviceSpec) -> Mapping[str, float]:
    """Per kernel family, the factor by which `device`'s own bench rows measured its backward
    above (or below) what `step.backward` derives in forward-kernel passes: the bundle
    manifest's `backward_factors` (`training.backward_factors`) for the backend that prices
    `device`, for the families whose derived backward it corrects
    (`KernelFamily.backward_measured`). Empty on a CPU (there the isolated layer's autograd
    overhead does not carry over to a whole network: `training.backward_factors`) and for a
    backend no run timed with autograd (the shared gpu-ops rows)."""
    manifest = getattr(getattr(predictor, "bundle", None), "manifest", None)
    backend_name = getattr(predictor, "backend_name", None)
    if device.vendor == "cpu" or not isinstance(manifest, Mapping) or not callable(backend_name):
        return {}
    measured = manifest.get("backward_factors", {}).get(backend_name(device), {})
    return {kernel: float(measured[family.backward_group])
            for kernel, family in kernels.KERNEL_FAMILIES.items()
            if family.backward_measured and family.backward_group in measured}


ONE_WAVE_LABEL = f"{LABEL_PREFIX}gemm:transfer:one-wave"
"""`LatencyPrediction.predictor` of a sub-wave GEMM priced as one wave (`_price_sub_wave`)."""


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
        self.aligned_fit = bundle.aligned_gemm()
        self._cache: tuple[tuple[WorkItem, ...], list[_KernelGroup]] | None = None

    def with_aligned_gemm(self, fit: aligned_gemm.AlignedGemmFit | None) -> LearnedPredictor:
        """The same predictor with other tensor-core GEMM utilisations (None: none): what an
        evaluation holding one model out prices that model with."""
        other = LearnedPredictor(self.bundle, self.fallback, backend=self.backend)
        other.aligned_fit = fit
        return other

    def predict(self, items: Sequence[WorkItem], device: DeviceSpec) -> LatencyPrediction:
        """Each kernel's items priced by its bundle model (or the fallback), credits taken off."""
        return self.predict_many(items, [device])[0]

    def predict_many(self, items: Sequence[WorkItem], devices: Sequence[DeviceSpec]
                     ) -> list[LatencyPrediction]:
        """`predict` on each device, with one model call per kernel for all the devices that
        kernel's model covers: a plan prices one step on several devices, and a LightGBM call
        costs about as much for 40 rows as for 160. Rows are independent, so each device's
        numbers are exactly what pricing it alone gives."""
        codes = [self._backend_code(device) for device in devices]
        parts, names = self._model_parts(items, devices, codes)
        self._bound_by_halves(items, devices, codes, parts)
        out = []
        gemms = self._stream_fit_gemms(items)
        for i, device in enumerate(devices):
            if device.platform == "cpu":
                self._take_off_layout_credits(items, device, codes[i], parts[i])
            if gemms is not None:
                self._price_aligned(gemms, device, codes[i], parts[i], names[i])
            _price_fused_io(items, device, parts[i], names[i])
            median, p10, p90 = parts[i]
            out.append(LatencyPrediction(median_ms=median, p10_ms=p10, p90_ms=p90,
                                         predictor=tuple(names[i])))
        return out

    def _model_parts(self, items: Sequence[WorkItem], devices: Sequence[DeviceSpec],
                     codes: Sequence[int | None]
                     ) -> tuple[list[tuple[FloatArray, FloatArray, FloatArray]], list[list[str]]]:
        """Per device, each item's (median, P10, P90) ms from its kernel's model (or the
        fallback) and the label of what priced it."""
        n = len(items)
        parts = [(np.zeros(n), np.zeros(n), np.zeros(n)) for _ in devices]
        names = [["none"] * n for _ in devices]
        for group in self._groups(items):
            if group.kernel == "none":
                continue  # metadata-only work launches no kernel
            for i, priced, label in self._price_on_each(group, devices, codes):
                for values, kernel_values in zip(parts[i], priced, strict=True):
                    values[group.index] = kernel_values
                for j, row in enumerate(group.index):
                    names[i][row] = label[j]
        return parts, names

    def _bound_by_halves(self, items: Sequence[WorkItem], devices: Sequence[DeviceSpec],
                         codes: Sequence[int | None],
                         parts: list[tuple[FloatArray, FloatArray, FloatArray]]) -> None:
        """On each GPU, a convolution no dearer than two launches of its half batch, each half
        bounded the same way (`batch_split`), in place: every half down to batch 1 priced in
        one call."""
        gpus = [i for i, d in enumerate(devices) if d.platform != "cpu"]
        chains = batch_split.halving_chains(items)
        if not gpus or not chains.pieces:
            return
        grouped = self._cache  # the caller's items, priced again on the next device
        halves, _ = self._model_parts(chains.pieces, [devices[i] for i in gpus],
                                      [codes[i] for i in gpus])
        self._cache = grouped
        for i, half in zip(gpus, halves, strict=True):
            batch_split.bounded(parts[i], chains, half[0])

    def _backend_code(self, device: DeviceSpec) -> int | None:
        return self.bundle.backend_code(device, self._explicit_backend(device))

    def backend_name(self, device: DeviceSpec) -> str | None:
        """The backend whose rows price `device` (what they measured, how they were timed)."""
        return self.bundle.backend_name(device, self._explicit_backend(device))

    def _explicit_backend(self, device: DeviceSpec) -> str | None:
        return (self.backend.get(device.platform) if isinstance(self.backend, Mapping)
                else self.backend)

    def _price_on_each(
        self, group: _KernelGroup, devices: Sequence[DeviceSpec], codes: Sequence[int | None],
    ) -> list[tuple[int, tuple[FloatArray, FloatArray, FloatArray], Sequence[str]]]:
        """(device position, (median, P10, P90) ms, labels) of one kernel's items on each
        device: one model call per model for the devices it prices, the fallback for others."""
        out: list[tuple[int, tuple[FloatArray, FloatArray, FloatArray], Sequence[str]]] = []
        by_model: dict[int, list[tuple[int, _ModelChoice]]] = {}
        for i, device in enumerate(devices):
            choice = self._model_for(group.kernel, device)
            if choice.model is None or codes[i] is None or group.unique is None:
                pred = self.fallback.predict(group.items, device)
                out.append((i, (pred.median_ms, pred.p10_ms, pred.p90_ms), pred.predictor))
            else:
                by_model.setdefault(id(choice.model), []).append((i, choice))
        for members in by_model.values():
            assert group.unique is not None
            model = members[0][1].model
            assert model is not None
            features_of = [_kernel_features(group.unique, devices[i], codes[i], choice)
                           for i, choice in members]
            q = model.predict_quantiles(np.vstack([x for x, _ in features_of]))
            start = 0
            for (i, choice), (_, base) in zip(members, features_of, strict=True):
                rows = slice(start, start + len(base))
                start = rows.stop
                ratios = {k: v[rows] if choice.transfer_kind is None else
                          features.bounded_log_ratio(group.kernel, v[rows], choice.transfer_kind)
                          for k, v in q.items()}
                med, lo, hi = _scaled(ratios, base, choice.correction)
                tags = np.full(len(base), f"{LABEL_PREFIX}{group.kernel}{choice.tag}", dtype=object)
                if choice.tag == ":transfer" and group.kernel == "gemm":
                    self._price_sub_wave(group.unique, devices[i], codes[i], (med, lo, hi),
                                         tags)
                out.append((i, (med[group.inverse], lo[group.inverse], hi[group.inverse]),
                            tuple(str(t) for t in tags[group.inverse])))
        return out

    def _price_sub_wave(
        self, cols: features.WorkColumns, device: DeviceSpec, backend_code: int | None,
        parts: tuple[FloatArray, FloatArray, FloatArray], tags: npt.NDArray[np.object_],
    ) -> None:
        """GEMMs of one wave or less on a GPU the bundle never measured, priced as that wave
        (`features.one_wave_gemm`) instead of the transfer model's extrapolated efficiency, in
        place; the interval keeps its width relative to the median. A bundle without the
        one-wave scale leaves them as they are."""
        log_scale = self.bundle.sub_wave_log_scale()
        if log_scale is None:
            return
        assert backend_code is not None
        dev = features.broadcast_device(device, cols.dtype, backend_code, cols.kernel, cols.math)
        mask, wave_ms = features.one_wave_gemm(cols, dev, log_scale)
        med = parts[0]
        factor = wave_ms[mask] / med[mask]
        for values in parts:
            values[mask] *= factor
        tags[mask] = ONE_WAVE_LABEL

    def _stream_fit_gemms(self, items: Sequence[WorkItem]) -> _StreamFitGemms | None:
        """The rows `_price_aligned` may reprice, built once for every device: GEMMs outside
        a fused core (those run inside the attention kernel); None without a fit or such a
        GEMM."""
        if self.aligned_fit is None:
            return None
        idx = [i for i, it in enumerate(items)
               if it.kernel == "gemm" and workload.FUSED_IO_BYTES not in it.attributes]
        if not idx:
            return None
        chosen = [items[i] for i in idx]
        return _StreamFitGemms(np.asarray(idx), features.columns_from_items("gemm", chosen),
                               [aligned_gemm.fit_phase(it.phase) for it in chosen])

    def _price_aligned(
        self, gemms: _StreamFitGemms, device: DeviceSpec, backend_code: int | None,
        parts: tuple[FloatArray, FloatArray, FloatArray], names: list[str],
    ) -> None:
        """The tensor-core GEMMs the benchmarks miss (`cost.aligned_gemm`: aligned ones,
        vocabulary-sized unaligned ones) among `gemms` (`_stream_fit_gemms`) priced by their
        plan at their class's fitted utilisation in their phase, in place."""
        fit = self.aligned_fit
        if fit is None or not aligned_gemm.prices_device(device):
            return
        idx, cols = gemms.index, gemms.cols
        dev = features.broadcast_device(device, cols.dtype, backend_code or 0, "gemm", cols.math)
        mask, priced = aligned_gemm.price(cols, gemms.phases, device, dev, fit)
        rows = idx[mask]
        for values, new in zip(parts, priced, strict=True):
            values[rows] = new[mask]
        for row in rows:
            names[row] = aligned_gemm.LABEL

    def _take_off_layout_credits(
        self, items: Sequence[WorkItem], device: DeviceSpec, backend_code: int | None,
        parts: tuple[FloatArray, FloatArray, FloatArray],
    ) -> None:
        """Take the NCHWc reorders this host's convs skip off their rows' price, in place
        (`layout_credits`: ResNet-50 at batch 8, 74 ms predicted for 78 ms profiled)."""
        idx, copies = layout_credits.credited(items)
        if not idx:
            return
        group = self._group("memcpy", list(range(len(copies))), copies)
        [(_, (copy_ms, _, _), _)] = self._price_on_each(group, [device], [backend_code])
        for values in parts:
            layout_credits.take_off(values, idx, copy_ms)

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
            key = (item.dtype, item.op, str(item.attributes.get("math", "")),
                   *(item.dims.get(k) for k in keys))
            pos = first.get(key)
            if pos is None:
                pos = first[key] = len(reps)
                reps.append(item)
            inverse[j] = pos
        unique = features.columns_from_items(kernel, reps)
        return _KernelGroup(kernel, index, sub, unique, inverse)

    def _model_for(self, kernel: str, device: DeviceSpec) -> _ModelChoice:
        """The full model for devices in the training data, else the transfer model (with its
        columns and structure), corrected by the device's probe when it was probed; no model
        when the kernel's model never saw the device's platform, or when the kernel has no
        transfer model and its rows never held the device."""
        if not self.bundle.covers(kernel, device):
            return _ModelChoice(None, "", NO_CORRECTION)
        if device.platform == "cpu" and kernel in self.bundle.cpu_models:
            return _ModelChoice(self.bundle.cpu_models[kernel], "", NO_CORRECTION)
        transfer = self.bundle.transfer_models.get(kernel)
        probe = self.bundle.probe_correction(kernel, device)
        kind = str(self.bundle.manifest.get("transfer_kind", "roofline"))
        if transfer is None and self.bundle.transfer_models \
                and not self.bundle.has_timed(kernel, device):
            # A bundle that transfers leaves a kernel without when it was timed on one GPU
            # only: that kernel's full model knows no other.
            return _ModelChoice(None, "", NO_CORRECTION)
        if transfer is not None and (probe is not None or not self.bundle.has_seen(device)):
            tag = ":transfer+probe" if probe is not None else ":transfer"
            return _ModelChoice(transfer, tag, probe if probe is not None else NO_CORRECTION,
                                kind)
        return _ModelChoice(self.bundle.models.get(kernel), "", NO_CORRECTION)


@dataclass(frozen=True)
class _KernelGroup:
    kernel: str
    index: npt.NDArray[np.intp]  # positions of this kernel's items in the request
    items: tuple[WorkItem, ...]
    unique: features.WorkColumns | None  # distinct shapes; None when no model prices them
    inverse: npt.NDArray[np.intp]  # row of `unique` for each item


@dataclass(frozen=True)
class _StreamFitGemms:
    index: npt.NDArray[np.intp]  # positions of the GEMMs in the request
    cols: features.WorkColumns
    phases: list[str]  # aligned_gemm.fit_phase of each


@dataclass(frozen=True)
class _ModelChoice:
    model: LayerLatencyModel | None
    tag: str
    correction: ProbeCorrection
    transfer_kind: str | None = None  # the transfer model's structure; None for the full model


def _kernel_features(
    cols: features.WorkColumns, device: DeviceSpec, backend_code: int | None,
    choice: _ModelChoice,
) -> tuple[FloatArray, FloatArray]:
    """The model's feature rows of `cols` on `device`, and each row's base (ms): the roofline
    one for the full model, the transfer structure's for a transfer model."""
    assert backend_code is not None
    dev = features.broadcast_device(device, cols.dtype, backend_code, cols.kernel, cols.math)
    x, base = features.feature_matrix(cols, dev)
    if choice.transfer_kind is None:
        return x, base
    return features.transfer_matrix(cols, dev, x, base, choice.transfer_kind)


def _scaled(q: Mapping[str, FloatArray], base: FloatArray, correction: ProbeCorrection
            ) -> tuple[FloatArray, FloatArray, FloatArray]:
    """Median, P10, P90 ms from predicted log ratios, times the probe `correction`."""
    scale = base * correction.factor(base)
    return scale * np.exp(q["median"]), scale * np.exp(q["p10"]), scale * np.exp(q["p90"])
