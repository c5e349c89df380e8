"""GPU/CPU device specs (data in `data/gpus.yaml`) and name resolution.

One device type answers to its catalog key (``h100-sxm-80gb``), the NVML /
``torch.cuda.get_device_name()`` string (``NVIDIA H100 80GB HBM3``), the GPU Feature Discovery
label value (``NVIDIA-H100-80GB-HBM3``) and aliases, compared without case, spaces, dashes or
underscores. ``cpu`` is the local machine, calibrated by `cpuinfo`.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from gpuplan_estimator.core import errors, paths, precisions
from gpuplan_estimator.devices import mig

DEFAULT_CATALOG_PATH = paths.PACKAGE_DATA_DIR / "gpus.yaml"
CPU_KEY = "cpu"
MAX_CATALOG_BYTES = 1 << 20  # the shipped file is ~25 kB; a bigger one is a mistake
PEAK_DTYPES = ("fp64", "fp32", "tf32", "fp16", "bf16", "fp8")
VENDORS = ("nvidia", "amd")
SHIPPED = "shipped"
"""`DeviceSpec.catalog_source` of the devices in `data/gpus.yaml`."""


@dataclass(frozen=True)
class DeviceSpec:
    """Spec-sheet facts of one device type; units in the names.

    ``price_per_hour_usd == 0.0`` means no known price (see `has_price`), never "free".
    """

    key: str  # canonical catalog key, e.g. "h100-sxm-80gb"
    name: str  # marketing name
    vendor: str  # nvidia | amd | cpu
    memory_bytes: int
    mem_bandwidth_gbps: float  # GB/s, 1e9 bytes per second
    # dense, per dtype: fp32, tf32, fp16, bf16, fp8 (tensor cores where present)
    peak_tflops: Mapping[str, float]
    sm_count: int  # SMs (NVIDIA), CUs (AMD), physical cores (CPU)
    boost_clock_mhz: float
    l2_cache_mb: float
    tdp_watts: float = 0.0
    price_per_hour_usd: float = 0.0  # indicative, overridable
    interconnect: str = ""  # e.g. "nvlink4", "pcie4"
    interconnect_gbps: float = 0.0  # per-GPU bidirectional GB/s used for all-reduce
    nvml_names: tuple[str, ...] = ()
    gfd_products: tuple[str, ...] = ()  # nvidia.com/gpu.product label values
    cores_per_sm: int = 0
    base_clock_mhz: float = 0.0
    source: str = ""  # where the numbers come from
    extra: Mapping[str, float] = field(default_factory=dict)
    aliases: tuple[str, ...] = ()  # further accepted names, e.g. "H100 SXM"
    price_source: str = ""  # where price_per_hour_usd comes from
    notes: str = ""  # where the values differ from a datasheet, and why
    architecture: str = ""  # vendor's architecture name (volta, ampere, cdna3); "" for the CPU
    usable_memory_bytes: int = 0
    """What the driver gives processes (NVML's total, below the datasheet: ECC, reserved
    memory); 0 where not recorded. Read it through `step.memory.usable_memory_bytes`."""
    usable_memory_source: str = ""  # where usable_memory_bytes comes from
    catalog_source: str = SHIPPED
    """Which catalog the entry comes from: `SHIPPED`, or the user catalog file's path (#34)."""

    @property
    def platform(self) -> str:
        """"cpu" or "gpu": latency models, backends and bundles are kept apart by platform."""
        return "cpu" if self.vendor == "cpu" else "gpu"

    @property
    def has_price(self) -> bool:
        """Whether a positive hourly price is known for this device."""
        return self.price_per_hour_usd > 0.0


def normalize_name(name: str) -> str:
    """Lower-case with spaces, dashes and underscores removed: the resolver's comparison form."""
    return re.sub(r"[\s_\-]+", "", name.strip().lower())


