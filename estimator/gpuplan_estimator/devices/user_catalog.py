"""A user's catalog file: devices added to, or overriding, the shipped catalog by spec (#34).

The file is YAML or JSON, ``devices:`` a list of entries in the shipped catalog's field names
(`data/gpus.yaml`), validated with pydantic so every error names the file and the field path
(``devices[0].peak_tflops.bf16``). An entry is one of:

- a new device with every required spec given;
- a new device built on a shipped one (``base: h100-pcie-80gb``): the fields it gives replace
  the base's; the base's names, price and usable memory are not inherited (they belong to the
  base's part);
- an override of a shipped device (its ``key``): the fields it gives replace the shipped ones.

Every device from the file records the file as its `DeviceSpec.catalog_source`; its estimates
are ``extrapolated`` from the spec until a bundle has measured it (`latency.basis`).
"""

from __future__ import annotations

import dataclasses
import functools
import os
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import yaml

from gpuplan_estimator.core import errors
from gpuplan_estimator.devices import catalog as catalog_module
from gpuplan_estimator.devices.catalog import (
    SHIPPED,
    Catalog,
    DeviceSpec,
    normalize_name,
)

if TYPE_CHECKING:  # the schema (pydantic) is imported when a user catalog is read (#34)
    from pydantic import ValidationError

    from gpuplan_estimator.devices.user_catalog_schema import UserCatalogFile, UserDevice

MAX_USER_CATALOG_BYTES = 256 * 1024
"""A user catalog describes a handful of parts; 256 KiB is ten times the shipped catalog."""
CATALOG_ENV = "GPUPLAN_CATALOG_FILE"
"""Where the estimator service finds the chart's mounted catalog file (unset: none)."""

_REQUIRED_NEW = (
    "name", "vendor", "architecture", "memory_gib", "mem_bandwidth_gbps", "sm_count",
    "cores_per_sm", "boost_clock_mhz", "l2_cache_mb", "peak_tflops", "tdp_watts",
    "interconnect", "interconnect_gbps", "source",
)
"""What a device neither overriding nor built on a shipped one must give."""
_NOT_INHERITED: Mapping[str, Any] = {
    "nvml_names": (), "gfd_products": (), "aliases": (), "price_per_hour_usd": 0.0,
    "price_source": "", "usable_memory_bytes": 0, "usable_memory_source": "", "notes": ""}
"""A base's fields that describe its own part, not the spec: reset on a device built on it."""
GPUS_PER_NODE_EXTRA = "gpus_per_node"
"""`DeviceSpec.extra` key of a user device's GPUs per node (the default pool shape)."""


def _path(loc: tuple[int | str, ...]) -> str:
    out = ""
    for part in loc:
        if part == "[key]":  # pydantic's marker for a bad mapping key: the path names it
            continue
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def _validation_errors(origin: str, exc: ValidationError) -> errors.CatalogError:
    lines = [f"{origin}: {_path(e['loc'])}: {e['msg']}" for e in exc.errors()]
    return errors.CatalogError("\n".join(lines))


def parse_user_catalog(document: Any, origin: str) -> UserCatalogFile:
    """A parsed YAML/JSON document → the validated file; `CatalogError` names each bad field."""
    from pydantic import ValidationError

    from gpuplan_estimator.devices.user_catalog_schema import UserCatalogFile

    try:
        return UserCatalogFile.model_validate(document)
    except ValidationError as exc:
        raise _validation_errors(origin, exc) from None


def _given(entry: UserDevice) -> dict[str, Any]:
    """The `DeviceSpec` fields the entry sets (memory in bytes, `gpus_per_node` in extra)."""
    fields = entry.model_dump(exclude_unset=True, exclude={"key", "base", "memory_gib",
                                                          "gpus_per_node", "extra"})
    if entry.memory_gib is not None:
        fields["memory_bytes"] = int(entry.memory_gib * 2**30)
    for name in ("gfd_products", "nvml_names", "aliases"):
        if name in fields:
            fields[name] = tuple(fields[name])
    extra = dict(entry.extra)
    if entry.gpus_per_node is not None:
        extra[GPUS_PER_NODE_EXTRA] = float(entry.gpus_per_node)
    if extra or "extra" in entry.model_fields_set:
        fields["extra"] = extra
    return fields


def _from_scratch(entry: UserDevice, where: str) -> DeviceSpec:
    missing = [f for f in _REQUIRED_NEW if getattr(entry, f) is None]
    if missing:
        raise errors.CatalogError(
            f"{where}.{missing[0]}: is required for a new device (missing: "
            f"{', '.join(missing)}); or give 'base: KEY' to start from a shipped device")
    fields = _given(entry)
    return DeviceSpec(key=entry.key, **fields)


