"""A user's catalog file (#34): devices added or overridden by spec, validated per field, shown
with their source, labelled extrapolated, and priced between the parts they sit between."""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpuplan_estimator import devices
from gpuplan_estimator.core import errors
from gpuplan_estimator.core.layers import ModelGraph
from gpuplan_estimator.cost.predictors import LatencyPredictor
from gpuplan_estimator.graph import examples
from gpuplan_estimator.interfaces.cli import main
from gpuplan_estimator.latency import basis, selection
from gpuplan_estimator.planning import estimates
from gpuplan_estimator.step.decomposition import TrainingSettings

# An H100 with 96 GB HBM2e at 500 W: the PCIe card's clocks, the SXM part's SMs, bandwidth and
# peaks in between (illustrative figures for a part the shipped catalog lacks).
H100_96 = {
    "key": "h100-96gb-hbm2e", "name": "NVIDIA H100 96GB HBM2e", "vendor": "nvidia",
    "architecture": "hopper", "memory_gib": 96, "mem_bandwidth_gbps": 2400, "sm_count": 132,
    "cores_per_sm": 128, "boost_clock_mhz": 1755, "base_clock_mhz": 1125, "l2_cache_mb": 50,
    "peak_tflops": {"fp32": 59.3, "tf32": 437, "fp16": 874, "bf16": 874, "fp8": 1748},
    "tdp_watts": 500, "interconnect": "nvlink4", "interconnect_gbps": 600, "gpus_per_node": 4,
    "gfd_products": ["NVIDIA-H100-96GB-HBM2e"], "source": "vendor sheet of my cluster's part",
}


def _write(tmp_path: Path, document: Any, name: str = "catalog.yaml") -> Path:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(document))
    return path


def test_a_new_device_is_added_with_its_spec_source_and_label(tmp_path: Path) -> None:
    path = _write(tmp_path, {"devices": [H100_96]})
    catalog = devices.load_catalog(user_file=path)
    spec = catalog.resolve("NVIDIA-H100-96GB-HBM2e")
    assert spec.key == "h100-96gb-hbm2e"
    assert spec.memory_bytes == 96 * 2**30
    assert spec.peak_tflops["bf16"] == 874
    assert spec.extra[devices.GPUS_PER_NODE_EXTRA] == 4
    assert spec.catalog_source == str(path)
    assert catalog.resolve("t4").catalog_source == devices.SHIPPED
    assert len(catalog.devices) == len(devices.load_catalog().devices) + 1


def test_an_override_replaces_only_the_given_fields(tmp_path: Path) -> None:
    path = _write(tmp_path, {"devices": [{"key": "t4", "tdp_watts": 60,
                                          "price_per_hour_usd": 0.2}]})
    shipped = devices.load_catalog().resolve("t4")
    t4 = devices.load_catalog(user_file=path).resolve("Tesla-T4")
    assert (t4.tdp_watts, t4.price_per_hour_usd) == (60, 0.2)
    assert t4.mem_bandwidth_gbps == shipped.mem_bandwidth_gbps
    assert t4.gfd_products == shipped.gfd_products
    assert t4.catalog_source == str(path)


def test_a_device_built_on_a_shipped_one_keeps_its_spec_not_its_names(tmp_path: Path) -> None:
    path = _write(tmp_path, {"devices": [{
        "key": "h100-96-pcie", "base": "h100-pcie-80gb", "name": "H100 96GB PCIe",
        "memory_gib": 96, "gfd_products": ["NVIDIA-H100-96GB-PCIe"]}]})
    spec = devices.load_catalog(user_file=path).resolve("NVIDIA-H100-96GB-PCIe")
    base = devices.load_catalog().resolve("h100-pcie-80gb")
    assert spec.sm_count == base.sm_count and spec.memory_bytes == 96 * 2**30
    assert spec.nvml_names == () and not spec.has_price and spec.usable_memory_bytes == 0
    assert "based on h100-pcie-80gb" in spec.source


