"""A user catalog file's schema (`user_catalog`), apart so that pydantic is imported when a
user catalog is read, not by every `gpuplan` start without one (#34)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints

from gpuplan_estimator.devices.catalog import PEAK_DTYPES

MAX_USER_DEVICES = 256

_Name = Annotated[str, StringConstraints(strip_whitespace=True, min_length=1, max_length=200)]
_Key = Annotated[str, StringConstraints(pattern=r"^[a-z0-9][a-z0-9.\-]{0,63}$")]
_Positive = Annotated[float, Field(gt=0, allow_inf_nan=False)]
_Count = Annotated[int, Field(gt=0, le=1_000_000)]
PeakDtype = Literal["fp64", "fp32", "tf32", "fp16", "bf16", "fp8"]
assert set(PeakDtype.__args__) == set(PEAK_DTYPES)  # type: ignore[attr-defined]  # one source


class UserDevice(BaseModel):
    """One device of a user catalog; field names and units as in the shipped `gpus.yaml`."""

    # Unknown fields are refused (a typo must not be ignored); new spec fields join here.
    model_config = ConfigDict(extra="forbid", frozen=True)

    key: _Key
    base: _Key | None = None
    name: _Name | None = None
    vendor: Literal["nvidia", "amd"] | None = None
    architecture: _Name | None = None
    memory_gib: _Positive | None = None
    mem_bandwidth_gbps: _Positive | None = None
    sm_count: _Count | None = None
    cores_per_sm: _Count | None = None
    boost_clock_mhz: _Positive | None = None
    base_clock_mhz: _Positive | None = None
    l2_cache_mb: _Positive | None = None
    peak_tflops: dict[PeakDtype, _Positive] | None = None
    tdp_watts: _Positive | None = None
    interconnect: _Name | None = None
    interconnect_gbps: _Positive | None = None
    gpus_per_node: _Count | None = None
    price_per_hour_usd: _Positive | None = None
    price_source: _Name | None = None
    gfd_products: list[_Name] = Field(default_factory=list, max_length=32)
    nvml_names: list[_Name] = Field(default_factory=list, max_length=32)
    aliases: list[_Name] = Field(default_factory=list, max_length=32)
    source: _Name | None = None
    notes: str = Field(default="", max_length=2000)
    extra: dict[_Name, _Positive] = Field(default_factory=dict, max_length=32)


class UserCatalogFile(BaseModel):
    """The file: ``schema_version: 1`` (optional) and ``devices:``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    schema_version: Literal[1] = 1
    devices: list[UserDevice] = Field(min_length=1, max_length=MAX_USER_DEVICES)
