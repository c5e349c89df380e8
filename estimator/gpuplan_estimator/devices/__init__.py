"""Devices: the GPU catalog (specs as data), the local CPU as a device, and name resolution.

The facade: callers use ``devices.load_catalog()``, ``devices.resolve_device(name)``,
``devices.DeviceSpec`` and the rest below; the modules behind it are `catalog`, `local_cpu`
(measures this host) and `resolution`.
"""

from gpuplan_estimator.devices.catalog import (
    CPU_KEY,
    DEFAULT_CATALOG_PATH,
    MAX_CATALOG_BYTES,
    PEAK_DTYPES,
    SHIPPED,
    VENDORS,
    Catalog,
    DeviceSpec,
    canonical_key,
    check_precision,
    dominated_siblings,
    dominates_in_speed,
    normalize_name,
    parse_catalog,
    parse_entry,
    simt_fp32_tflops,
    supports_precision,
    with_prices,
)
from gpuplan_estimator.devices.price_book import (
    PROVIDER_ENV,
    PriceChoice,
    apply_prices,
    price_by_provider,
    shipped_book,
)
from gpuplan_estimator.devices.prices import prices_from_env, read_prices_file
from gpuplan_estimator.devices.resolution import resolve_device
from gpuplan_estimator.devices.user_catalog import (
    CATALOG_ENV,
    GPUS_PER_NODE_EXTRA,
    MAX_USER_CATALOG_BYTES,
    catalog_file_from_env,
    load_catalog,
)

__all__ = [
    "CATALOG_ENV",
    "CPU_KEY",
    "DEFAULT_CATALOG_PATH",
    "GPUS_PER_NODE_EXTRA",
    "MAX_CATALOG_BYTES",
    "MAX_USER_CATALOG_BYTES",
    "PEAK_DTYPES",
    "PROVIDER_ENV",
    "SHIPPED",
    "VENDORS",
    "Catalog",
    "DeviceSpec",
    "PriceChoice",
    "apply_prices",
    "canonical_key",
    "catalog_file_from_env",
    "check_precision",
    "dominated_siblings",
    "dominates_in_speed",
    "load_catalog",
    "normalize_name",
    "parse_catalog",
    "parse_entry",
    "price_by_provider",
    "prices_from_env",
    "read_prices_file",
    "resolve_device",
    "shipped_book",
    "simt_fp32_tflops",
    "supports_precision",
    "with_prices",
]
