"""Model bundles: the only module that reads or writes them (LightGBM text + manifest.json).

A bundle is a directory: ``manifest.json`` plus ``<kernel>.txt.gz`` (median) and
``<kernel>.p10.txt.gz`` / ``<kernel>.p90.txt.gz`` (quantiles), each LightGBM
``model_to_string`` gzip-compressed (bundles written before compression, plain ``.txt``, still
load). No pickle: a bundle is inert data that any LightGBM of the same major version can read.

Loading reads the manifest and checks every model file is there; each kernel's boosters are
parsed on first use (`LazyKernelModels`), and LightGBM itself is imported then: one estimate
needs a handful of the ~54 boosters, and parsing them all (and importing LightGBM, which pulls
in pandas and scipy.sparse when installed) was most of `gpuplan estimate`'s start-up (#34).
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import math
import os
import re
import shutil
import tarfile
import tempfile
import threading
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpuplan_estimator.core import errors, paths
from gpuplan_estimator.cost import aligned_gemm, features
from gpuplan_estimator.devices import user_catalog
from gpuplan_estimator.devices.catalog import DeviceSpec
from gpuplan_estimator.latency.regressors import (
    LayerLatencyModel,
    ProbeCorrection,
    lightgbm_module,
)

if TYPE_CHECKING:
    import lightgbm as lgb

BUNDLE_SCHEMA_VERSION = 1
KERNEL_DEVICES_KEY = "kernel_devices"
"""Manifest key: {kernel: the GPUs its rows were timed on}."""
MANIFEST = "manifest.json"
SHIPPED_BUNDLE = paths.PACKAGE_DATA_DIR / "bundle"
MAX_MODEL_FILE_BYTES = 64 * 1024 * 1024  # per model text (after gunzip); refuse runaway files
# Tree text compresses ~2.8x; gzip rather than xz (3.6x) because every CLI call and server start
# reads the bundle: gunzip of a 29 MB model takes ~0.1 s, unxz ~0.7 s on these hosts.
MODEL_SUFFIX = ".txt.gz"
_KERNEL_RE = re.compile(r"^[a-z0-9_]+$")
MAX_PACKED_BUNDLE_BYTES = 64 * 2**20
"""Largest packed bundle stored or unpacked: the shipped one packs to ~16 MB (its model files
are already gzip), so four times that leaves room to grow and refuses a runaway directory."""
MAX_UNPACKED_BUNDLE_BYTES = 256 * 2**20
"""Largest sum of member sizes a packed bundle may unpack to (a tar bomb stops here)."""
MAX_BUNDLE_MEMBERS = 256
SUB_WAVE_KEY = "sub_wave_gemm"
"""Manifest key of the one-wave GEMM scale (`training.fitting.fit_sub_wave`): ``{"log_scale",
"rows", "devices"}``. Bundles without it price sub-wave GEMMs like any other."""
_MEMBER_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]*$")


@dataclass(frozen=True)
class Bundle:
    """Fitted models per kernel plus the manifest that describes them."""

    models: Mapping[str, LayerLatencyModel]
    manifest: Mapping[str, Any]
    path: Path | None = None
    origin: str = field(default="memory")  # explicit | data-dir | shipped | database | memory
    transfer_models: Mapping[str, LayerLatencyModel] = field(default_factory=dict)
    """Per kernel, on `features.transfer_columns`: used for devices the bundle never saw."""
    cpu_models: Mapping[str, LayerLatencyModel] = field(default_factory=dict)
    """Per kernel, fitted on CPU rows only: they price CPUs, `models` price GPUs. Apart, so
    CPU rows cannot move GPU predictions (bagging and splits shared them in one model)."""

    def has_seen(self, device: DeviceSpec) -> bool:
        """Whether the bundle was trained on this device (it is in the manifest's ``devices``,
        and a user catalog did not give that key other specs)."""
        return (device.key in self.manifest.get("devices", [])
                and not user_catalog.respecified(device))

    def probe_correction(self, kernel: str, device: DeviceSpec) -> ProbeCorrection | None:
        """The transfer model's correction for `kernel` on `device`, or None when not probed.

        It is fitted on the device's few probe rows of the kernel (`train.split_probe_rows`).
        """
        entry = self.manifest.get("probe_offsets", {}).get(device.key, {}).get(kernel)
        if entry is None or user_catalog.respecified(device):
            return None
        # Bundles written before the probe range was recorded extrapolate the slope unbounded.
        return ProbeCorrection(float(entry["log_offset"]), float(entry["log_base_slope"]),
                               float(entry.get("log_base_min", -math.inf)),
                               float(entry.get("log_base_max", math.inf)))

    def sub_wave_log_scale(self) -> float | None:
        """The one-wave GEMM log scale (`cost.tiling.one_wave_ms`), None when not fitted."""
        entry = self.manifest.get(SUB_WAVE_KEY)
        if entry is None:
            return None
        value = float(entry["log_scale"])
        if not math.isfinite(value):
            raise errors.InvalidRequestError(f"manifest.{SUB_WAVE_KEY}.log_scale",
                                             f"must be a finite number, not {value!r}")
        return value

    def aligned_gemm(self) -> aligned_gemm.AlignedGemmFit | None:
        """The tensor-core GEMM utilisations per kernel class (`cost.aligned_gemm`), None when
        the manifest holds none."""
        entry = self.manifest.get(aligned_gemm.MANIFEST_KEY)
        if entry is None:
            return None
        if not isinstance(entry, Mapping):
            raise errors.InvalidRequestError(f"manifest.{aligned_gemm.MANIFEST_KEY}",
                                             "must be an object")
        return aligned_gemm.AlignedGemmFit.from_json(entry,
                                                     f"manifest.{aligned_gemm.MANIFEST_KEY}")

    def has_timed(self, kernel: str, device: DeviceSpec) -> bool:
        """Whether the kernel's GPU rows held the device (`KERNEL_DEVICES_KEY`); bundles
        without that list answer for the bundle as a whole (`has_seen`)."""
        timed = self.manifest.get(KERNEL_DEVICES_KEY, {}).get(kernel)
        if timed is None:
            return self.has_seen(device)
        return device.key in timed and not user_catalog.respecified(device)

    def covers(self, kernel: str, device: DeviceSpec) -> bool:
        """Whether the kernel's training data had the device's platform (cpu or gpu)."""
        if device.platform == "cpu" and kernel in self.cpu_models:
            return True
        platforms = self.manifest.get("kernel_platforms", {}).get(kernel)
        if platforms is None:
            return True  # bundles built in memory by tests carry no platform list
        return device.platform in platforms

    def backend_code(self, device: DeviceSpec, backend: str | None = None) -> int | None:
        """Code of the backend to predict for: explicit, the device's own, else its vendor's."""
        backends: list[str] = list(self.manifest.get("backends", []))
        name = self.backend_name(device, backend)
        return backends.index(name) if name in backends else None

    def backend_name(self, device: DeviceSpec, backend: str | None = None) -> str | None:
        """The backend predicted for: explicit, the device's own, else its platform's."""
        if backend is None:
            backend = self.manifest.get("device_backends", {}).get(device.key)
        if backend is None:
            backend = self.manifest.get("default_backends", {}).get(device.platform)
        return None if backend is None else str(backend)


def save_bundle(bundle: Bundle, directory: Path) -> Path:
    """Write models and manifest; the manifest goes last so a partial write never loads."""
    lgb = lightgbm_module()

    directory.mkdir(parents=True, exist_ok=True)
    stale = directory / MANIFEST
    if stale.exists():
        stale.unlink()
    for pattern in ("*.txt", "*.txt.gz"):
        for old in directory.glob(pattern):
            old.unlink()
    files = _write_models(directory, bundle.models, "")
    transfer_files = _write_models(directory, bundle.transfer_models, ".transfer")
    cpu_files = _write_models(directory, bundle.cpu_models, ".cpu")
    manifest = {
        **bundle.manifest,
        "schema_version": BUNDLE_SCHEMA_VERSION,
        "feature_schema_version": features.FEATURE_SCHEMA_VERSION,
        "lightgbm_version": lgb.__version__,
        "kernels": sorted(bundle.models),
        "files": files,
        "transfer_files": transfer_files,
        "cpu_files": cpu_files,
        "model_params": {k: m.get_params() for k, m in sorted(bundle.models.items())},
        "cpu_model_params": {k: m.get_params() for k, m in sorted(bundle.cpu_models.items())},
    }
    _write_manifest(directory, manifest)
    return directory


def _write_manifest(directory: Path, manifest: Mapping[str, Any]) -> None:
    """Write `manifest` atomically (a reader never sees half a file)."""
    tmp = directory / (MANIFEST + ".tmp")
    tmp.write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    os.replace(tmp, directory / MANIFEST)


def update_manifest(directory: Path, entries: Mapping[str, Any]) -> Path:
    """Add or replace top-level `entries` of a bundle's manifest without retraining (what the
    hack/bundle_*.py scripts write: interval sigma, host model, sub-wave scale), then check the
    bundle still reads. Returns the manifest's path."""
    read_manifest(directory)  # a bundle this version can read, before and after
    path = directory / MANIFEST
    manifest = json.loads(path.read_text(encoding="utf-8"))
    manifest.update(entries)
    _write_manifest(directory, manifest)
    read_manifest(directory)
    return path


