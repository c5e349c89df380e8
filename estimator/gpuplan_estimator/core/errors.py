"""Domain errors of the estimator. The CLI maps `GpuplanError` to a one-line message and exit 2."""

from __future__ import annotations

from collections.abc import Sequence


class GpuplanError(Exception):
    """Base of every error a user can cause with bad input."""


class InvalidModelError(GpuplanError):
    """The model file is not ONNX, is truncated, or fails the checker."""


class UnsupportedOpsetError(InvalidModelError):
    """The model's opset is outside the supported range."""


class UnboundDimError(GpuplanError):
    """A symbolic dimension has no value; the message names every unbound dim and, when the
    request named dims the graph does not have, those against the graph's own."""

    def __init__(self, dims: Sequence[str], where: str = "", *, unknown: Sequence[str] = (),
                 graph_dims: Sequence[str] = ()) -> None:
        self.dims = tuple(dims)
        self.unknown = tuple(unknown)
        loc = f" in {where}" if where else ""
        typo = (f"unknown dim(s) {', '.join(map(repr, self.unknown))}; this graph's dims: "
                f"{', '.join(graph_dims)}; " if self.unknown else "")
        super().__init__(
            f"{typo}unbound symbolic dimension(s){loc}: {', '.join(self.dims)}; "
            f"bind them with --batch N or --dim NAME=VALUE"
        )


class UnknownDeviceError(GpuplanError):
    """A device name matches nothing in the catalog; suggests the closest names."""

    def __init__(self, name: str, suggestions: Sequence[str] = ()) -> None:
        self.name = name
        self.suggestions = tuple(suggestions)
        hint = f"; did you mean: {', '.join(self.suggestions)}?" if self.suggestions else ""
        super().__init__(f"unknown device {name!r}{hint}")


class InvalidRequestError(GpuplanError):
    """A request field is out of range or malformed; `field` names it, and `details` holds
    one "path: problem" line per field when several are wrong."""

    def __init__(self, field: str, message: str, details: tuple[str, ...] = ()) -> None:
        self.field = field
        self.message = message
        self.details = details
        super().__init__(f"{field}: {message}")


class UnsupportedPrecisionError(InvalidRequestError):
    """A device has no math units for the requested precision (bf16 on a V100, tf32 on a T4)."""

    def __init__(self, device: str, precision: str, message: str) -> None:
        self.device = device
        self.precision = precision
        super().__init__("precision", f"{precision} on {device}: {message}")


class BundleError(GpuplanError):
    """A model bundle is missing, corrupt, or has an incompatible feature schema."""


class DatabaseError(GpuplanError):
    """The performance database is unreachable, locked, or has an unexpected schema."""


class CatalogError(GpuplanError):
    """The device catalog YAML is unreadable or invalid; the message names entry and field."""


class CalibrationError(GpuplanError):
    """The local CPU device has no calibration (or a corrupt one) and measuring is not allowed."""
