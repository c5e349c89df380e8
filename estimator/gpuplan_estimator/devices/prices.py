"""Price overrides: USD per GPU hour by device name, from a file or the chart's values.

One schema wherever prices come from: the Helm chart's ``prices:`` mapping (catalog key or any
name the catalog resolves → a positive number). A prices file is a YAML (or JSON) document with
that mapping under ``prices:``, so a chart values file works as one. The estimator service reads
the same mapping as JSON from ``GPUPLAN_PRICES_JSON`` (the chart sets it).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from gpuplan_estimator.core.errors import InvalidRequestError

PRICES_KEY = "prices"
PRICES_ENV = "GPUPLAN_PRICES_JSON"
MAX_PRICES_FILE_BYTES = 1 << 20
"""A prices file lists a few dozen GPU types; a megabyte is not one."""
MAX_PRICE_USD_PER_HOUR = 1e4


def prices_mapping(value: Any, where: str) -> dict[str, float]:
    """A validated ``{name: USD per GPU hour}`` mapping; the error names `where` and the entry."""
    if not isinstance(value, Mapping):
        raise InvalidRequestError(where, f"must be a mapping of GPU type to USD per GPU hour, "
                                  f"got {type(value).__name__}")
    out: dict[str, float] = {}
    for name, price in value.items():
        if not isinstance(name, str) or not name:
            raise InvalidRequestError(where, f"GPU type {name!r} must be a non-empty string")
        if (isinstance(price, bool) or not isinstance(price, int | float)
                or not (math.isfinite(price) and 0 < price <= MAX_PRICE_USD_PER_HOUR)):
            raise InvalidRequestError(f"{where}.{name}", f"must be a number in (0, "
                                      f"{MAX_PRICE_USD_PER_HOUR:g}] USD per GPU hour, got "
                                      f"{price!r}")
        out[name] = float(price)
    return out


def read_prices_file(path: str | Path) -> dict[str, float]:
    """The ``prices:`` mapping of a YAML/JSON file (a chart values file works as one)."""
    file = Path(path)
    with file.open("rb") as fh:  # OSError (missing, unreadable) names the file at the CLI
        data = fh.read(MAX_PRICES_FILE_BYTES + 1)
    if len(data) > MAX_PRICES_FILE_BYTES:
        raise InvalidRequestError("--prices", f"{file}: larger than {MAX_PRICES_FILE_BYTES} "
                                  "bytes; a prices file lists GPU types and prices")
    try:
        document = yaml.safe_load(data)
    except yaml.YAMLError as exc:
        raise InvalidRequestError("--prices", f"{file}: not YAML or JSON: {exc}") from None
    if not isinstance(document, Mapping) or PRICES_KEY not in document:
        raise InvalidRequestError("--prices", f"{file}: expected a top-level '{PRICES_KEY}:' "
                                  "mapping of GPU type to USD per GPU hour (the chart's "
                                  "values schema)")
    return prices_mapping(document[PRICES_KEY], f"{file}: {PRICES_KEY}")


def prices_from_env(environ: Mapping[str, str]) -> dict[str, float]:
    """The mapping in ``GPUPLAN_PRICES_JSON`` (empty when unset)."""
    text = environ.get(PRICES_ENV, "")
    if not text:
        return {}
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise InvalidRequestError(PRICES_ENV, f"not JSON: {exc}") from None
    return prices_mapping(value, PRICES_ENV)