def pack_bundle(directory: Path) -> bytes:
    """The bundle directory as a gzip-compressed tar (flat: the manifest and model files).

    Reproducible: members sorted, times, owners and modes fixed, so the same bundle gives the
    same bytes (and digest). The manifest is checked first; a bundle over
    `MAX_PACKED_BUNDLE_BYTES` is refused.
    """
    read_manifest(directory)
    names = sorted(p.name for p in directory.iterdir()
                   if p.is_file() and _MEMBER_RE.match(p.name) and not p.name.endswith(".tmp"))
    buffer = io.BytesIO()
    with gzip.GzipFile(fileobj=buffer, mode="wb", compresslevel=6, mtime=0) as zipped, \
            tarfile.open(fileobj=zipped, mode="w|", format=tarfile.PAX_FORMAT) as tar:
        for name in names:
            data = (directory / name).read_bytes()
            info = tarfile.TarInfo(name)
            info.size, info.mode, info.mtime = len(data), 0o644, 0
            tar.addfile(info, io.BytesIO(data))
    packed = buffer.getvalue()
    if len(packed) > MAX_PACKED_BUNDLE_BYTES:
        raise errors.BundleError(f"{directory}: packed bundle is {len(packed)} bytes, over the "
                                 f"{MAX_PACKED_BUNDLE_BYTES}-byte cap")
    return packed


