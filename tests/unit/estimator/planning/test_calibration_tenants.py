"""calibration per tenant (issue #33): a namespace's share of a group's weight is bounded, so a
flood of outcomes from one tenant moves everyone's factor by at most the stated bound."""

from __future__ import annotations

import argparse
import asyncio
import math

import pytest
from aiohttp.test_utils import TestClient, TestServer

from gpuplan_estimator.core.errors import InvalidRequestError
from gpuplan_estimator.interfaces.cli import arguments
from gpuplan_estimator.interfaces.http import service
from gpuplan_estimator.planning import calibrating
from gpuplan_testing import contexts

ROWS = [("t4", "train", 100, 120), ("t4", "train", 100, 131), ("t4", "train", 50, 52),
        ("a100", "train", 80, 70), ("a100", "inference", 10, 14), ("t4", "inference", 10, 9.5),
        ("h100", "train", 40, 200)]
# Fitted by the calibration before namespaces existed (commit 3dff67c, `fit` over ROWS with
# default settings): (factor, log_sd) per group, printed with repr.
BEFORE = {("a100", "inference"): (1.2438643062562886, 0.30240930053956283),
          ("a100", "train"): (1.2059025827388683, 0.4579198433764087),
          ("h100", "train"): (1.763295949495756, 0.5930463903938493),
          ("t4", "inference"): (1.1289426955319621, 0.30887080871636086),
          ("t4", "train"): (1.2573449877514864, 0.35957260216926984)}
BEFORE_OVERALL = (1.2250126026103234, 0.4117307641130609)


def _o(device: str, ratio: float, namespace: str, mode: str = "train") -> calibrating.Outcome:
    return calibrating.Outcome(device, mode, 100.0, 100.0 * ratio, namespace=namespace)


@pytest.mark.parametrize("namespace", ["", "team-a"])
def test_a_single_namespace_cluster_fits_exactly_as_before(namespace: str) -> None:
    fitted = calibrating.fit([calibrating.Outcome(d, m, p, x, namespace=namespace)
                              for d, m, p, x in ROWS])
    assert {k: (c.factor, c.log_sd) for k, c in fitted.by_device_mode.items()} == BEFORE
    assert (fitted.overall.factor, fitted.overall.log_sd) == BEFORE_OVERALL


def test_namespaces_within_the_share_are_not_weighed_down() -> None:
    # Three tenants at 10 outcomes each: a third each, under 0.34.
    rows = [_o("t4", 1.0 + i / 100, ns) for ns in "abc" for i in range(10)]
    assert calibrating.namespace_weights([o.namespace for o in rows], 0.34) == [1.0] * 30
    plain = calibrating.fit([_o("t4", o.measured_ms / 100.0, "") for o in rows])
    assert calibrating.fit(rows).correction("t4", "train") == plain.correction("t4", "train")


def test_the_cap_holds_every_namespace_to_its_share() -> None:
    cap = calibrating.namespace_cap([1000, 20, 20], 0.34)
    assert cap / (cap + 40) == pytest.approx(0.34)
    # Two namespaces cannot each stay under 0.34: equal halves, the larger one capped.
    assert calibrating.namespace_cap([1000, 20], 0.34) == 20
    assert calibrating.namespace_cap([7], 0.34) == 7  # alone: whole
    weights = calibrating.namespace_weights(["h"] * 1000 + ["a"] * 20 + ["b"] * 20, 0.34)
    assert sum(weights[:1000]) == pytest.approx(cap)
    assert weights[1000:] == [1.0] * 40  # the honest outcomes keep their full weight


def test_a_hostile_flood_moves_the_factor_at_most_the_stated_bound() -> None:
    honest = [_o("t4", 1.1, ns) for ns in ("team-a", "team-b") for _ in range(20)]
    hostile = [_o("t4", 3.0, "mallory") for _ in range(1000)]
    before = calibrating.fit(honest).correction("t4", "train")
    after = calibrating.fit(honest + hostile).correction("t4", "train")
    assert after.outcomes == 1040  # every honest outcome is still counted
    low, high = calibrating.tenant_factor_range([math.log(1.1)] * 40, 3)
    assert low <= before.factor <= high and low <= after.factor <= high
    # The flood's own ratio (3, inside the ×4 clip) bounds it tighter: (1-s) ln 1.1 + s ln 3.
    assert math.log(after.factor) <= 0.66 * math.log(1.1) + 0.34 * math.log(3.0) + 1e-12
    assert after.factor > before.factor * 1.3  # it does move: the bound is not vacuous
    unweighted = calibrating.fit(honest + hostile, calibrating.CalibrationSettings(
        max_namespace_share=1.0)).correction("t4", "train")
    assert unweighted.factor > high  # without the cap the flood escapes the bound


def test_a_flood_on_another_gpu_type_reaches_this_one_only_within_the_bound() -> None:
    honest = [_o("t4", 1.0, ns) for ns in ("team-a", "team-b") for _ in range(10)]
    hostile = [_o("a100", 4.0, "mallory") for _ in range(1000)]
    after = calibrating.fit(honest + hostile).correction("t4", "train")
    low, high = calibrating.tenant_factor_range([0.0] * 20, 3)
    assert low == pytest.approx(4.0 ** -0.34)
    assert after.factor <= high and high == pytest.approx(4.0 ** 0.34)


def test_bad_share_and_namespace_count_are_refused() -> None:
    with pytest.raises(InvalidRequestError, match="max_namespace_share"):
        calibrating.fit([_o("t4", 1.0, "a")], calibrating.CalibrationSettings(
            max_namespace_share=0.0))
    with pytest.raises(InvalidRequestError, match="namespaces_in_group"):
        calibrating.tenant_factor_range([], 0)


@pytest.mark.parametrize(("share", "bounded"), [(0.34, True), (1.0, False)])
def test_the_service_fits_with_its_max_namespace_share(share: float, bounded: bool) -> None:
    """`--max-namespace-share` (ServiceSettings) reaches the refit the service runs at start."""
    flood = [_o("l4", 1.0, ns) for ns in ("team-a", "team-b") for _ in range(20)] + [
        _o("l4", 3.0, "mallory") for _ in range(1000)]
    state = service.ServiceState(contexts.roofline_context)

    async def main() -> float:
        app = service.make_app(state, service.ServiceSettings(
            bundle_poll_s=3600, max_namespace_share=share), outcome_history=lambda: flood)
        async with TestClient(TestServer(app)) as client:
            models = await (await client.get("/v1/models")).json()
            return float(models["calibration"]["factors"]["l4/train"])

    factor = asyncio.run(main())
    _low, high = calibrating.tenant_factor_range([0.0] * 40, 3)
    assert (factor <= high) is bounded


def test_the_serve_flag_takes_a_fraction() -> None:
    assert arguments.share("0.5") == 0.5
    for bad in ("0", "1.5", "nan"):
        with pytest.raises(argparse.ArgumentTypeError):
            arguments.share(bad)
