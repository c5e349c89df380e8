"""Device catalog: data checks, name resolution, YAML validation, price overrides."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from gpuplan_estimator import devices
from gpuplan_estimator.core import errors
from gpuplan_estimator.devices import local_cpu
from gpuplan_testing.paths import SHARED_DATA

NVML_TO_KEY = {
    "NVIDIA H100 80GB HBM3": "h100-sxm-80gb",
    "NVIDIA L4": "l4",
    "NVIDIA A100 80GB PCIe": "a100-pcie-80gb",
    "NVIDIA A100-PCIE-40GB": "a100-pcie-40gb",
    "NVIDIA A100-SXM4-40GB": "a100-sxm4-40gb",
    "NVIDIA A100-SXM4-80GB": "a100-sxm4-80gb",
    "Tesla V100-PCIE-32GB": "v100-pcie-32gb",
    "Tesla V100-SXM2-32GB": "v100-sxm2-32gb",
    "Tesla V100-SXM2-16GB": "v100-sxm2-16gb",
    "Tesla T4": "t4",
    "Tesla P100-PCIE-16GB": "p100-pcie-16gb",
    "Tesla P4": "p4",
    "NVIDIA H100 PCIe": "h100-pcie-80gb",
    "NVIDIA A10": "a10",
    "NVIDIA A10G": "a10g",
    "NVIDIA L40S": "l40s",
    "NVIDIA H200": "h200-sxm-141gb",
    "NVIDIA B200": "b200",
    "AMD Instinct MI210": "mi210",
    "AMD Instinct MI250": "mi250",
    "AMD Instinct MI250X": "mi250x",
    "AMD Instinct MI300X": "mi300x",
}

# ../shared/data/gpu-ops/devices/*.json (NeuSight): the GPUs the measurements were taken on.
# Device: (Dev_Mem GB, Mem_Bw GB/s, Num_Sm, Core_Per_SM, Freq MHz, SingleFLOPs GFLOP/s, L2 MB)
MEASURED = {
    "Tesla P4": (8, 192, 40, 64, 1113, 5699, 2),
    "Tesla T4": (15, 320, 40, 64, 1590, 8141, 4),
    "Tesla P100-PCIE-16GB": (16, 732, 56, 64, 1380, 9519, 4),
    "Tesla V100-PCIE-32GB": (32, 900, 80, 64, 1370, 14029, 6),
    "NVIDIA A100-PCIE-40GB": (40, 1555, 108, 64, 1410, 19492, 40),
    "NVIDIA A100 80GB PCIe": (80, 1935, 108, 64, 1410, 19492, 40),
}

SHARED_DEVICES = SHARED_DATA / "gpu-ops" / "devices"


@pytest.fixture(scope="module")
def catalog() -> devices.Catalog:
    return devices.load_catalog()


@pytest.mark.parametrize(("nvml", "key"), sorted(NVML_TO_KEY.items()))
def test_nvml_name_and_its_gfd_label_resolve(catalog: devices.Catalog, nvml: str, key: str) -> None:
    assert catalog.resolve(nvml).key == key
    assert catalog.resolve(nvml.replace(" ", "-")).key == key  # the GFD convention
    assert catalog.resolve(nvml.upper()).key == key
    assert catalog.resolve(f"  {nvml.lower()} ").key == key
    assert devices.canonical_key(nvml) == key


def test_every_key_and_listed_label_resolves_to_its_device(catalog: devices.Catalog) -> None:
    for spec in catalog.devices:
        for name in (spec.key, spec.key.upper(), spec.name, *spec.nvml_names,
                     *spec.gfd_products, *spec.aliases):
            assert catalog.resolve(name) is spec, name


@pytest.mark.parametrize(("name", "key"), [
    ("NVIDIA-A100-SXM4-80GB", "a100-sxm4-80gb"),
    ("A100-SXM4-80GB", "a100-sxm4-80gb"),  # vendor prefix left out
    ("A100_PCIE_40GB", "a100-pcie-40gb"),
    ("Tesla-T4-SHARED", "t4"),  # GFD label with time-slicing on
    ("NVIDIA-H100-80GB-HBM3-SHARED", "h100-sxm-80gb"),
    ("h100 sxm", "h100-sxm-80gb"),
    ("MI300X", "mi300x"),
    ("v100 sxm2 16gb", "v100-sxm2-16gb"),
])
def test_forms_users_type(catalog: devices.Catalog, name: str, key: str) -> None:
    assert catalog.resolve(name).key == key


def test_gfd_labels_follow_the_nvml_name(catalog: devices.Catalog) -> None:
    for spec in catalog.devices:
        if spec.vendor == "nvidia":
            assert {n.replace(" ", "-") for n in spec.nvml_names} <= set(spec.gfd_products)


@pytest.mark.parametrize(("name", "expected"), [
    ("A100", {"a100-pcie-40gb", "a100-pcie-80gb", "a100-sxm4-40gb"}),
    ("NVIDIA H100 94GB HBM3", {"NVIDIA H100 80GB HBM3"}),
    ("Tesla K80", {"Tesla T4"}),
])
def test_unknown_name_suggests_three_close_names(
    catalog: devices.Catalog, name: str, expected: set[str]
) -> None:
    with pytest.raises(errors.UnknownDeviceError) as info:
        catalog.resolve(name)
    assert info.value.name == name
    assert len(info.value.suggestions) == 3
    assert expected <= set(info.value.suggestions)
    assert name in str(info.value) and "did you mean" in str(info.value)


def test_mig_slice_is_not_the_whole_gpu(catalog: devices.Catalog) -> None:
    # issue #32: a MIG instance is a device of its own (tests/unit/estimator/devices/test_mig.py)
    whole = catalog.resolve("NVIDIA-A100-SXM4-40GB")
    sliced = catalog.resolve("NVIDIA-A100-SXM4-40GB-MIG-1g.5gb")
    assert sliced.key != whole.key and sliced.memory_bytes == whole.memory_bytes // 8


def test_catalog_covers_the_required_devices(catalog: devices.Catalog) -> None:
    assert set(NVML_TO_KEY.values()) <= set(catalog.keys())
    assert len(catalog.keys()) == len(set(catalog.keys()))


def test_every_entry_has_facts_and_sources(catalog: devices.Catalog) -> None:
    for d in catalog.devices:
        assert d.source and d.price_source, d.key
        assert d.memory_bytes >= 8 * 2**30 and d.mem_bandwidth_gbps > 0
        assert d.sm_count > 0 and d.cores_per_sm > 0 and d.boost_clock_mhz > 0
        assert d.l2_cache_mb > 0 and d.tdp_watts > 0 and d.interconnect_gbps > 0
        peaks = d.peak_tflops
        # Dense tensor rates: fp16 >= tf32, fp8 = 2 x fp16 where both exist (no sparsity numbers).
        if "tf32" in peaks:
            assert peaks["fp16"] >= peaks["tf32"] >= peaks["fp32"] * 0.99, d.key
        if "fp8" in peaks:
            assert peaks["fp8"] == pytest.approx(2 * peaks["fp16"], rel=0.02), d.key
        if d.base_clock_mhz:
            assert d.base_clock_mhz < d.boost_clock_mhz, d.key


@pytest.mark.parametrize("nvml", sorted(MEASURED))
def test_measured_gpus_match_the_measurement_spec_files(
    catalog: devices.Catalog, nvml: str
) -> None:
    mem_gb, bw, sms, cores, freq, gflops, l2 = MEASURED[nvml]
    d = catalog.resolve(nvml)
    assert d.memory_bytes == mem_gb * 2**30
    assert (d.mem_bandwidth_gbps, d.sm_count, d.cores_per_sm) == (bw, sms, cores)
    assert (d.boost_clock_mhz, d.l2_cache_mb) == (freq, l2)
    assert d.peak_tflops["fp32"] * 1000 == pytest.approx(gflops)


def test_measured_table_is_the_shared_files() -> None:
    # The constants above were copied from the shared data; re-check them where it is mounted.
    files = sorted(SHARED_DEVICES.glob("*.json")) if SHARED_DEVICES.is_dir() else []
    if not files:
        pytest.skip(f"{SHARED_DEVICES} not present on this machine")
    import json

    for f in files:
        j = json.loads(f.read_text())
        row = (j["Dev_Mem"], j["Mem_Bw"], j["Num_Sm"], j["Core_Per_SM"], j["Freq"],
               j["SingleFLOPs"], j["L2Cache"])
        assert MEASURED[j["Device"]] == row


def test_default_catalog_is_cached() -> None:
    assert devices.load_catalog() is devices.load_catalog()


# --- validation --------------------------------------------------------------------------------

def _entry(**changes: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "key": "x1", "name": "X One", "vendor": "nvidia", "architecture": "hopper",
        "nvml_names": ["NVIDIA X1"],
        "gfd_products": ["NVIDIA-X1"], "memory_gib": 16, "mem_bandwidth_gbps": 500,
        "sm_count": 10, "cores_per_sm": 128, "base_clock_mhz": None, "boost_clock_mhz": 1500,
        "peak_tflops": {"fp32": 10, "fp16": 40}, "l2_cache_mb": 4, "interconnect": "pcie4",
        "interconnect_gbps": 64, "tdp_watts": 100, "price_per_hour_usd": 1.5,
        "price_source": "test", "source": "test",
    }
    base.update(changes)
    return {k: v for k, v in base.items() if v != "<drop>"}


def _write(tmp_path: Path, *entries: dict[str, Any]) -> Path:
    path = tmp_path / "gpus.yaml"
    path.write_text(yaml.safe_dump({"schema_version": 1, "devices": list(entries)}))
    return path


def test_a_valid_file_loads(tmp_path: Path) -> None:
    cat = devices.load_catalog(_write(tmp_path, _entry(), _entry(key="x2", nvml_names=[],
                                                                 gfd_products=[], name="X Two")))
    x1 = cat.resolve("NVIDIA-X1")
    assert cat.keys() == ("x1", "x2")
    assert x1.memory_bytes == 16 * 2**30 and x1.base_clock_mhz == 0.0 and x1.has_price
    assert x1.usable_memory_bytes == 0  # not recorded: fits use the datasheet
    nvml = devices.load_catalog(_write(tmp_path, _entry(usable_memory_mib=15360,
                                                        usable_memory_source="NVML total")))
    assert nvml.resolve("x1").usable_memory_bytes == 15360 * 2**20
    assert nvml.resolve("x1").usable_memory_source == "NVML total"


@pytest.mark.parametrize(("changes", "field"), [
    ({"mem_bandwidth_gbps": "<drop>"}, "mem_bandwidth_gbps"),
    ({"sm_count": 0}, "sm_count"),
    ({"tdp_watts": -5}, "tdp_watts"),
    ({"boost_clock_mhz": "fast"}, "boost_clock_mhz"),
    ({"boost_clock_mhz": None}, "boost_clock_mhz"),
    ({"source": ""}, "source"),
    ({"price_per_hour_usd": 0}, "price_per_hour_usd"),
    ({"price_per_hour_usd": "<drop>"}, "price_per_hour_usd"),
    ({"memory_gib": "<drop>"}, "memory_gib"),
    ({"memory_bytes": 10}, "memory_gib"),  # both given
    ({"peak_tflops": {"fp16": 10}}, "peak_tflops"),
    ({"peak_tflops": {"fp32": 10, "int8": 100}}, "peak_tflops.int8"),
    ({"peak_tflops": {"fp32": 0}}, "fp32"),
    ({"vendor": "intel"}, "vendor"),
    ({"key": "X 1"}, "key"),
    ({"nvml_names": "NVIDIA X1"}, "nvml_names"),
    ({"mem_bandwith_gbps": 5}, "mem_bandwith_gbps"),  # a typo is not silently ignored
    ({"usable_memory_mib": 15000}, "usable_memory_source"),  # a capacity needs its source
    ({"usable_memory_source": "nvml"}, "usable_memory_mib"),
    ({"usable_memory_mib": 0, "usable_memory_source": "nvml"}, "usable_memory_mib"),
    ({"usable_memory_mib": 17000, "usable_memory_source": "nvml"}, "usable_memory_mib"),
    ({"usable_memory_mib": 15000, "usable_memory_source": " "}, "usable_memory_source"),
])
def test_invalid_entry_names_entry_and_field(
    tmp_path: Path, changes: dict[str, Any], field: str
) -> None:
    with pytest.raises(errors.CatalogError) as info:
        devices.load_catalog(_write(tmp_path, _entry(**changes)))
    message = str(info.value)
    assert f"'{field}'" in message
    assert message.startswith(("device 'x1':", "device 'X 1':")), message


def test_duplicate_names_across_devices_are_rejected(tmp_path: Path) -> None:
    with pytest.raises(errors.CatalogError, match=r"NVIDIA-X1.*already belongs to 'x1'"):
        devices.load_catalog(_write(tmp_path, _entry(), _entry(key="x2", name="X Two",
                                                               nvml_names=[])))
    with pytest.raises(errors.CatalogError, match="duplicate key 'x1'"):
        devices.load_catalog(_write(tmp_path, _entry(), _entry(nvml_names=[], gfd_products=[],
                                                               name="other")))


@pytest.mark.parametrize("text", ["devices: [", "[1, 2]", "devices: []", "devices: [3]"])
def test_malformed_documents(tmp_path: Path, text: str) -> None:
    path = tmp_path / "gpus.yaml"
    path.write_text(text)
    with pytest.raises(errors.CatalogError, match=r"gpus\.yaml|device #0"):
        devices.load_catalog(path)


def test_missing_and_oversized_files(tmp_path: Path) -> None:
    with pytest.raises(errors.CatalogError, match=r"nope\.yaml"):
        devices.load_catalog(tmp_path / "nope.yaml")
    big = tmp_path / "big.yaml"
    big.write_text("#" * (devices.MAX_CATALOG_BYTES + 1))
    with pytest.raises(errors.CatalogError, match="exceeds"):
        devices.load_catalog(big)


def test_edited_file_is_reloaded(tmp_path: Path) -> None:
    path = _write(tmp_path, _entry())
    assert devices.load_catalog(path).resolve("x1").tdp_watts == 100
    path.write_text(yaml.safe_dump({"devices": [_entry(tdp_watts=120)]}))
    import os

    os.utime(path, ns=(1, 10**18))  # guarantee a new mtime even on coarse clocks
    assert devices.load_catalog(path).resolve("x1").tdp_watts == 120


# --- prices ------------------------------------------------------------------------------------

def test_price_overrides_by_any_name(catalog: devices.Catalog) -> None:
    cat = devices.load_catalog(price_overrides={"Tesla T4": 0.11, "NVIDIA-L4": 0.22, "mi210": 3})
    assert cat.resolve("t4").price_per_hour_usd == 0.11
    assert cat.resolve("l4").price_per_hour_usd == 0.22
    assert cat.resolve("mi210").has_price and cat.resolve("mi210").price_source == "override"
    assert cat.resolve("a10").price_per_hour_usd == catalog.resolve("a10").price_per_hour_usd
    # The cached default catalog is not changed by an override.
    assert devices.load_catalog().resolve("t4").price_per_hour_usd == 0.35
    assert not devices.load_catalog().resolve("mi210").has_price


@pytest.mark.parametrize("price", [0, -1.0, "cheap", True])
def test_bad_price_override_names_the_device(price: Any) -> None:
    with pytest.raises(errors.InvalidRequestError, match=r"price_overrides\['t4'\]"):
        devices.load_catalog(price_overrides={"t4": price})


def test_price_override_for_unknown_device() -> None:
    with pytest.raises(errors.UnknownDeviceError):
        devices.load_catalog(price_overrides={"Tesla K80": 0.5})


# --- cpu -----------------------------------------------------------------------------------------

def test_cpu_resolves_to_the_calibrated_local_device(tmp_path: Path) -> None:
    calls: list[local_cpu.CalibrationSizes] = []

    def fake(sizes: local_cpu.CalibrationSizes) -> local_cpu.HostPeaks:
        calls.append(sizes)
        return local_cpu.HostPeaks(peak_gflops_fp32=123.0, mem_bandwidth_gbps=9.0)

    local_cpu.local_cpu_device(cache_dir=tmp_path, measure_fn=fake)
    spec = devices.resolve_device("CPU", cpu_cache_dir=tmp_path)  # reads the cache
    assert spec.key == "cpu" and spec.vendor == "cpu"
    assert spec.peak_tflops["fp32"] == pytest.approx(0.123) and spec.mem_bandwidth_gbps == 9.0
    assert len(calls) == 1
    assert devices.canonical_key("cpu") == "cpu"
    assert devices.resolve_device("Tesla-T4").key == "t4"


def test_catalog_survives_pickle_and_deepcopy(catalog: devices.Catalog) -> None:
    # Services hand the catalog to worker processes; mappingproxy fields would break that.
    import copy
    import pickle

    for clone in (pickle.loads(pickle.dumps(catalog)), copy.deepcopy(catalog)):
        assert clone == catalog and clone.resolve("NVIDIA-L4") == catalog.resolve("l4")


def test_the_catalog_reads_the_same_with_libyaml_and_refuses_bad_yaml(tmp_path: Path) -> None:
    """The shipped catalog is read with libyaml's safe loader where PyYAML has it (#34): the
    same document as the pure-Python loader gives, and broken YAML is still named."""
    from gpuplan_estimator.devices import catalog

    text = catalog.DEFAULT_CATALOG_PATH.read_text(encoding="utf-8")
    assert yaml.load(text, Loader=catalog.SAFE_YAML_LOADER) == yaml.safe_load(text)
    bad = tmp_path / "gpus.yaml"
    bad.write_text("devices: [unclosed\n", encoding="utf-8")
    with pytest.raises(errors.CatalogError, match=r"gpus\.yaml: not valid YAML"):
        devices.load_catalog(bad)
