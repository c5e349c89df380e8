"""Which predictor prices a request: an explicit bundle, the newest one in the data dir, the
shipped one, or (a build without a bundle) the roofline."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from gpuplan_estimator.core.errors import InvalidRequestError
from gpuplan_estimator.cost.predictors import LatencyPredictor
from gpuplan_estimator.cost.roofline import RooflinePredictor
from gpuplan_estimator.models import learned


def select_predictor(bundle_dir: str | None, cpu_backend: str | None = None
                     ) -> tuple[LatencyPredictor, str]:
    """The predictor and where it comes from, e.g. ``bundle:/path (data-dir)`` or ``roofline``.

    An explicit bundle must load; otherwise the newest valid bundle in the data dir, else the
    shipped one, else (no bundle shipped in this build) the roofline. `cpu_backend` names (or
    uniquely prefixes) the bundle's CPU backend that prices CPU devices.
    """
    from gpuplan_estimator.models import bundles

    explicit = Path(bundle_dir) if bundle_dir is not None else None
    path, origin = bundles.find_bundle_with_origin(explicit)
    if origin == "shipped" and not (path / bundles.MANIFEST).is_file():
        if cpu_backend is not None:
            raise InvalidRequestError("cpu_backend", "no model bundle to choose from")
        return RooflinePredictor(), "roofline"
    loaded = bundles.load_bundle(path, origin=origin)
    source = f"bundle:{path} ({origin})"
    if cpu_backend is None:
        return learned.LearnedPredictor(loaded), source
    name = cpu_backend_name(loaded.manifest, cpu_backend)
    return learned.LearnedPredictor(loaded, backend={"cpu": name}), f"{source}, CPU as {name}"


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
