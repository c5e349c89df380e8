"""Which predictor prices a request: an explicit bundle, the newest one in the data dir, the
shipped one, or (a build without a bundle) the roofline; the service puts the performance
database's active bundle first (`sync_active_bundle`, `select_cached_predictor`)."""

from __future__ import annotations

import hashlib
import os
import re
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol

from gpuplan_estimator.core.errors import InvalidRequestError
from gpuplan_estimator.cost.predictors import LatencyPredictor
from gpuplan_estimator.cost.roofline import RooflinePredictor
from gpuplan_estimator.devices import catalog
from gpuplan_estimator.latency import learned, monotone


def select_predictor(bundle_dir: str | None, cpu_backend: str | None = None
                     ) -> tuple[LatencyPredictor, str]:
    """The predictor and where it comes from, e.g. ``bundle:/path (data-dir)`` or ``roofline``.

    An explicit bundle must load; otherwise the newest valid bundle in the data dir, else the
    shipped one, else (no bundle shipped in this build) the roofline. `cpu_backend` names (or
    uniquely prefixes) the bundle's CPU backend that prices CPU devices.
    """
    from gpuplan_estimator.latency import bundles

    explicit = Path(bundle_dir) if bundle_dir is not None else None
    path, origin = bundles.find_bundle_with_origin(explicit)
    if origin == "shipped" and not (path / bundles.MANIFEST).is_file():
        if cpu_backend is not None:
            raise InvalidRequestError("cpu_backend", "no model bundle to choose from")
        return RooflinePredictor(), "roofline"
    loaded = bundles.load_bundle(path, origin=origin)
    source = f"bundle:{path} ({origin})"
    if cpu_backend is None:
        return bounded(learned.LearnedPredictor(loaded)), source
    name = cpu_backend_name(loaded.manifest, cpu_backend)
    return (bounded(learned.LearnedPredictor(loaded, backend={"cpu": name})),
            f"{source}, CPU as {name}")


def read_every_model(predictor: LatencyPredictor) -> None:
    """Parse every model of the predictor's bundle now (`bundles.read_every_model`); nothing
    for the roofline."""
    from gpuplan_estimator.latency import bundles

    bundle = getattr(predictor, "bundle", None)  # SiblingBounded passes the inner one's through
    if isinstance(bundle, bundles.Bundle):
        bundles.read_every_model(bundle)


def bounded(predictor: LatencyPredictor) -> LatencyPredictor:
    """`predictor` kept consistent with same-architecture dominance in the shipped catalog
    (`latency.monotone`): what every estimate and plan is priced with."""
    return monotone.SiblingBounded(predictor, catalog.load_catalog())


def cpu_backend_name(manifest: Mapping[str, Any], wanted: str) -> str:
    """The bundle's CPU backend named `wanted` exactly or, failing that, by a unique prefix."""
    # `gpuplan bench` names backends <backend>-<version>-<cpu|cuda>.
    default = manifest.get("default_backends", {}).get("cpu")
    cpu = [b for b in manifest.get("backends", []) if b.endswith("-cpu") or b == default]
    matches = [b for b in cpu if b == wanted] or [b for b in cpu if b.startswith(wanted)]
    if len(matches) != 1:
        found = "several match" if matches else "none matches"
        raise InvalidRequestError(
            "cpu_backend", f"{wanted!r}: {found}; the bundle's CPU backends are "
            f"{', '.join(cpu) or 'none'}")
    return matches[0]


# -- the database's active bundle (issue #17) ----------------------------------------------

ACTIVE_POINTER = "ACTIVE"
"""File in the bundle cache naming the active database version; the service writes it, every
worker's context loader reads it, so workers never need the database themselves."""
_DB_SOURCE_RE = re.compile(r"\(database v(\d+)\)$")


