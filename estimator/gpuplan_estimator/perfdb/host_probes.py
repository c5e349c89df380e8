"""Host probes as the performance database keeps them (revision 0008, issue #30): checks, the
node-type key, the digest that makes a re-import a no-op, and the reading of a probe document
(`bench.host_probe`'s JSON, also the ``host_probe`` field of a `gpuplan bench --export`
sidecar). Plain data in, plain data out: the store writes and reads the rows.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from gpuplan_estimator.core import errors
from gpuplan_estimator.step import host

SIDECAR_KEY = "host_probe"
"""The export sidecar's field holding the probe measured with the run (None: none was)."""
MAX_DEVICE_CHARS = 128
MAX_CPU_MODEL_CHARS = 256
MAX_FIGURES = 64
MAX_FIGURE_NAME_CHARS = 64
MAX_PROVENANCE_CHARS = 16_384
"""Caps of one probe: a probe has a dozen figures and a dozen identity fields."""
FIGURES_FIELD = "figures_us"
"""Where a probe document holds its figures, in microseconds."""
NODE_TYPE_SEPARATOR = " | "


@dataclass(frozen=True)
class ProbeRow:
    """One probe ready to store: what node type measured it, its figures and provenance."""

    device: str
    """The GPU's (or CPU's) catalog key."""
    cpu_model: str
    probe_version: int
    figures_us: Mapping[str, float]
    provenance: Mapping[str, Any]
    """Date, command, commit, torch, platform, ... (the probe document's identity fields)."""

    @property
    def node_type(self) -> str:
        """The node type the figures describe: GPU device key and CPU model."""
        return node_type_key(self.device, self.cpu_model)

    def digest(self) -> str:
        """SHA-256 of device, CPU, version, figures and provenance: equal probes, equal digest."""
        body = json.dumps([self.device, self.cpu_model, self.probe_version,
                           dict(self.figures_us), dict(self.provenance)],
                          sort_keys=True, default=str)
        return hashlib.sha256(body.encode("utf-8")).hexdigest()


@dataclass(frozen=True)
class StoredHostProbe:
    """A probe as read back from the database."""

    id: int
    node_type: str
    device: str
    cpu_model: str
    probe_version: int
    figures_us: dict[str, float]
    provenance: dict[str, Any]
    run_id: int | None
    created_at: datetime

    def host_probe(self) -> host.HostProbe:
        """The figures as the step model reads them, with where they come from as source."""
        p = self.provenance
        where = ", ".join(str(p[k]) for k in ("date", "commit") if p.get(k))
        source = f"host probe {self.id} of {self.node_type}" + (f" ({where})" if where else "")
        return host.HostProbe.from_figures(self.figures_us, source)


def node_type_key(device: str, cpu_model: str) -> str:
    """The node type of a probe: GPU device key and CPU model (the host cost depends on both)."""
    return f"{device}{NODE_TYPE_SEPARATOR}{cpu_model}"


def check_row(row: ProbeRow) -> None:
    """`InvalidRequestError` naming the field when a probe is not storable."""
    _check_text("device", row.device, MAX_DEVICE_CHARS)
    _check_text("cpu_model", row.cpu_model, MAX_CPU_MODEL_CHARS)
    version = row.probe_version
    if isinstance(version, bool) or not isinstance(version, int) or version < 1:
        raise errors.InvalidRequestError("probe_version",
                                         f"must be a positive integer, got {version!r}")
    _check_figures(row.figures_us)
    if not isinstance(row.provenance, Mapping):
        raise errors.InvalidRequestError("provenance", "must be a JSON object")
    size = len(provenance_json(row.provenance))
    if size > MAX_PROVENANCE_CHARS:
        raise errors.InvalidRequestError(
            "provenance", f"must be at most {MAX_PROVENANCE_CHARS} characters, got {size}")


def provenance_json(provenance: Mapping[str, Any]) -> str:
    """The provenance as stored: sorted keys, anything not JSON as its string."""
    return json.dumps(dict(provenance), sort_keys=True, default=str)


def _check_text(name: str, value: object, cap: int) -> None:
    if not isinstance(value, str) or not value:
        raise errors.InvalidRequestError(name, f"must be a non-empty string, got {value!r}")
    if len(value) > cap:
        raise errors.InvalidRequestError(name, f"must be at most {cap} characters, "
                                         f"got {len(value)}")


def _check_figures(figures: object) -> None:
    field = FIGURES_FIELD
    if not isinstance(figures, Mapping) or not figures:
        raise errors.InvalidRequestError(field, "must be a non-empty object of numbers")
    if len(figures) > MAX_FIGURES:
        raise errors.InvalidRequestError(field, f"must hold at most {MAX_FIGURES} figures, "
                                         f"got {len(figures)}")
    for name, value in figures.items():
        if not isinstance(name, str) or not 0 < len(name) <= MAX_FIGURE_NAME_CHARS:
            raise errors.InvalidRequestError(field, f"figure name {name!r} must be a string of "
                                             f"1..{MAX_FIGURE_NAME_CHARS} characters")
        if isinstance(value, bool) or not isinstance(value, int | float) \
                or not math.isfinite(value) or value < 0:
            raise errors.InvalidRequestError(f"{field}.{name}", "must be a finite number "
                                             f">= 0, got {value!r}")


def row_from_document(doc: object, device: str) -> ProbeRow:
    """A probe document (`bench.host_probe`'s JSON: identity fields plus ``figures_us``) as a
    row of `device` (the catalog key: the document's own ``device`` is torch's, e.g. cuda:0);
    `InvalidRequestError` naming the field when it is not one."""
    if not isinstance(doc, Mapping):
        raise errors.InvalidRequestError(SIDECAR_KEY, "must be a JSON object")
    figures = doc.get(FIGURES_FIELD)
    if not isinstance(figures, Mapping):
        raise errors.InvalidRequestError(FIGURES_FIELD, "must be a non-empty object of numbers")
    _check_figures(figures)
    cpu_model, version = doc.get("cpu_model"), doc.get("probe_version")
    if not isinstance(cpu_model, str):
        raise errors.InvalidRequestError("cpu_model", f"must be a string, got {cpu_model!r}")
    if isinstance(version, bool) or not isinstance(version, int):
        raise errors.InvalidRequestError("probe_version",
                                         f"must be a positive integer, got {version!r}")
    row = ProbeRow(device=device, cpu_model=cpu_model, probe_version=version,
                   figures_us={str(k): float(v) for k, v in figures.items()},
                   provenance={k: v for k, v in doc.items()
                               if k not in (FIGURES_FIELD, "cpu_model", "probe_version")})
    check_row(row)
    if version == host.PROBE_VERSION:  # a probe the estimates will read must be readable
        try:
            host.HostProbe.from_figures(row.figures_us, "")
        except ValueError as exc:
            raise errors.InvalidRequestError(FIGURES_FIELD, str(exc)) from exc
    return row
