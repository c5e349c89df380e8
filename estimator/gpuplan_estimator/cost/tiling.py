"""Tile-and-wave structure of GPU kernels: what transfers to a GPU no op row was measured on.

NeuSight-style (Lee et al., "Forecasting GPU Performance for Deep Learning Training and
Inference", ASPLOS 2025; method only, no code): a kernel's output is cut into tiles, the tiles run
in waves over the SMs, and one wave costs what ONE SM's share of the roofline allows (per-SM peak
FLOP/s = device peak / SMs, per-SM bandwidth = device bandwidth / SMs, L2 bandwidth where the
working set fits L2). The learned model then predicts only a bounded utilisation of that
structure from device-normalised features, so an unseen GPU changes the structure (SMs, per-SM
peaks, L2), not the regressor's input distribution.

Everything is vectorised over numpy columns, like `features`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from gpuplan_estimator.core.layers import DTYPE_BYTES

FloatArray = npt.NDArray[np.float64]

# Output tile shapes (rows x cols) a GEMM library picks from. fp32 SIMT: the cuBLAS sgemm
# kernels named in the shared gpu-ops data (`ampere_sgemm_128x64_tn`, `volta_sgemm_32x32_...`,
# `maxwell_sgemm_128x128_...`); 16-bit tensor-core kernels also run 256x128 tiles.
SIMT_TILES: tuple[tuple[int, int], ...] = ((128, 128), (128, 64), (64, 64), (32, 32))
TENSOR_CORE_TILES: tuple[tuple[int, int], ...] = ((256, 128), (128, 128), (128, 64), (64, 64))
# Split-K factors tried when the output has too few tiles to fill the GPU (the `splitKreduce`
# kernels of the data's 2-kernel linear rows).
SPLIT_K: tuple[int, ...] = (1, 2, 4, 8, 16)
# Tiles of 128x128 outputs use most of an SM's registers: one resident per SM; smaller tiles
# co-reside (2 for 128x64, 4 for 64x64, 8 for 32x32).
_TILE_AREA_PER_SM = 128.0 * 128.0
_MAX_TILES_PER_SM = 8.0
# L2 bandwidth per SM per clock: ~20 B/clk/SM measured on P100 (1625 GB/s), V100 (2156 GB/s)
# and T4 (1270 GB/s) by Jia et al., "Dissecting the NVIDIA Volta GPU Architecture via
# Microbenchmarking" (2018, Table 3.1) and "... Turing T4 ..." (2019). Used only where the
# working set fits L2; the learned term absorbs the rest.
L2_BYTES_PER_CLOCK_PER_SM = 20.0
# Memory-bound kernels: PyTorch's vectorised elementwise loop runs 128-thread blocks of 4
# elements per thread; a 2048-thread SM holds 16 of them.
_ELEMS_PER_BLOCK = 512.0
_BLOCKS_PER_SM = 16.0
# Row-wise kernels (softmax, norms, reductions): one block per row, about 8 resident per SM.
_ROWS_PER_SM = 8.0

TRANSFER_FEATURES: tuple[str, ...] = (
    "t_log_tiles", "t_log_waves", "t_wave_fill", "t_tail_fill", "t_log_tile_m", "t_log_tile_n",
    "t_log_split_k", "t_log_ws_over_l2", "t_log_tile_compute_over_memory", "t_log_struct_ms",
    "t_log_struct_over_roofline",
)


def is_tensor_core_dtype(dtype: str) -> bool:
    """16-bit (and 8-bit float) GEMMs run tensor-core tiles on the GPUs that have them."""
    return dtype in ("float16", "bfloat16", "float8")


def tensor_core_rows(dtypes: npt.NDArray[np.str_], math: npt.NDArray[np.str_] | None
                     ) -> npt.NDArray[np.bool_]:
    """Rows whose GEMM runs tensor-core tiles: 16/8-bit floats, and float32 asked for tf32
    (`features.WorkColumns.math`); plain float32 runs the SIMT sgemm tiles."""
    tensor = np.isin(dtypes, ("float16", "bfloat16", "float8"))
    if math is None:
        return tensor
    return tensor | ((np.asarray(dtypes) == "float32") & (np.asarray(math) == "tf32"))


TENSOR_CORE_ALIGN_BYTES = 16
"""cuBLAS runs its Hopper/Ampere tensor-core GEMMs (wgmma `nvjet`/`sm90_xmma`, `..._align4`/
`_align8` cutlass) only on operands whose rows start on 16 bytes; any dim off that falls back to
`_align1`/`_align2` kernels at a fraction of the rate (on the H200, a bf16 LM head over GPT-2's
50,257-token vocabulary ran at 95 TFLOP/s, its aligned layers at 490-650)."""
HALF_MODE = "half"
"""The tensor-core mode of 16-bit float GEMMs (`tensor_core_mode`), tf32's being "tf32"."""