class BundleSource(Protocol):
    """Where the active bundle comes from: `perfdb.PerfStore` (kept a protocol, so this layer
    does not import the database one)."""

    def active_bundle(self) -> tuple[int, bytes] | None:
        """(version, packed bytes) of the active bundle, or None."""

    def bundle_changed_since(self, version: int | None) -> bool:
        """Whether the active version is no longer `version`."""


def cached_bundle_dir(cache_dir: Path, version: int) -> Path:
    """Where version `version` is unpacked: versions never change, so the directory is its
    key and is unpacked once."""
    return cache_dir / f"v{version}"


def cached_active_version(cache_dir: Path) -> int | None:
    """The version the cache's pointer names, when its directory holds a bundle; else None."""
    try:
        text = (cache_dir / ACTIVE_POINTER).read_text(encoding="utf-8").strip()
    except FileNotFoundError:
        return None
    if not text.isdigit():
        return None
    version = int(text)
    manifest = cached_bundle_dir(cache_dir, version) / "manifest.json"
    return version if manifest.is_file() else None


PACKED_DIGEST = ".packed.sha256"
"""File in an unpacked version's directory: the SHA-256 of the bytes it was unpacked from."""


def sync_active_bundle(cache_dir: Path, source: BundleSource, *,
                       trust_cache: bool = True) -> int | None:
    """Make the cache hold the database's active bundle and point at it; returns its version,
    or None when the database has no active bundle (the pointer is removed: the data-dir or
    shipped bundle serves). Fetches the bytes only when the active version changed, unless
    `trust_cache` is False (a service's first sync): a cache left by another database (version
    numbers restart in each) holds other bytes under the same version, so the bytes are
    fetched and an unpacked directory of other bytes is replaced."""
    current = cached_active_version(cache_dir)
    if trust_cache and current is not None and not source.bundle_changed_since(current):
        return current
    active = source.active_bundle()
    pointer = cache_dir / ACTIVE_POINTER
    if active is None:
        pointer.unlink(missing_ok=True)
        return None
    version, data = active
    from gpuplan_estimator.latency import bundles

    target = cached_bundle_dir(cache_dir, version)
    digest = hashlib.sha256(data).hexdigest()
    if _unpacked_digest(target) != digest:
        shutil.rmtree(target, ignore_errors=True)
        bundles.unpack_bundle(data, target)
        (target / PACKED_DIGEST).write_text(digest + "\n", encoding="utf-8")
    tmp = cache_dir / f".{ACTIVE_POINTER}.tmp"
    tmp.write_text(f"{version}\n", encoding="utf-8")
    os.replace(tmp, pointer)  # atomic: a worker reads the old or the new version, never half
    return version


def _unpacked_digest(target: Path) -> str | None:
    """The digest an unpacked version was written with; None when it is absent or was
    unpacked before digests were kept."""
    try:
        return (target / PACKED_DIGEST).read_text(encoding="utf-8").strip() or None
    except (FileNotFoundError, NotADirectoryError):
        return None


def database_source(directory: Path, version: int) -> str:
    """`predictor_source` of a database bundle, e.g. ``bundle:/cache/v7 (database v7)``."""
    return f"bundle:{directory} (database v{version})"


def bundle_version_of(predictor_source: str) -> int | None:
    """The database version a `predictor_source` names (see `database_source`), else None."""
    found = _DB_SOURCE_RE.search(predictor_source)
    return int(found.group(1)) if found else None


def select_cached_predictor(cache_dir: Path) -> tuple[LatencyPredictor, str] | None:
    """The predictor of the cache's active database bundle and its source, or None when the
    cache points at none (the caller falls back to `select_predictor`)."""
    from gpuplan_estimator.latency import bundles

    version = cached_active_version(cache_dir)
    if version is None:
        return None
    directory = cached_bundle_dir(cache_dir, version)
    loaded = bundles.load_bundle(directory, origin="database")
    return bounded(learned.LearnedPredictor(loaded)), database_source(directory, version)