def packed_digest(data: bytes) -> str:
    """Hex SHA-256 of a packed bundle."""
    return hashlib.sha256(data).hexdigest()


def _packed_members(data: bytes) -> list[tuple[str, bytes]]:
    """(name, content) of every member of a packed bundle, checked: regular files with plain
    names only, at most `MAX_BUNDLE_MEMBERS` and `MAX_UNPACKED_BUNDLE_BYTES` in all."""
    if len(data) > MAX_PACKED_BUNDLE_BYTES:
        raise errors.BundleError(f"packed bundle is {len(data)} bytes, over the "
                                 f"{MAX_PACKED_BUNDLE_BYTES}-byte cap")
    members: list[tuple[str, bytes]] = []
    total = 0
    try:
        with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
            for info in tar:
                if not info.isfile() or not _MEMBER_RE.match(info.name):
                    raise errors.BundleError(
                        f"packed bundle member {info.name[:100]!r} is not a plain file name")
                total += info.size
                if len(members) >= MAX_BUNDLE_MEMBERS or total > MAX_UNPACKED_BUNDLE_BYTES:
                    raise errors.BundleError(
                        f"packed bundle unpacks to over {MAX_BUNDLE_MEMBERS} files or "
                        f"{MAX_UNPACKED_BUNDLE_BYTES} bytes")
                handle = tar.extractfile(info)
                if handle is None:  # pragma: no cover - isfile() members always have one
                    raise errors.BundleError(f"packed bundle member {info.name!r} unreadable")
                members.append((info.name, handle.read()))
    except (tarfile.TarError, OSError, EOFError) as exc:
        raise errors.BundleError(f"not a packed model bundle: {exc}") from None
    return members