# Vendor words users often leave out ("A100-SXM4-40GB", "MI300X").
_PREFIXES = ("nvidia", "tesla", "amdinstinct", "amd")
# GFD appends this to gpu.product when time-slicing/MPS sharing is on; the device is the same.
_SHARED_SUFFIX = "shared"


def _strip_prefix(norm: str) -> str:
    for prefix in _PREFIXES:
        if norm.startswith(prefix) and len(norm) > len(prefix):
            return norm[len(prefix):]
    return norm


@dataclass(frozen=True)
class Catalog:
    """The device types gpuplan knows, with a name index built once."""

    devices: tuple[DeviceSpec, ...]
    _index: Mapping[str, DeviceSpec] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_index", _build_index(self.devices))

    def resolve(self, name: str) -> DeviceSpec:
        """Key, NVML name, GFD label or alias → spec; `UnknownDeviceError` with suggestions."""
        norm = normalize_name(name)
        for candidate in (norm, _strip_prefix(norm)):
            spec = self._index.get(candidate)
            if spec is None and candidate.endswith(_SHARED_SUFFIX):
                spec = self._index.get(candidate[: -len(_SHARED_SUFFIX)])
            if spec is not None:
                return spec
        partitioned = self._resolve_mig(name)
        if partitioned is not None:
            return partitioned
        raise errors.UnknownDeviceError(name, self.suggest(name))

    def _resolve_mig(self, name: str) -> DeviceSpec | None:
        """A MIG profile of a catalog GPU (`mig`), derived from its parent; None when `name`
        is no MIG name. A profile NVIDIA's table lacks for that GPU is an unknown device."""
        parts = mig.split_name(name)
        if parts is None:
            return None
        parent = self.resolve(parts[0])
        profile = mig.profile_of(parent.key, parts[1])
        if profile is None:
            known = mig.PROFILES_BY_PARENT.get(parent.key, {})
            raise errors.UnknownDeviceError(name, tuple(f"{parent.key}-mig-{p}" for p in known))
        return _mig_device(parent, profile)

    def keys(self) -> tuple[str, ...]:
        """Catalog keys of all known devices, in catalog order."""
        return tuple(d.key for d in self.devices)

    def suggest(self, name: str, n: int = 3) -> tuple[str, ...]:
        """The `n` known names closest to `name` (keys, NVML names, GFD labels)."""
        names: dict[str, str] = {}
        for d in self.devices:
            for known in (d.key, *d.nvml_names, *d.gfd_products):
                names.setdefault(known.lower(), known)
        # A short query ("A100") scores low against long names, so names containing it go first.
        norm = _strip_prefix(normalize_name(name))
        containing = [k for k in self.keys() if norm and norm in normalize_name(k)]
        close = difflib.get_close_matches(name.strip().lower(), list(names), n=n, cutoff=0.4)
        ranked = dict.fromkeys([*containing, *(names[c] for c in close)])
        return tuple(ranked)[:n]


def _mig_device(parent: DeviceSpec, profile: mig.MigProfile) -> DeviceSpec:
    """One `profile` GPU instance of `parent` (`mig`): its compute slices' share of the SMs,
    peak rates, power and price, its memory slices' share of the memory, bandwidth and L2;
    architecture, clocks and cores per SM are the parent's."""
    compute = profile.compute_slices / mig.COMPUTE_SLICES
    memory = profile.memory_slices / mig.MEMORY_SLICES
    suffix = f"MIG-{profile.name}"
    return dataclasses.replace(
        parent,
        key=f"{parent.key}-mig-{profile.name}",
        name=f"{parent.name} {suffix}",
        memory_bytes=int(parent.memory_bytes * memory),
        usable_memory_bytes=int(parent.usable_memory_bytes * memory),
        mem_bandwidth_gbps=parent.mem_bandwidth_gbps * memory,
        l2_cache_mb=parent.l2_cache_mb * memory,
        peak_tflops={dtype: rate * compute for dtype, rate in parent.peak_tflops.items()},
        extra={k: v * compute for k, v in parent.extra.items()},
        sm_count=max(1, round(parent.sm_count * compute)),
        tdp_watts=parent.tdp_watts * compute,
        price_per_hour_usd=parent.price_per_hour_usd * compute,
        price_source=(f"{parent.price_source} x {profile.compute_slices}/{mig.COMPUTE_SLICES} "
                      "(compute share)" if parent.has_price else parent.price_source),
        nvml_names=tuple(f"{n} {suffix}" for n in parent.nvml_names),
        gfd_products=tuple(f"{p}-{suffix}" for p in parent.gfd_products),
        aliases=(),
        source=f"{parent.source}; slices: {mig.MIG_SOURCE}",
        notes=(f"MIG {profile.name}: {profile.compute_slices}/{mig.COMPUTE_SLICES} of the SMs and "
               f"peak rates, {profile.memory_slices}/{mig.MEMORY_SLICES} of the memory, bandwidth "
               "and L2 of the parent; one instance per process, no NVLink between instances."),
    )


