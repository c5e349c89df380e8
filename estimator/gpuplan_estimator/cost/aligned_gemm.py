"""Tensor-core GEMMs the kernel benchmarks do not describe, priced by their tile-and-wave plan
at a utilisation fitted on profiled whole-model steps.

Every GEMM of a transformer layer has dims that are multiples of 64; cuBLAS runs them with its
fast wgmma kernels (`tiling.TENSOR_CORE_ALIGN_BYTES`). The kernel benchmarks draw shapes at
random, so almost none of their tensor-core rows are aligned (3 of the H200's 538), and a model
learned on them prices an aligned bf16 GEMM 3-5x too slow, a tf32 one about 2x (issue #30:
the profiled streams of `docs/gpu-steps/2026-11-27-h200b`). The other GEMM they miss is a
language model's output projection over its vocabulary: unaligned (GPT-2's 50,257 tokens) and
far past the benchmarks' 8,192 per dim, where the model's extrapolation is 1.4-2.8x too fast.

Such a GEMM is priced instead as its tile-and-wave plan (`features.tensor_core_gemm`: per-SM
roofline shares, tile and wave quantization, over the tiles the library runs) over the
utilisation its kernel class reaches of it (`tiling.tensor_core_class`: the mode, and the
alignment under a whole vector) in its phase (`phase_key`), fitted on the kernels a profiler
saw (`training.stream_fit`). The plan carries the GPU's SMs and peaks, so the figures carry to
an NVIDIA GPU that was not profiled.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from gpuplan_estimator.core import errors
from gpuplan_estimator.core.kernels import MIN_KERNEL_MS
from gpuplan_estimator.core.quantiles import Z90
from gpuplan_estimator.core.workload import Phase
from gpuplan_estimator.cost import features
from gpuplan_estimator.cost.predictors import FloatArray
from gpuplan_estimator.devices.catalog import DeviceSpec

MANIFEST_KEY = "aligned_gemm"
"""Where a bundle's manifest holds its `AlignedGemmFit` (`to_json`)."""
PROVENANCE_KEY = f"{MANIFEST_KEY}_provenance"
"""Where the manifest records how the fit was made (command, commit, rows, models)."""
LABEL = "stream-fit:gemm"
"""`LatencyPrediction.predictor` of a row priced here: a stream-timed price, which the eager-call
dispatch correction (`step.host.on_stream`) leaves as it is."""
VOCABULARY_MIN_DIM = 16384
"""An unaligned tensor-core GEMM is priced here only when a dim reaches this: an output
projection over a vocabulary (`benchmark-jobs/sweeps/gemm-vocab.yaml` draws n from here up).
Smaller unaligned shapes are what the benchmarks' random sweep drew and their model learned."""


FORWARD = "forward"
BACKWARD = "backward"
"""The step phases a utilisation may be fitted per (`phase_key`): a backward pass's GEMMs (the
input gradient, NN, and the weight gradient, NT, whose K is the tokens) run other layouts than
the forward's, and cuBLAS picks other kernels for them (on the H200 under tf32, Ampere CUTLASS
`s1688gemm` kernels for weight gradients; bf16 vocabulary heads ran 128x128 `sm75` tiles
forward, 256x128 backward: 1.6x the rate). An inference forward is a forward."""


def phase_key(kernel_class: str, phase: str) -> str:
    """The `AlignedGemmFit.log_util` key of a class's utilisation in one phase."""
    return f"{kernel_class}/{phase}"


def fit_phase(phase: Phase) -> str:
    """The phase (`FORWARD` or `BACKWARD`) whose utilisation prices an item of `phase`."""
    return BACKWARD if phase is Phase.BACKWARD else FORWARD