def packed_manifest(data: bytes) -> dict[str, Any]:
    """The checked manifest of a packed bundle, without unpacking the models to disk."""
    found = dict(_packed_members(data))
    if MANIFEST not in found:
        raise errors.BundleError("packed bundle has no manifest.json; not a model bundle")
    with tempfile.TemporaryDirectory(prefix="gpuplan-manifest-") as tmp:
        (Path(tmp) / MANIFEST).write_bytes(found[MANIFEST])
        manifest = read_manifest(Path(tmp))
    return manifest


def unpack_bundle(data: bytes, directory: Path) -> Path:
    """Unpack a packed bundle into `directory` (which must not exist yet) and check it loads
    as far as its manifest. Written beside it and renamed, so a reader never sees half."""
    members = _packed_members(data)
    directory.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{directory.name}-", dir=directory.parent))
    try:
        for name, content in members:
            (staging / name).write_bytes(content)
        read_manifest(staging)
        try:
            os.replace(staging, directory)
        except OSError:
            if not (directory / MANIFEST).is_file():
                raise
            shutil.rmtree(staging)  # another process unpacked the same version first
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return directory


def load_bundle(directory: Path, *, origin: str = "explicit") -> Bundle:
    """Read a bundle; `errors.BundleError` names the file or the mismatching versions."""
    manifest = read_manifest(directory)
    models = _read_models(directory, manifest, "files", transfer=False)
    transfer = _read_models(directory, manifest, "transfer_files", transfer=True)
    cpu = _read_models(directory, manifest, "cpu_files", transfer=False)
    return Bundle(models=models, manifest=manifest, path=directory, origin=origin,
                  transfer_models=transfer, cpu_models=cpu)


def _write_models(
    directory: Path, models: Mapping[str, LayerLatencyModel], suffix: str
) -> dict[str, dict[str, str]]:
    files: dict[str, dict[str, str]] = {}
    for kernel, model in sorted(models.items()):
        files[kernel] = {}
        for part, booster in sorted(model._fitted().items()):
            stem = f"{kernel}{suffix}" if part == "median" else f"{kernel}{suffix}.{part}"
            name = stem + MODEL_SUFFIX
            text = booster.model_to_string().encode("utf-8")
            # mtime=0: the same models give byte-identical files (reproducible bundles).
            (directory / name).write_bytes(gzip.compress(text, compresslevel=9, mtime=0))
            files[kernel][part] = name
    return files


def _read_models(
    directory: Path, manifest: Mapping[str, Any], key: str, *, transfer: bool
) -> LazyKernelModels:
    """The models the manifest's `key` lists, each parsed on first use; a bad kernel name or
    a missing file is refused now, a file that does not parse when it is first read."""
    files: dict[str, dict[str, Path]] = {}
    for kernel, parts in manifest.get(key, {}).items():
        if not _KERNEL_RE.match(kernel) or kernel not in features.KERNEL_DIMS:
            raise errors.BundleError(f"{directory / MANIFEST}: bad kernel name {kernel!r}")
        files[kernel] = {part: directory / name for part, name in parts.items()}
        for path in files[kernel].values():
            if not path.is_file():
                raise errors.BundleError(f"{path}: cannot read model: no such file")
    params_key = "cpu_model_params" if key == "cpu_files" else "model_params"
    reader = _ModelReader(directory, files, dict(manifest.get(params_key, {})),
                          str(manifest.get("transfer_kind", "roofline")), transfer)
    return LazyKernelModels(tuple(files), reader)