def _build_index(devices: tuple[DeviceSpec, ...]) -> dict[str, DeviceSpec]:
    index: dict[str, DeviceSpec] = {}
    stripped: dict[str, set[str]] = {}
    for spec in devices:
        for alias in (spec.key, spec.name, *spec.nvml_names, *spec.gfd_products, *spec.aliases):
            norm = normalize_name(alias)
            owner = index.get(norm)
            if owner is not None and owner.key != spec.key:
                raise errors.CatalogError(
                    f"device {spec.key!r}: name {alias!r} already belongs to {owner.key!r}"
                )
            index[norm] = spec
            stripped.setdefault(_strip_prefix(norm), set()).add(spec.key)
    by_key = {d.key: d for d in devices}
    for norm, keys in stripped.items():
        # A prefix-less form is only an alias when it names exactly one device.
        if norm not in index and len(keys) == 1:
            index[norm] = by_key[next(iter(keys))]
    if CPU_KEY in index:
        raise errors.CatalogError(f"{CPU_KEY!r} is reserved for the local CPU device")
    return index


# --- loading -------------------------------------------------------------------------------

_REQUIRED_STR = (
    "key", "name", "vendor", "architecture", "interconnect", "source", "price_source")
_REQUIRED_POSITIVE = (
    "mem_bandwidth_gbps", "sm_count", "cores_per_sm", "boost_clock_mhz", "l2_cache_mb",
    "interconnect_gbps", "tdp_watts",
)
# Present in every entry, but null is allowed: unpublished clock, no public price.
_NULLABLE_POSITIVE = ("base_clock_mhz", "price_per_hour_usd")
_LISTS = ("nvml_names", "gfd_products")
_OPTIONAL = ("aliases", "extra", "notes")
_MEMORY = ("memory_gib", "memory_bytes")
_USABLE = ("usable_memory_mib", "usable_memory_source")
_KNOWN = frozenset(
    (*_REQUIRED_STR, *_REQUIRED_POSITIVE, *_NULLABLE_POSITIVE, *_LISTS, *_OPTIONAL, *_MEMORY,
     *_USABLE, "peak_tflops")
)


# --- precisions and rates ----------------------------------------------------------------------

SIMT_FP32_EXTRA = "fp32_vector_tflops"
"""`extra` key of an AMD part's vector (non-MFMA) fp32 rate; its `peak_tflops.fp32` is MFMA."""


def supports_precision(spec: DeviceSpec, precision: str) -> bool:
    """Whether `spec` has math units for a training precision (`core.options.PRECISIONS`)."""
    # Without the peak a precision needs the device has no such units (bf16 before
    # Ampere/CDNA2, tf32 before Ampere/CDNA3); fp16 is stored and computed (at worst with fp32
    # math) on every catalog GPU, so it is never refused.
    needed = precisions.precision(precision).needs_peak
    if spec.vendor == "cpu" or needed is None:
        return True
    return spec.peak_tflops.get(needed, 0.0) > 0.0