def _device(entry: UserDevice, shipped: Mapping[str, DeviceSpec], where: str,
            origin: str) -> DeviceSpec:
    if entry.base is not None and entry.key in shipped:
        raise errors.CatalogError(f"{where}.base: {entry.key!r} is a shipped device; override "
                                  "it without 'base', or choose a new key")
    if entry.base is not None and entry.base not in shipped:
        raise errors.CatalogError(f"{where}.base: {entry.base!r} is not a shipped device key")
    fields = _given(entry)
    if entry.key in shipped:  # an override keeps the part's names and price unless given
        spec = dataclasses.replace(shipped[entry.key], **fields)
    elif entry.base is not None:
        base = dataclasses.replace(shipped[entry.base], **_NOT_INHERITED)
        if "name" not in fields:
            raise errors.CatalogError(f"{where}.name: is required (the base's name stays the "
                                      "base's)")
        spec = dataclasses.replace(base, key=entry.key, **fields)
    else:
        spec = _from_scratch(entry, where)
    based = f" (based on {entry.base})" if entry.base else ""
    return dataclasses.replace(
        spec, catalog_source=origin,
        source=fields.get("source", f"user catalog {origin}{based}"),
        price_source=fields.get("price_source", "user catalog" if spec.has_price else ""))


def merge(shipped: Catalog, user: UserCatalogFile, origin: str) -> Catalog:
    """The shipped catalog with the file's devices added or overriding (pure)."""
    by_key = {d.key: d for d in shipped.devices}
    added: dict[str, DeviceSpec] = {}
    for i, entry in enumerate(user.devices):
        where = f"{origin}: devices[{i}]"
        if entry.key in added:
            raise errors.CatalogError(f"{where}.key: {entry.key!r} is given twice")
        added[entry.key] = _device(entry, by_key, where, origin)
    _check_names(shipped, added, user, origin)
    kept = tuple(added.pop(d.key, d) for d in shipped.devices)
    return Catalog((*kept, *added.values()))


def _check_names(shipped: Catalog, added: Mapping[str, DeviceSpec], user: UserCatalogFile,
                 origin: str) -> None:
    """A user device's label or name must not be another device's: the resolver would be
    ambiguous, and a node's product label must map to one device."""
    owners = {normalize_name(n): d.key for d in shipped.devices if d.key not in added
              for n in (d.key, d.name, *d.nvml_names, *d.gfd_products, *d.aliases)}
    for i, entry in enumerate(user.devices):
        spec = added[entry.key]
        for fld in ("gfd_products", "nvml_names", "aliases"):
            for j, name in enumerate(getattr(spec, fld)):
                owner = owners.get(normalize_name(name))
                if owner is not None and owner != spec.key:
                    raise errors.CatalogError(
                        f"{origin}: devices[{i}].{fld}[{j}]: {name!r} already names {owner!r}; "
                        f"override {owner!r} by its key instead")
                owners[normalize_name(name)] = spec.key


def read_user_catalog(path: str | os.PathLike[str]) -> UserCatalogFile:
    """Read and validate a user catalog file (size-capped); cached by path and mtime."""
    file = os.fspath(path)
    try:
        mtime_ns = os.stat(file).st_mtime_ns
    except OSError as exc:
        raise errors.CatalogError(f"{file}: cannot read the catalog file: {exc.strerror}"
                                  ) from None
    return _read(file, mtime_ns)


@functools.lru_cache(maxsize=16)
def _read(file: str, mtime_ns: int) -> UserCatalogFile:
    # mtime_ns is part of the cache key so an edited file is re-read.
    with open(file, "rb") as fh:
        data = fh.read(MAX_USER_CATALOG_BYTES + 1)
    if len(data) > MAX_USER_CATALOG_BYTES:
        raise errors.CatalogError(f"{file}: larger than {MAX_USER_CATALOG_BYTES} bytes; a "
                                  "catalog file describes a few devices")
    try:
        document = yaml.safe_load(data)
    except yaml.YAMLError as exc:
        raise errors.CatalogError(f"{file}: not YAML or JSON: {exc}") from None
    return parse_user_catalog(document, file)


_MEASURED_SPECS = ("vendor", "memory_bytes", "mem_bandwidth_gbps", "peak_tflops", "sm_count",
                   "cores_per_sm", "boost_clock_mhz", "l2_cache_mb", "extra")
"""The specs a latency model reads (`cost.features`): a change makes another part."""


def respecified(device: DeviceSpec) -> bool:
    """Whether a user catalog gave a shipped key other specs: measurements recorded under that
    key are of the shipped part, so this one is priced from its spec (`extrapolated`)."""
    if device.catalog_source == SHIPPED:
        return False
    shipped = {d.key: d for d in load_catalog().devices}.get(device.key)
    return shipped is not None and any(
        getattr(shipped, f) != getattr(device, f) for f in _MEASURED_SPECS)


def catalog_file_from_env(environ: Mapping[str, str]) -> str | None:
    """The catalog file the chart mounts (``GPUPLAN_CATALOG_FILE``), or None when unset."""
    return environ.get(CATALOG_ENV) or None


def load_catalog(
    path: str | os.PathLike[str] | None = None,
    *,
    price_overrides: Mapping[str, float] | None = None,
    user_file: str | os.PathLike[str] | None = None,
) -> Catalog:
    """`catalog.load_catalog`, with `user_file` (``--catalog``) adding or overriding devices by
    spec; prices are applied after it, so they may price a user device too."""
    base = catalog_module.load_catalog(path)
    if user_file is not None:
        origin = os.fspath(user_file)
        base = merge(base, read_user_catalog(origin), origin)
    return catalog_module.with_prices(base, price_overrides) if price_overrides else base