@dataclass(frozen=True)
class _ModelReader:
    """Reads one kernel's model of a bundle directory; a plain object, so a lazy bundle
    pickles (the service hands its bundle to worker processes)."""

    directory: Path
    files: Mapping[str, Mapping[str, Path]]
    params: Mapping[str, Any]
    transfer_kind: str
    transfer: bool

    def __call__(self, kernel: str) -> LayerLatencyModel:
        boosters = {part: _read_booster(path) for part, path in self.files[kernel].items()}
        model = LayerLatencyModel.from_boosters(boosters, self.params.get(kernel, {}))
        expected = (len(features.transfer_feature_names(kernel, self.transfer_kind))
                    if self.transfer else len(features.feature_names(kernel)))
        if model.n_features_in_ != expected:
            raise errors.BundleError(
                f"{self.directory}: model {kernel!r} has {model.n_features_in_} features, "
                f"feature schema {features.FEATURE_SCHEMA_VERSION} defines {expected}")
        return model


class LazyKernelModels(Mapping[str, LayerLatencyModel]):
    """A loaded bundle's models by kernel: the kernels are known from the manifest, each
    model is read by `read` the first time it is looked up and kept. Membership (`in`),
    iteration and `len` read nothing, so choosing a model costs no parse; a parse error
    surfaces at that first lookup, naming the file as an eager load did."""

    def __init__(self, kernels: tuple[str, ...],
                 read: Callable[[str], LayerLatencyModel]) -> None:
        self._kernels = kernels
        self._read = read
        self._models: dict[str, LayerLatencyModel] = {}
        self._lock = threading.Lock()  # the service's worker threads may share a bundle

    def __getitem__(self, kernel: str) -> LayerLatencyModel:
        if kernel not in self._kernels:
            raise KeyError(kernel)
        with self._lock:
            model = self._models.get(kernel)
            if model is None:
                model = self._models[kernel] = self._read(kernel)
            return model

    def __contains__(self, kernel: object) -> bool:
        return kernel in self._kernels

    def __iter__(self) -> Iterator[str]:
        return iter(self._kernels)

    def __len__(self) -> int:
        return len(self._kernels)

    def __getstate__(self) -> dict[str, Any]:
        with self._lock:  # a lock does not pickle; the copy gets its own
            return {"kernels": self._kernels, "read": self._read, "models": dict(self._models)}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self._kernels = state["kernels"]
        self._read = state["read"]
        self._models = state["models"]
        self._lock = threading.Lock()

    def loaded(self) -> frozenset[str]:
        """The kernels whose models have been read so far."""
        with self._lock:
            return frozenset(self._models)


def read_every_model(bundle: Bundle) -> None:
    """Parse every model of `bundle` now. A one-shot CLI reads only the kernels it prices; a
    long-lived process (the service's workers) reads them all at start, before its memory cap
    and its first request, so no request pays for a parse."""
    for models in (bundle.models, bundle.transfer_models, bundle.cpu_models):
        for kernel in models:
            models[kernel]  # the lookup is the read


def read_manifest(directory: Path) -> dict[str, Any]:
    """Parse and check ``manifest.json`` (schema and feature-schema versions, files)."""
    path = directory / MANIFEST
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise errors.BundleError(f"{path}: no manifest; not a model bundle") from None
    except (OSError, ValueError) as exc:
        raise errors.BundleError(f"{path}: unreadable manifest: {exc}") from None
    if not isinstance(manifest, dict):
        raise errors.BundleError(f"{path}: manifest must be a JSON object")
    if manifest.get("schema_version") != BUNDLE_SCHEMA_VERSION:
        raise errors.BundleError(
            f"{path}: bundle schema_version {manifest.get('schema_version')!r}, "
            f"this gpuplan reads {BUNDLE_SCHEMA_VERSION}")
    got = manifest.get("feature_schema_version")
    if got != features.FEATURE_SCHEMA_VERSION:
        raise errors.BundleError(
            f"{path}: bundle feature schema {got!r} differs from this gpuplan's "
            f"{features.FEATURE_SCHEMA_VERSION!r}; retrain with `gpuplan train`")
    if not isinstance(manifest.get("files"), dict):
        raise errors.BundleError(f"{path}: manifest field 'files' missing or not an object")
    _check_probe_offsets(path, manifest.get("probe_offsets", {}))
    return manifest