def check_precision(spec: DeviceSpec, precision: str) -> None:
    """`UnsupportedPrecisionError` naming device and precision when `spec` lacks its math."""
    if not supports_precision(spec, precision):
        have = ", ".join(p for p in precisions.PRECISION_TABLE if supports_precision(spec, p))
        raise errors.UnsupportedPrecisionError(
            spec.key, precision, f"{spec.name} has no {precision} math units; it supports {have}")


def simt_fp32_tflops(spec: DeviceSpec) -> float:
    """fp32 rate of non-matrix (SIMT/vector) kernels: AMD's vector rate, else `peak_tflops.fp32`."""
    return float(spec.extra.get(SIMT_FP32_EXTRA, spec.peak_tflops["fp32"]))


# --- same-architecture dominance ------------------------------------------------------------

# Spec fields that make a kernel faster when larger. Memory capacity is left out: it decides
# whether a model fits, not how fast a kernel runs.
_SPEED_FIELDS = (
    "mem_bandwidth_gbps", "sm_count", "cores_per_sm", "boost_clock_mhz", "base_clock_mhz",
    "l2_cache_mb", "tdp_watts",
)


def dominates_in_speed(a: DeviceSpec, b: DeviceSpec) -> bool:
    """Whether `a` is `b`'s architecture and at least as good on every speed spec (every peak
    `b` has, bandwidth, SMs, cores per SM, clocks, L2, TDP). A spec unknown (0) on either side
    is not compared: the vendor did not publish it, which is no evidence either way."""
    if a.key == b.key or not a.architecture or a.architecture != b.architecture:
        return False
    for dtype, rate in b.peak_tflops.items():
        if a.peak_tflops.get(dtype, 0.0) < rate:
            return False
    if simt_fp32_tflops(a) < simt_fp32_tflops(b):
        return False
    for name in _SPEED_FIELDS:
        va, vb = float(getattr(a, name)), float(getattr(b, name))
        if va > 0 and vb > 0 and va < vb:
            return False
    return True


def dominated_siblings(catalog: Catalog, spec: DeviceSpec) -> tuple[DeviceSpec, ...]:
    """Catalog devices `spec` dominates in speed (`dominates_in_speed`): never faster than it."""
    return tuple(d for d in catalog.devices if dominates_in_speed(spec, d))


def _fail(where: str, fld: str, message: str) -> errors.CatalogError:
    return errors.CatalogError(f"{where}: field {fld!r} {message}")


def _positive(entry: Mapping[str, Any], fld: str, where: str) -> float:
    value = entry[fld]
    if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
        raise _fail(where, fld, f"must be a positive number, got {value!r}")
    return float(value)


def _memory_bytes(entry: Mapping[str, Any], where: str) -> int:
    present = [f for f in _MEMORY if f in entry]
    if len(present) != 1:
        raise _fail(where, "memory_gib", "(or memory_bytes) must be given exactly once")
    value = _positive(entry, present[0], where)
    return int(value * 2**30) if present[0] == "memory_gib" else int(value)


def _usable_memory(entry: Mapping[str, Any], where: str, datasheet_bytes: int
                   ) -> tuple[int, str]:
    """(bytes, source) of `usable_memory_mib`, given with its source or not at all."""
    present = [f for f in _USABLE if f in entry]
    if not present:
        return 0, ""
    if len(present) != len(_USABLE):
        missing = next(f for f in _USABLE if f not in entry)
        raise _fail(where, missing, f"must be given with {present[0]}")
    source = entry["usable_memory_source"]
    if not isinstance(source, str) or not source.strip():
        raise _fail(where, "usable_memory_source", "must be a non-empty string")
    usable = int(_positive(entry, "usable_memory_mib", where) * 2**20)
    if usable > datasheet_bytes:
        raise _fail(where, "usable_memory_mib", f"exceeds the datasheet memory "
                    f"({datasheet_bytes} bytes)")
    return usable, source


