"""Prices: from a file or the chart's env, never free when unknown, and budgets that need them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpuplan_estimator import devices
from gpuplan_estimator.core.errors import InvalidRequestError
from gpuplan_estimator.interfaces.cli import main
from gpuplan_estimator.parallel.scaling import ScalingModel
from gpuplan_estimator.planning import placement

GIB = 2**30
SHAPE = placement.TrainingShape(global_batch=64, steps_per_epoch=1000, epochs=1)
CHART_VALUES = Path(__file__).parents[4] / "charts" / "gpuplan" / "values.yaml"


def profile(key: str, price: float | None, fwd: float) -> placement.StepProfile:
    point = placement.StepPoint(per_gpu_batch=64, forward_ms=fwd, backward_ms=2 * fwd,
                                optimizer_ms=1.0, memory_bytes=GIB, p10_ms=3 * fwd,
                                p90_ms=3 * fwd + 2)
    return placement.StepProfile(device_key=key, memory_capacity_bytes=80 * GIB,
                                 gradient_bytes=2**20, price_per_gpu_hour_usd=price,
                                 interconnect_gbps=600.0, points=(point,))


PROFILES = {"priced": profile("priced", 2.0, 30.0), "unpriced": profile("unpriced", None, 10.0)}
POOLS = [placement.GpuPool("PRICED", "priced", 8, 1, 8),
         placement.GpuPool("UNPRICED", "unpriced", 8, 1, 8)]


@pytest.mark.parametrize("prefer", ["cheapest", "balanced"])
def test_an_unknown_price_is_never_ranked_as_free(prefer: str) -> None:
    out = placement.plan(PROFILES, POOLS, SHAPE, placement.Objective(prefer=prefer, max_gpus=1),
                         ScalingModel())
    assert out.chosen is not None and out.chosen.gpu_type == "PRICED"
    assert [c.gpu_type for c in out.candidates] == ["PRICED", "UNPRICED"]
    assert out.candidates[1].cost_usd is None


def test_fastest_may_choose_an_unpriced_gpu_and_a_budget_cannot() -> None:
    fastest = placement.plan(PROFILES, POOLS, SHAPE, placement.Objective("fastest", 1),
                             ScalingModel())
    assert fastest.chosen is not None and fastest.chosen.gpu_type == "UNPRICED"
    budgeted = placement.plan(PROFILES, POOLS, SHAPE,
                              placement.Objective("fastest", 1, budget_usd=100.0), ScalingModel())
    assert budgeted.chosen is not None and budgeted.chosen.gpu_type == "PRICED"
    (why,) = [r.reason for r in budgeted.rejected if r.gpu_type == "UNPRICED"]
    assert "no known price for unpriced" in why and "--prices" in why


def test_an_uneven_batch_split_is_refused_with_its_reason() -> None:
    out = placement.evaluate(PROFILES["priced"], POOLS[0], SHAPE, 3, ScalingModel())
    assert isinstance(out, placement.Rejection)
    assert out.reason == "batch 64 does not split evenly over 3 GPUs (21.3 per GPU)"


def test_a_prices_file_has_the_chart_values_schema(tmp_path: Path) -> None:
    good = tmp_path / "prices.yaml"
    good.write_text("prices:\n  mi250x: 1.75\n  NVIDIA-H100-80GB-HBM3: 2.5\n")
    assert devices.read_prices_file(good) == {"mi250x": 1.75, "NVIDIA-H100-80GB-HBM3": 2.5}
    catalog = devices.load_catalog(price_overrides=devices.read_prices_file(good))
    assert catalog.resolve("mi250x").price_per_hour_usd == 1.75
    assert catalog.resolve("h100-sxm-80gb").price_source == "override"
    # The chart's own values file is a valid (empty) prices file.
    assert devices.read_prices_file(CHART_VALUES) == {}
    for text, needle in (("mi250x: 1.0\n", "top-level 'prices:'"),
                         ("prices:\n  mi250x: -1\n", "prices.mi250x"),
                         ("prices:\n  mi250x: free\n", "prices.mi250x"),
                         ("prices: [1, 2]\n", "must be a mapping"),
                         ("prices: {a: [\n", "not YAML")):
        bad = tmp_path / "bad.yaml"
        bad.write_text(text)
        with pytest.raises(InvalidRequestError, match=needle.replace("[", r"\[")):
            devices.read_prices_file(bad)


def test_the_service_reads_the_chart_env() -> None:
    assert devices.prices_from_env({}) == {}
    env = {"GPUPLAN_PRICES_JSON": json.dumps({"mi250": 1.5})}
    assert devices.prices_from_env(env) == {"mi250": 1.5}
    with pytest.raises(InvalidRequestError, match="GPUPLAN_PRICES_JSON"):
        devices.prices_from_env({"GPUPLAN_PRICES_JSON": "{"})


def test_plan_with_a_prices_file_prices_what_the_catalog_does_not(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from gpuplan_estimator.graph import examples

    prices = tmp_path / "prices.yaml"
    prices.write_text("prices:\n  mi250x: 0.01\n")
    argv = ["plan", str(examples.light_resnet50_path()), "--batch", "64", "--dataset-size",
            "6400", "--pool", "mi250x=1x8", "--pool", "t4=1x8", "-o", "json"]
    assert main.main(argv) == 0
    unpriced = json.loads(capsys.readouterr().out)
    assert unpriced["plan"]["gpu_type"] == "t4"  # the mi250x has no catalog price
    assert main.main([*argv, "--prices", str(prices)]) == 0
    priced = json.loads(capsys.readouterr().out)
    assert priced["plan"]["gpu_type"] == "mi250x" and priced["plan"]["price_known"]