def _check_probe_offsets(path: Path, offsets: Any) -> None:
    """``{device: {kernel: {"log_offset": x, "log_base_slope": y, "rows": n}}}``: a bad entry
    is named here rather than failing later inside a prediction."""
    per_device = offsets.values() if isinstance(offsets, dict) else [None]
    if not all(isinstance(per_kernel, dict) and all(map(_is_probe_entry, per_kernel.values()))
               for per_kernel in per_device):
        raise errors.BundleError(
            f"{path}: manifest field 'probe_offsets' must map device -> kernel -> "
            "{log_offset, log_base_slope, rows} numbers")


def _is_probe_entry(entry: Any) -> bool:
    return isinstance(entry, dict) and all(
        isinstance(entry.get(k), (int, float)) and not isinstance(entry.get(k), bool)
        for k in ("log_offset", "log_base_slope", "rows"))


def default_data_dir() -> Path:
    """``$XDG_DATA_HOME/gpuplan/bundles``, else ``~/.local/share/gpuplan/bundles``.

    That is next to the default SQLite performance database.
    """
    return paths.data_dir() / "bundles"


def find_bundle_with_origin(
    explicit: Path | None = None, data_dir: Path | None = None
) -> tuple[Path, str]:
    """(path, origin): explicit path, else the newest valid bundle in the data dir, else shipped."""
    if explicit is not None:
        read_manifest(explicit)  # an explicit bad bundle is an error, not a silent fallback
        return explicit, "explicit"
    root = data_dir if data_dir is not None else default_data_dir()
    candidates: list[tuple[str, Path]] = []
    if root.is_dir():
        for sub in root.iterdir():
            try:
                manifest = read_manifest(sub)
            except errors.BundleError:
                continue  # stale schema or half-written: skip, the next one may be valid
            candidates.append((str(manifest.get("created", "")), sub))
    if candidates:
        return max(candidates)[1], "data-dir"
    return SHIPPED_BUNDLE, "shipped"


def find_bundle(explicit: Path | None = None, data_dir: Path | None = None) -> Path:
    """Bundle path: the explicit one, else the newest valid one in the data dir, else shipped."""
    return find_bundle_with_origin(explicit, data_dir)[0]


def load_default(explicit: Path | None = None, data_dir: Path | None = None) -> Bundle:
    """Load the bundle `find_bundle` picks, recording where it came from."""
    path, origin = find_bundle_with_origin(explicit, data_dir)
    return load_bundle(path, origin=origin)


def _read_booster(path: Path) -> lgb.Booster:
    lgb = lightgbm_module()

    try:
        return lgb.Booster(model_str=_read_model_text(path))
    except (OSError, EOFError) as exc:  # EOFError: a truncated .gz
        reason = getattr(exc, "strerror", None) or exc
        raise errors.BundleError(f"{path}: cannot read model: {reason}") from None
    except (lgb.basic.LightGBMError, UnicodeDecodeError) as exc:
        raise errors.BundleError(f"{path}: not a LightGBM text model: {exc}") from None


def _read_model_text(path: Path) -> str:
    """The model text of a ``.txt.gz`` or ``.txt`` file, at most `MAX_MODEL_FILE_BYTES`."""
    if path.name.endswith(".gz"):
        with gzip.open(path, "rb") as fh:
            raw = fh.read(MAX_MODEL_FILE_BYTES + 1)  # bounded: a gzip bomb stops here
    else:
        with path.open("rb") as fh:
            raw = fh.read(MAX_MODEL_FILE_BYTES + 1)
    if len(raw) > MAX_MODEL_FILE_BYTES:
        raise errors.BundleError(f"{path}: model text exceeds {MAX_MODEL_FILE_BYTES} bytes")
    return raw.decode("utf-8")