def _peaks(entry: Mapping[str, Any], where: str) -> Mapping[str, float]:
    raw = entry.get("peak_tflops")
    if not isinstance(raw, Mapping) or "fp32" not in raw:
        raise _fail(where, "peak_tflops", "must be a mapping with at least fp32")
    peaks: dict[str, float] = {}
    for dtype in raw:
        if dtype not in PEAK_DTYPES:
            raise _fail(where, f"peak_tflops.{dtype}", f"is not one of {', '.join(PEAK_DTYPES)}")
        peaks[dtype] = _positive(raw, dtype, f"{where}: peak_tflops")
    return peaks


def _str_list(entry: Mapping[str, Any], fld: str, where: str) -> tuple[str, ...]:
    value = entry.get(fld, [])
    if not isinstance(value, list) or not all(isinstance(v, str) and v.strip() for v in value):
        raise _fail(where, fld, "must be a list of non-empty strings")
    return tuple(value)


def _extra(entry: Mapping[str, Any], where: str) -> Mapping[str, float]:
    raw = entry.get("extra", {})
    if not isinstance(raw, Mapping):
        raise _fail(where, "extra", "must be a mapping of numbers")
    return {str(k): _positive(raw, k, f"{where}: extra") for k in raw}


def parse_entry(entry: Any, position: int) -> DeviceSpec:
    """One YAML entry → `DeviceSpec`; `CatalogError` names the entry and the field."""
    where = f"device #{position}"
    if not isinstance(entry, Mapping):
        raise errors.CatalogError(f"{where}: must be a mapping, got {type(entry).__name__}")
    if isinstance(entry.get("key"), str):
        where = f"device {entry['key']!r}"
    unknown = sorted(set(entry) - _KNOWN)
    if unknown:
        raise _fail(where, unknown[0], "is not a catalog field")
    for fld in (*_REQUIRED_STR, *_REQUIRED_POSITIVE, *_NULLABLE_POSITIVE, *_LISTS):
        if fld not in entry:
            raise _fail(where, fld, "is missing")
    for fld in _REQUIRED_STR:
        if not isinstance(entry[fld], str) or not entry[fld].strip():
            raise _fail(where, fld, "must be a non-empty string")
    if entry["key"] != entry["key"].strip().lower() or " " in entry["key"]:
        raise _fail(where, "key", "must be lower-case without spaces")
    if entry["vendor"] not in VENDORS:
        raise _fail(where, "vendor", f"must be one of {', '.join(VENDORS)}")
    nums = {f: _positive(entry, f, where) for f in _REQUIRED_POSITIVE}
    nullable = {
        f: 0.0 if entry[f] is None else _positive(entry, f, where) for f in _NULLABLE_POSITIVE
    }
    notes = entry.get("notes", "")
    if not isinstance(notes, str):
        raise _fail(where, "notes", "must be a string")
    memory_bytes = _memory_bytes(entry, where)
    usable_bytes, usable_source = _usable_memory(entry, where, memory_bytes)
    return DeviceSpec(
        key=entry["key"], name=entry["name"], vendor=entry["vendor"],
        memory_bytes=memory_bytes, mem_bandwidth_gbps=nums["mem_bandwidth_gbps"],
        usable_memory_bytes=usable_bytes, usable_memory_source=usable_source,
        peak_tflops=_peaks(entry, where), sm_count=int(nums["sm_count"]),
        boost_clock_mhz=nums["boost_clock_mhz"], l2_cache_mb=nums["l2_cache_mb"],
        tdp_watts=nums["tdp_watts"], price_per_hour_usd=nullable["price_per_hour_usd"],
        interconnect=entry["interconnect"], interconnect_gbps=nums["interconnect_gbps"],
        nvml_names=_str_list(entry, "nvml_names", where),
        gfd_products=_str_list(entry, "gfd_products", where),
        cores_per_sm=int(nums["cores_per_sm"]), base_clock_mhz=nullable["base_clock_mhz"],
        source=entry["source"], extra=_extra(entry, where),
        aliases=_str_list(entry, "aliases", where), price_source=entry["price_source"],
        notes=notes, architecture=entry["architecture"],
    )