@dataclass(frozen=True)
class AlignedGemmFit:
    """Per tensor-core kernel class (`tiling.tensor_core_class`), and per class and phase
    (`phase_key`) where profiles held that phase: log(plan time / kernel time), the utilisation
    its kernels reach of their tile-and-wave plan; and the spread of a phase's log ratio around
    it, which sizes the interval."""

    log_util: Mapping[str, float] = field(default_factory=dict)
    """A plain dict, not a read-only proxy: predictors holding a fit are pickled to the
    service's workers."""
    log_sigma: float = 0.0

    def log_util_of(self, kernel_class: str, phase: str) -> float:
        """The class's log utilisation in `phase`: its phase's figure, else the class's over
        every phase (a bundle made before phases were fitted holds only those); NaN when the
        fit holds neither."""
        return self.log_util.get(phase_key(kernel_class, phase),
                                 self.log_util.get(kernel_class, math.nan))

    def to_json(self) -> dict[str, object]:
        """The manifest entry."""
        return {"log_util": dict(self.log_util), "log_sigma": self.log_sigma}

    @classmethod
    def from_json(cls, doc: Mapping[str, object], where: str = MANIFEST_KEY) -> AlignedGemmFit:
        """Parse a manifest entry; a clear error names the field that is wrong."""
        raw = doc.get("log_util")
        if not isinstance(raw, Mapping) or not raw:
            raise errors.InvalidRequestError(f"{where}.log_util",
                                             "must map tensor-core kernel classes to numbers")
        log_util = {str(k): _finite(v, f"{where}.log_util.{k}") for k, v in raw.items()}
        sigma = _finite(doc.get("log_sigma"), f"{where}.log_sigma")
        if sigma < 0:
            raise errors.InvalidRequestError(f"{where}.log_sigma", f"must be >= 0, not {sigma}")
        return cls(log_util, sigma)


def _finite(value: object, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or \
            not math.isfinite(float(value)):
        raise errors.InvalidRequestError(where, f"must be a finite number, not {value!r}")
    return float(value)


def prices_device(spec: DeviceSpec) -> bool:
    """Whether `spec` runs cuBLAS tensor-core kernels, the ones the utilisation was fitted on:
    an NVIDIA GPU (AMD's matrix cores run other libraries' kernels; a CPU has none)."""
    return spec.vendor == "nvidia"


def priced_classes(classes: npt.NDArray[np.str_], cols: features.WorkColumns
                   ) -> npt.NDArray[np.bool_]:
    """Rows this module prices when its fit holds their class: a whole-vector class
    (aligned), or a partial one with a dim of at least `VOCABULARY_MIN_DIM`."""
    largest = np.maximum.reduce([cols.dims["m"], cols.dims["k"], cols.dims["n"]])
    aligned = np.array(["-align" not in c for c in classes.tolist()], dtype=bool)
    return np.asarray((classes != "") & (aligned | (largest >= VOCABULARY_MIN_DIM)))


def price(cols: features.WorkColumns, phases: Sequence[str], spec: DeviceSpec,
          dev: features.DeviceColumns, fit: AlignedGemmFit
          ) -> tuple[np.ndarray, tuple[FloatArray, FloatArray, FloatArray]]:
    """Which gemm rows this module prices (`priced_classes`, a class `fit` holds, on a GPU
    whose spec sheet gives the mode a peak), and their (median, P10, P90) ms: plan time over
    the class's utilisation in the row's phase (`phases`: `fit_phase` of each row), never
    under `MIN_KERNEL_MS`."""
    if len(phases) != len(cols):
        raise ValueError(f"{len(phases)} phases for {len(cols)} gemm rows")
    classes, plan_ms = features.tensor_core_gemm(cols, dev)
    # A float32 row runs in a tensor-core mode only under tf32 (`tiling.tensor_core_mode`).
    has_peak = {d: ("tf32" if d == "float32" else features.PEAK_KEY.get(d, ""))
                in spec.peak_tflops for d in set(np.asarray(cols.dtype).tolist())}
    wanted = priced_classes(classes, cols)
    log_util = np.array([fit.log_util_of(str(c), p) if ok and has_peak[str(d)] else math.nan
                         for c, p, ok, d in zip(classes, phases, wanted, cols.dtype,
                                                strict=True)], dtype=np.float64)
    mask = np.isfinite(log_util)
    median = np.maximum(plan_ms * np.exp(-np.where(mask, log_util, 0.0)), MIN_KERNEL_MS)
    spread = math.exp(Z90 * fit.log_sigma)
    return mask, (median, median / spread, median * spread)
