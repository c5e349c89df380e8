"""Prices by provider (#34): one dated source per provider, a plan compares within the provider
the user names, every price says where and when it was taken, and unlisted GPUs stay unpriced."""

from __future__ import annotations

import asyncio
import base64
import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from aiohttp.test_utils import TestClient, TestServer

from gpuplan_estimator import devices
from gpuplan_estimator.core.errors import InvalidRequestError
from gpuplan_estimator.graph import examples
from gpuplan_estimator.interfaces.cli import main
from gpuplan_estimator.interfaces.http import service
from gpuplan_testing.contexts import roofline_context


def test_every_shipped_price_has_a_source_a_date_and_a_catalog_gpu() -> None:
    book = devices.shipped_book()
    catalog = devices.load_catalog()
    assert {"aws", "lambda"} <= set(book.providers)
    for entry in book.providers.values():
        assert entry.source.startswith("https://") and entry.as_of.year >= 2025
        for name in entry.prices:
            catalog.resolve(name)


def test_a_provider_prices_only_what_it_lists() -> None:
    catalog = devices.apply_prices(devices.load_catalog(), "lambda")
    listed = devices.shipped_book().providers["lambda"].prices
    for d in catalog.devices:
        if d.key in listed:
            assert d.price_per_hour_usd == listed[d.key]
            assert d.price_source.startswith("lambda: ") and "as of 2026-05-07" in d.price_source
        else:
            assert not d.has_price and d.price_source.startswith("lambda: not listed")


def _write(tmp_path: Path, document: Any) -> str:
    path = tmp_path / "prices.yaml"
    path.write_text(yaml.safe_dump(document))
    return str(path)


def test_a_one_provider_book_file_prices_alone_and_errors_name_the_field(
        tmp_path: Path) -> None:
    own = {"providers": {"mycloud": {"name": "My cloud", "source": "contract 2026-01",
                                     "as_of": "2026-01-15", "prices": {"t4": 0.2}}}}
    catalog = devices.apply_prices(devices.load_catalog(), _write(tmp_path, own))
    assert catalog.resolve("t4").price_per_hour_usd == 0.2
    assert "as of 2026-01-15" in catalog.resolve("t4").price_source
    assert not catalog.resolve("l4").has_price
    two = {"providers": {**own["providers"], "other": own["providers"]["mycloud"]}}
    with pytest.raises(InvalidRequestError, match="one provider"):
        devices.apply_prices(devices.load_catalog(), _write(tmp_path, two))
    bad = {"providers": {"mycloud": {**own["providers"]["mycloud"], "as_of": "soon"}}}
    with pytest.raises(InvalidRequestError, match=r"providers\.mycloud\.as_of"):
        devices.apply_prices(devices.load_catalog(), _write(tmp_path, bad))


def test_the_override_mapping_file_still_works_and_unknown_names_are_refused(
        tmp_path: Path) -> None:
    catalog = devices.apply_prices(devices.load_catalog(),
                                   _write(tmp_path, {"prices": {"t4": 0.5}}))
    assert catalog.resolve("t4").price_per_hour_usd == 0.5
    assert catalog.resolve("l4").has_price  # an override keeps the other catalog prices
    with pytest.raises(InvalidRequestError, match=r"neither a provider.*aws"):
        devices.apply_prices(devices.load_catalog(), "nocloud")


def test_a_plan_compares_within_the_named_provider_and_says_where_prices_come_from(
        capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["plan", str(examples.light_resnet50_path()), "--batch", "64", "--dataset-size",
            "6400", "--pool", "a10=1x8", "--pool", "NVIDIA-L4=1x8", "--json"]
    assert main.main([*argv, "--prices", "lambda"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["plan"]["device"] == "a10"  # the only GPU Lambda lists of the two
    assert not next(c for c in doc["candidates"] if c["device"] == "l4")["price_known"]
    assert any(n.startswith("price of a10: lambda: ") and "as of 2026-05-07" in n
               for n in doc["notes"])
    assert any(n.startswith("no price for l4") for n in doc["notes"])
    assert main.main(argv) == 0  # the catalog's prices come from several sources: said
    assert any("different sources" in n for n in json.loads(capsys.readouterr().out)["notes"])


def plan_body(**fields: Any) -> dict[str, Any]:
    model = base64.b64encode(Path(examples.light_resnet50_path()).read_bytes()).decode()
    return {"model_onnx_b64": model, "objective": {"prefer": "cheapest", "max_gpus": 8},
            "training": {"batch_size": 1, "dataset_size": 10000, "optimizer": "sgd"},
            "inventory": [{"gpu_type": "NVIDIA-H100-80GB-HBM3", "gpus_per_node": 8},
                          {"gpu_type": "NVIDIA-L4", "gpus_per_node": 4}], **fields}


def test_the_http_plan_field_prices_within_one_provider_and_refuses_others() -> None:

    async def check(client: TestClient) -> None:
        resp = await client.post("/v1/plans", json=plan_body(prices_provider="lambda"))
        assert resp.status == 200, await resp.text()
        body = await resp.json()
        assert body["plan"]["device"] == "h100-sxm-80gb"  # Lambda lists no L4
        assert any(n.startswith("price of h100-sxm-80gb: lambda: ") for n in body["notes"])
        assert any(n.startswith("no price for l4") for n in body["notes"])
        resp = await client.post("/v1/plans", json=plan_body(prices_provider="/etc/passwd"))
        assert resp.status == 422  # the service's answer to an invalid request field
        assert "prices_provider" in await resp.text()

    async def main() -> None:
        app = service.make_app(service.ServiceState(roofline_context),
                               service.ServiceSettings(bundle_poll_s=3600))
        async with TestClient(TestServer(app)) as client:
            await check(client)

    asyncio.run(main())
