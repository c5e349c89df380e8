"""The chart's `catalog` and `pricesProvider` values (#34) reach the estimator as it reads them."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import yaml

from gpuplan_estimator import devices
from gpuplan_testing.helm_render import CHART, helm

ENTRY = {"key": "h100-96gb-hbm2e", "base": "h100-pcie-80gb", "name": "NVIDIA H100 96GB HBM2e",
         "memory_gib": 96, "mem_bandwidth_gbps": 2400, "tdp_watts": 500,
         "gfd_products": ["NVIDIA-H100-96GB-HBM2e"]}


def _render(tmp_path: Path, values: dict[str, Any]) -> list[dict[str, Any]]:
    file = tmp_path / "values.yaml"
    file.write_text(yaml.safe_dump(values))
    out = subprocess.run([helm(), "template", "t", str(CHART), "--kube-version", "1.34.4",
                          "-f", str(file)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return [d for d in yaml.safe_load_all(out.stdout) if d]


def test_the_catalog_value_is_mounted_where_the_estimator_reads_it(tmp_path: Path) -> None:
    docs = _render(tmp_path, {"catalog": {"devices": [ENTRY]}})
    config = next(d for d in docs if d["kind"] == "ConfigMap"
                  and d["metadata"]["name"] == "t-gpuplan-catalog")
    pod = next(d for d in docs if d["kind"] == "Deployment"
               and d["metadata"]["name"] == "t-gpuplan-estimator")["spec"]["template"]["spec"]
    container = pod["containers"][0]
    env = {e["name"]: e.get("value") for e in container["env"]}
    mount = next(m for m in container["volumeMounts"] if m["name"] == "catalog")
    volume = next(v for v in pod["volumes"] if v["name"] == "catalog")
    assert volume["configMap"]["name"] == "t-gpuplan-catalog"
    file_name = Path(env[devices.CATALOG_ENV]).relative_to(mount["mountPath"])
    # What the pod would read: the ConfigMap key at the path the variable names.
    local = tmp_path / str(file_name)
    local.write_text(config["data"][str(file_name)])
    catalog = devices.load_catalog(user_file=devices.catalog_file_from_env(
        {devices.CATALOG_ENV: str(local)}))
    assert catalog.resolve("NVIDIA-H100-96GB-HBM2e").memory_bytes == 96 * 2**30


def test_without_the_value_nothing_is_mounted(tmp_path: Path) -> None:
    docs = _render(tmp_path, {})
    assert not [d for d in docs if d["kind"] == "ConfigMap"
                and d["metadata"]["name"].endswith("-catalog")]
    pod = next(d for d in docs if d["kind"] == "Deployment"
               and d["metadata"]["name"] == "t-gpuplan-estimator")["spec"]["template"]["spec"]
    assert devices.CATALOG_ENV not in {e["name"] for e in pod["containers"][0]["env"]}


def test_the_prices_provider_value_reaches_the_estimator(tmp_path: Path) -> None:
    docs = _render(tmp_path, {"pricesProvider": "lambda"})
    pod = next(d for d in docs if d["kind"] == "Deployment"
               and d["metadata"]["name"] == "t-gpuplan-estimator")["spec"]["template"]["spec"]
    env = {e["name"]: e.get("value") for e in pod["containers"][0]["env"]}
    provider = env[devices.PROVIDER_ENV]
    catalog = devices.apply_prices(devices.load_catalog(), provider)  # what the service does
    assert catalog.resolve("a10").price_source.startswith("lambda: ")