def tensor_core_mode(dtypes: npt.NDArray[np.str_], math: npt.NDArray[np.str_] | None
                     ) -> npt.NDArray[np.str_]:
    """Per row, the tensor-core mode a GEMM runs in: `HALF_MODE` for 16-bit floats, "tf32"
    for float32 asked for tf32, "" for none (SIMT fp32, fp8 and the rest)."""
    dtypes = np.asarray(dtypes)
    mode = np.where(np.isin(dtypes, ("float16", "bfloat16")), HALF_MODE, "")
    if math is not None:
        mode = np.where((dtypes == "float32") & (np.asarray(math) == "tf32"), "tf32", mode)
    return mode.astype(np.str_)


def alignment_elements(m: FloatArray, k: FloatArray, n: FloatArray, dtype_bytes: FloatArray
                       ) -> FloatArray:
    """Per row, the largest power of two, up to one 16-byte vector of elements
    (`TENSOR_CORE_ALIGN_BYTES`), that divides every GEMM dim: the alignment (in elements) of
    the CUTLASS kernel cuBLAS can run (`..._align1`, `_align2`, ...)."""
    per_vector = np.maximum(TENSOR_CORE_ALIGN_BYTES // np.maximum(dtype_bytes, 1.0), 1.0)
    out = np.ones_like(per_vector)
    step = 2.0
    while step <= float(np.max(per_vector, initial=1.0)):
        divides = (m % step == 0) & (k % step == 0) & (n % step == 0) & (step <= per_vector)
        out = np.where(divides, step, out)
        step *= 2.0
    return out


KERNEL_ALIGNMENTS: Mapping[str, tuple[int, ...]] = {"tf32": (1, 4)}
"""Per tensor-core mode, the partial alignments (elements) cuBLAS has kernels for where they
are fewer than every power of two: BERT's tf32 vocabulary head (30,522, two floats of
alignment) ran CUTLASS `s1688gemm_..._align1` kernels forward and backward on the H200
(`docs/gpu-steps/2026-11-27-h200b`), as GPT-2's odd one did; its bf16 head ran `_align2`."""


def tensor_core_class(mode: str, elements: int, dtype_bytes: int) -> str:
    """The class a tensor-core GEMM's kernel falls in: its mode when aligned to a whole vector,
    else the mode with the alignment in elements of the kernel it runs ("half-align2": the
    largest of `KERNEL_ALIGNMENTS` its own alignment holds); "" without a mode."""
    if not mode:
        return ""
    if elements * dtype_bytes >= TENSOR_CORE_ALIGN_BYTES:
        return mode
    kernel = max((a for a in KERNEL_ALIGNMENTS.get(mode, (elements,)) if a <= elements),
                 default=1)
    return f"{mode}-align{kernel}"


def sub_wave(plan: Mapping[str, FloatArray]) -> npt.NDArray[np.bool_]:
    """Rows whose plan (`gemm_plan`, split-K included) has no more tiles than one wave holds:
    their time is one wave of per-tile work, which nothing measured on large GEMMs (many
    waves, the sustained efficiency a learned model extrapolates) describes."""
    return np.asarray(plan["tiles"] <= plan["slots"])


def one_wave_ms(plan: Mapping[str, FloatArray], floor_ms: FloatArray, log_scale: float
                ) -> FloatArray:
    """A sub-wave GEMM's time: its plan's wave (ceil(tiles / SMs) tiles on the busiest SM, each
    at that SM's share of the roofline) plus the launch floor, times ``exp(log_scale)``: how
    much slower than its roofline share one tile runs when an SM holds a single wave of them
    (fitted on the training GPUs' sub-wave rows, `training.fitting.fit_sub_wave`; about 2x on
    every GPU of the shared op data, as a lone CTA per SM cannot hide its latency). A negative
    scale counts as 0: no tile runs faster than its SM's roofline share."""
    return np.exp(max(log_scale, 0.0)) * (plan["time_ms"] + floor_ms)


def l2_gbps(sm_count: FloatArray, clock_mhz: FloatArray) -> FloatArray:
    """Estimated L2 bandwidth (GB/s) from SMs and clock (`L2_BYTES_PER_CLOCK_PER_SM`)."""
    return sm_count * clock_mhz * 1e-3 * L2_BYTES_PER_CLOCK_PER_SM


def effective_bw_gbps(
    ws_bytes: FloatArray, l2_mb: FloatArray, dram_gbps: FloatArray, l2_bw_gbps: FloatArray
) -> FloatArray:
    """Bandwidth seen by a working set: L2's for the part that fits L2, DRAM's for the rest
    (harmonic blend by the resident fraction)."""
    resident = np.clip(l2_mb * 1e6 / np.maximum(ws_bytes, 1.0), 0.0, 1.0)
    fast = np.maximum(l2_bw_gbps, dram_gbps)
    return 1.0 / (resident / fast + (1.0 - resident) / dram_gbps)


def wave_time_ms(
    tiles: FloatArray, flops_per_tile: FloatArray, bytes_per_tile: FloatArray,
    tiles_per_sm: FloatArray, peak_gflops: FloatArray, bw_gbps: FloatArray, sms: FloatArray,
) -> tuple[FloatArray, FloatArray]:
    """(time ms, waves): full waves of ``sms * tiles_per_sm`` tiles, then a tail wave holding
    the rest, each SM priced against its roofline share for the tiles it holds (a tail of a
    few tiles gets only those SMs' share of the bandwidth)."""
    slots = sms * tiles_per_sm
    full = np.floor(tiles / slots)
    rest = tiles - full * slots
    tail_per_sm = np.ceil(rest / sms)
    peak_sm = peak_gflops * 1e6 / sms  # FLOP per ms per SM
    bw_sm = bw_gbps * 1e6 / sms  # bytes per ms per SM
    per_tile = np.maximum(flops_per_tile / peak_sm, bytes_per_tile / bw_sm)
    return (full * tiles_per_sm + tail_per_sm) * per_tile, np.ceil(tiles / slots)


def gemm_plan(
    batch: FloatArray, m: FloatArray, n: FloatArray, k: FloatArray, dtype_bytes: FloatArray,
    tensor_core: npt.NDArray[np.bool_], unique_bytes: FloatArray, peak_gflops: FloatArray,
    bw_gbps: FloatArray, sms: FloatArray, l2_mb: FloatArray, clock_mhz: FloatArray,
) -> dict[str, FloatArray]:
    """The fastest (tile, split-K) of the candidate tiles for GEMMs [batch] (m x k) @ (k x n),
    under the per-SM wave roofline; the columns `TRANSFER_FEATURES` are built from.

    `unique_bytes`: the bytes of the operands and result (read once each when they fit L2).
    """
    shape = _GemmShape(batch, m, n, k, dtype_bytes, unique_bytes, peak_gflops, bw_gbps, sms,
                       l2_mb, l2_gbps(sms, clock_mhz))
    return _fastest(
        _tile_plan(shape, np.where(tensor_core, tc[0], simt[0]).astype(np.float64),
                   np.where(tensor_core, tc[1], simt[1]).astype(np.float64), split)
        for simt, tc in zip(SIMT_TILES, TENSOR_CORE_TILES, strict=True) for split in SPLIT_K)


LIBRARY_TILES: Mapping[str, tuple[tuple[int, int], ...]] = {
    HALF_MODE: ((256, 128), (128, 128), (128, 64)),
    "tf32": ((256, 128), (128, 128)),
}
"""Per tensor-core mode, the output tiles `library_gemm_plan` picks from. `gemm_plan`'s menu
prices a 64x64 tile (and, under tf32, a 128x64 one) at the SM's full share and lets a short K
split; cuBLAS's Hopper kernels do neither for a transformer's GEMMs (issue #30: the profiled
H200 steps of `docs/gpu-steps/2026-11-27-h200b` ran tf32 layers as 128x128 to 128x256
`sm90_xmma` tiles, `segment_k_off` in the forward, and bf16 ones as 96-256 wide `nvjet`
tiles). Held out by model, a class's utilisation then varies less between models: the log
ratio's spread over the profiled phases fell 0.18 -> 0.08 (tf32) and 0.10 -> 0.06 (half)."""


def library_gemm_plan(
    batch: FloatArray, m: FloatArray, n: FloatArray, k: FloatArray, dtype_bytes: FloatArray,
    mode: str, unique_bytes: FloatArray, peak_gflops: FloatArray, bw_gbps: FloatArray,
    sms: FloatArray, l2_mb: FloatArray, clock_mhz: FloatArray,
) -> dict[str, FloatArray]:
    """`gemm_plan` of tensor-core GEMMs in `mode` as a GEMM library runs them: the fastest
    tile of `LIBRARY_TILES[mode]`, K whole (ValueError for a mode without a menu)."""
    if mode not in LIBRARY_TILES:
        raise ValueError(f"no library tile menu for tensor-core mode {mode!r}")
    shape = _GemmShape(batch, m, n, k, dtype_bytes, unique_bytes, peak_gflops, bw_gbps, sms,
                       l2_mb, l2_gbps(sms, clock_mhz))
    return _fastest(_tile_plan(shape, np.full_like(m, float(tm)), np.full_like(m, float(tn)), 1)
                    for tm, tn in LIBRARY_TILES[mode])


@dataclass(frozen=True)
class _GemmShape:
    """The columns every candidate tile of `gemm_plan` is priced from."""
    batch: FloatArray
    m: FloatArray
    n: FloatArray
    k: FloatArray
    dtype_bytes: FloatArray
    unique_bytes: FloatArray
    peak_gflops: FloatArray
    bw_gbps: FloatArray
    sms: FloatArray
    l2_mb: FloatArray
    l2_bw_gbps: FloatArray


def _tile_plan(g: _GemmShape, tm: FloatArray, tn: FloatArray, split: int
               ) -> dict[str, FloatArray]:
    """One candidate: (tm x tn) output tiles, K split up to `split` ways."""
    per_sm = np.clip(_TILE_AREA_PER_SM / (tm * tn), 1.0, _MAX_TILES_PER_SM)
    out_tiles = g.batch * np.ceil(g.m / tm) * np.ceil(g.n / tn)
    # Split K only while the output tiles leave SMs idle, as cuBLAS does; and keep
    # at least 128 of K per split.
    fills = out_tiles >= g.sms * per_sm
    s = np.where(fills, 1.0, np.minimum(float(split), np.maximum(np.ceil(g.k / 128.0), 1.0)))
    tiles = out_tiles * s
    k_tile = np.ceil(g.k / s)
    flops_tile = 2.0 * tm * tn * k_tile
    # Panels every tile streams, and split-K's partial results written and re-read.
    panel_bytes = tiles * (tm + tn) * k_tile * g.dtype_bytes
    partial_bytes = np.where(s > 1, 2.0 * tiles * tm * tn * 4.0, 0.0)
    ws = g.unique_bytes + partial_bytes
    resident = np.clip(g.l2_mb * 1e6 / np.maximum(ws, 1.0), 0.0, 1.0)
    # Fitting L2, each operand comes from DRAM once; otherwise panels are re-read.
    dram = g.unique_bytes + partial_bytes + (1.0 - resident) * np.maximum(
        panel_bytes - g.unique_bytes, 0.0)
    bw = effective_bw_gbps(ws, g.l2_mb, g.bw_gbps, g.l2_bw_gbps)
    t, waves = wave_time_ms(tiles, flops_tile, dram / tiles, per_sm, g.peak_gflops, bw, g.sms)
    return {"time_ms": t, "tiles": tiles, "waves": waves, "slots": g.sms * per_sm,
            "tile_m": tm, "tile_n": tn, "split_k": s, "ws_bytes": ws,
            "compute_over_memory": (flops_tile / (g.peak_gflops / g.sms))
            / np.maximum(dram / tiles / (bw / g.sms), 1e-30)}


def _fastest(candidates: Iterable[dict[str, FloatArray]]) -> dict[str, FloatArray]:
    """Per row, the fastest candidate; strictly faster only, so ties keep the earlier (the
    bigger tile, the smaller split)."""
    best: dict[str, FloatArray] | None = None
    for cand in candidates:
        if best is None:
            best = cand
            continue
        take = cand["time_ms"] < best["time_ms"] * (1.0 - 1e-9)
        best = {key: np.where(take, cand[key], best[key]) for key in best}
    if best is None:
        raise ValueError("no candidate tile to plan a GEMM with")
    return best


def streaming_plan(
    elements: FloatArray, rows: FloatArray, row_wise: bool, flops: FloatArray, nbytes: FloatArray,
    peak_gflops: FloatArray, bw_gbps: FloatArray, sms: FloatArray, l2_mb: FloatArray,
    clock_mhz: FloatArray,
) -> dict[str, FloatArray]:
    """Memory-bound kernels: blocks of elements (or one block per row) in waves over the SMs,
    against per-SM bandwidth, with L2 bandwidth for the part of the working set L2 holds."""
    if row_wise:
        tiles = np.maximum(rows, 1.0)
        per_sm = np.full_like(tiles, _ROWS_PER_SM)
    else:
        tiles = np.maximum(np.ceil(elements / _ELEMS_PER_BLOCK), 1.0)
        per_sm = np.full_like(tiles, _BLOCKS_PER_SM)
    bw = effective_bw_gbps(nbytes, l2_mb, bw_gbps, l2_gbps(sms, clock_mhz))
    t, waves = wave_time_ms(tiles, flops / tiles, nbytes / tiles, per_sm, peak_gflops, bw, sms)
    ones = np.ones_like(tiles)
    return {"time_ms": t, "tiles": tiles, "waves": waves, "slots": sms * per_sm,
            "tile_m": ones, "tile_n": ones, "split_k": ones, "ws_bytes": nbytes,
            "compute_over_memory": (flops / (peak_gflops / sms))
            / np.maximum(nbytes / (bw / sms), 1e-30)}


def plan_features(plan: Mapping[str, FloatArray], l2_mb: FloatArray, roofline_ms: FloatArray
                  ) -> list[FloatArray]:
    """`TRANSFER_FEATURES` of a plan: counts and ratios only, no absolute spec."""
    tiles, waves, slots = plan["tiles"], np.maximum(plan["waves"], 1.0), plan["slots"]
    fill = tiles / (waves * slots)
    tail = (tiles - (waves - 1.0) * slots) / slots
    return [
        _log(tiles), _log(waves), fill, tail, _log(plan["tile_m"]), _log(plan["tile_n"]),
        _log(plan["split_k"]), _log(plan["ws_bytes"] / (np.maximum(l2_mb, 1e-3) * 1e6)),
        _log(plan["compute_over_memory"]), _log(plan["time_ms"]),
        _log(plan["time_ms"] / np.maximum(roofline_ms, 1e-12)),
    ]


def dtype_bytes_of(dtypes: npt.NDArray[np.str_]) -> FloatArray:
    """Bytes per element of each row's dtype."""
    return np.array([float(DTYPE_BYTES[str(d)]) for d in dtypes], dtype=np.float64)


def _log(x: FloatArray) -> FloatArray:
    return np.log2(np.maximum(x, 1e-12))