@pytest.mark.parametrize(("entry", "path"), [
    ({**H100_96, "mem_bandwidth_gbps": -1}, "devices[0].mem_bandwidth_gbps"),
    ({**H100_96, "peak_tflops": {"bf17": 3}}, "devices[0].peak_tflops.bf17"),
    ({**H100_96, "colour": "red"}, "devices[0].colour"),
    ({**H100_96, "key": "H100 96"}, "devices[0].key"),
    ({**H100_96, "gfd_products": ["NVIDIA-H100-80GB-HBM3"]}, "devices[0].gfd_products[0]"),
    ({k: v for k, v in H100_96.items() if k != "sm_count"}, "devices[0].sm_count"),
    ({"key": "x", "base": "no-such-gpu", "name": "X"}, "devices[0].base"),
])
def test_errors_name_the_file_and_the_field_path(tmp_path: Path, entry: dict[str, Any],
                                                 path: str) -> None:
    file = _write(tmp_path, {"devices": [entry]})
    with pytest.raises(errors.CatalogError) as caught:
        devices.load_catalog(user_file=file)
    assert f"{file}: {path}:" in str(caught.value)


def test_the_file_is_size_capped_and_json_works(tmp_path: Path) -> None:
    big = tmp_path / "big.yaml"
    big.write_text("#" * (devices.MAX_USER_CATALOG_BYTES + 1))
    with pytest.raises(errors.CatalogError, match="larger than"):
        devices.load_catalog(user_file=big)
    as_json = tmp_path / "catalog.json"
    as_json.write_text(json.dumps({"devices": [H100_96]}))
    assert devices.load_catalog(user_file=as_json).resolve("h100-96gb-hbm2e").sm_count == 132


@functools.cache
def _shipped() -> LatencyPredictor:
    return selection.select_predictor(None)[0]


def _step_ms(g: ModelGraph, specs: list[devices.DeviceSpec]) -> dict[str, float]:
    results = estimates.estimate(g, specs, TrainingSettings(batch_size=1, precision="bf16"),
                                 predictor=_shipped())
    return {r.device: r.step_time_ms for r in results}


def test_a_user_device_is_extrapolated_and_priced_between_its_neighbours(tmp_path: Path) -> None:
    catalog = devices.load_catalog(user_file=_write(tmp_path, {"devices": [H100_96]}))
    specs = [catalog.resolve(k) for k in ("h100-pcie-80gb", "h100-96gb-hbm2e", "h100-sxm-80gb")]
    assert basis.data_basis(_shipped(), specs[1]) == basis.EXTRAPOLATED
    step = _step_ms(examples.gpt2_medium(1), specs)
    assert step["h100-sxm-80gb"] < step["h100-96gb-hbm2e"] < step["h100-pcie-80gb"]


def test_an_override_of_a_measured_key_with_other_specs_is_extrapolated(tmp_path: Path) -> None:
    manifest = _shipped().bundle.manifest  # type: ignore[attr-defined]
    measured = next(d for d in devices.load_catalog().devices
                    if d.key in manifest["devices"] and d.platform == "gpu")
    assert basis.data_basis(_shipped(), measured) == basis.MEASURED
    same = _write(tmp_path, {"devices": [{"key": measured.key, "tdp_watts": 1}]}, "same.yaml")
    assert basis.data_basis(_shipped(), devices.load_catalog(user_file=same).resolve(
        measured.key)) == basis.MEASURED  # power is no speed spec: the measured part
    faster = _write(tmp_path, {"devices": [{"key": measured.key, "mem_bandwidth_gbps": 9999}]},
                    "faster.yaml")
    assert basis.data_basis(_shipped(), devices.load_catalog(user_file=faster).resolve(
        measured.key)) == basis.EXTRAPOLATED


def test_devices_command_shows_each_rows_source(tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    path = _write(tmp_path, {"devices": [H100_96]})
    assert main.main(["devices", "--catalog", str(path), "-o", "json"]) == 0
    rows = {d["key"]: d for d in json.loads(capsys.readouterr().out)["devices"]}
    assert rows["h100-96gb-hbm2e"]["catalog_source"] == str(path)
    assert rows["h100-96gb-hbm2e"]["data_basis"] == basis.EXTRAPOLATED
    assert rows["t4"]["catalog_source"] == devices.SHIPPED


def test_a_bad_catalog_flag_fails_naming_file_and_field(tmp_path: Path,
                                                        capsys: pytest.CaptureFixture[str]
                                                        ) -> None:
    path = _write(tmp_path, {"devices": [{**H100_96, "sm_count": 0}]})
    assert main.main(["devices", "--catalog", str(path)]) != 0
    assert f"{path}: devices[0].sm_count" in capsys.readouterr().err