def parse_catalog(document: Any, origin: str = "catalog") -> Catalog:
    """A parsed YAML document → `Catalog` (pure; `load_catalog` does the file I/O)."""
    if not isinstance(document, Mapping) or not isinstance(document.get("devices"), list):
        raise errors.CatalogError(f"{origin}: expected a mapping with a 'devices' list")
    specs = tuple(parse_entry(e, i) for i, e in enumerate(document["devices"]))
    if not specs:
        raise errors.CatalogError(f"{origin}: 'devices' is empty")
    seen: set[str] = set()
    for spec in specs:
        if spec.key in seen:
            raise errors.CatalogError(f"{origin}: duplicate key {spec.key!r}")
        seen.add(spec.key)
    try:
        return Catalog(specs)
    except errors.CatalogError as exc:
        raise errors.CatalogError(f"{origin}: {exc}") from None


SAFE_YAML_LOADER: type[yaml.SafeLoader] = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
"""libyaml's safe loader where PyYAML was built with it: the same documents, read ~8x faster
(0.12 s of every CLI start for gpus.yaml in Python, #34); the pure-Python one otherwise."""


@functools.lru_cache(maxsize=16)
def _load_file(path: str, mtime_ns: int) -> Catalog:
    # mtime_ns is part of the cache key so an edited file is re-read.
    size = os.path.getsize(path)
    if size > MAX_CATALOG_BYTES:
        raise errors.CatalogError(f"{path}: {size} bytes exceeds the {MAX_CATALOG_BYTES} cap")
    try:
        with open(path, encoding="utf-8") as fh:
            document = yaml.load(fh, Loader=SAFE_YAML_LOADER)
    except yaml.YAMLError as exc:
        raise errors.CatalogError(f"{path}: not valid YAML: {exc}") from None
    return parse_catalog(document, origin=path)


def with_prices(catalog: Catalog, price_overrides: Mapping[str, float]) -> Catalog:
    """Replace hourly prices; keys may be any resolvable name, values must be positive."""
    prices: dict[str, float] = {}
    for name, price in price_overrides.items():
        spec = catalog.resolve(name)
        if isinstance(price, bool) or not isinstance(price, int | float) or not price > 0:
            raise errors.InvalidRequestError(
                f"price_overrides[{name!r}]", f"must be a positive number, got {price!r}"
            )
        prices[spec.key] = float(price)
    return Catalog(tuple(
        dataclasses.replace(d, price_per_hour_usd=prices[d.key], price_source="override")
        if d.key in prices else d
        for d in catalog.devices
    ))


def load_catalog(
    path: str | os.PathLike[str] | None = None,
    *,
    price_overrides: Mapping[str, float] | None = None,
) -> Catalog:
    """Load and validate a catalog YAML (default: the shipped `data/gpus.yaml`); cached. A
    user's catalog file (``--catalog``) is merged on top by `user_catalog.load_catalog`."""
    file = Path(path) if path is not None else DEFAULT_CATALOG_PATH
    try:
        mtime_ns = file.stat().st_mtime_ns
    except OSError as exc:
        raise errors.CatalogError(f"{file}: cannot read device catalog: {exc.strerror}") from None
    catalog = _load_file(str(file), mtime_ns)
    return with_prices(catalog, price_overrides) if price_overrides else catalog


def canonical_key(name: str, catalog: Catalog | None = None) -> str:
    """The catalog key a name resolves to (``cpu`` for the CPU, without calibrating it)."""
    if normalize_name(name) == CPU_KEY:
        return CPU_KEY
    return (catalog if catalog is not None else load_catalog()).resolve(name).key
