"""calibration: hierarchical shrinkage of measured/predicted ratios, and its application."""

from __future__ import annotations

import math

import pytest

from gpuplan_estimator.core.errors import InvalidRequestError
from gpuplan_estimator.planning import calibrating


def _o(device: str, mode: str, predicted: float, measured: float, model: str = "m"
       ) -> calibrating.Outcome:
    return calibrating.Outcome(device, mode, predicted, measured, model=model)


def test_no_outcomes_is_identity() -> None:
    fitted = calibrating.fit([])
    c = fitted.correction("t4", "train")
    assert (c.factor, c.outcomes, c.level) == (1.0, 0, "none")
    out = calibrating.apply(fitted, "t4", "train", 100.0, 90.0, 110.0)
    assert out.median_ms == 100.0
    # The prior spread still widens an interval narrower than ±15 % at one sd.
    assert out.p10_ms < 90.0 and out.p90_ms > 110.0


def test_shrinkage_weights_by_pseudo_count() -> None:
    settings = calibrating.CalibrationSettings(prior_outcomes=3.0)
    # One outcome 20 % slow on t4: global = mode = 1/4 of log(1.2); device gets 1/4 of the
    # distance from the mode to log(1.2) on top.
    fitted = calibrating.fit([_o("t4", "train", 100.0, 120.0)], settings)
    g = math.log(1.2) / 4
    assert math.log(fitted.overall.factor) == pytest.approx(g)
    mode = (math.log(1.2) + 3 * g) / 4
    assert math.log(fitted.by_mode["train"].factor) == pytest.approx(mode)
    dev = (math.log(1.2) + 3 * mode) / 4
    assert math.log(fitted.correction("t4", "train").factor) == pytest.approx(dev)


def test_many_consistent_outcomes_converge_to_the_ratio() -> None:
    outs = [_o("v100", "inference", 100.0, 90.0, model=f"m{i}") for i in range(200)]
    c = calibrating.fit(outs).correction("v100", "inference")
    assert c.factor == pytest.approx(0.9, rel=0.01)
    assert c.level == "device+mode" and c.outcomes == 200
    assert c.log_sd == pytest.approx(calibrating.CalibrationSettings().min_log_sd, abs=0.02)


def test_unknown_device_inherits_its_modes_factor() -> None:
    outs = [_o("t4", "train", 100.0, 80.0), _o("v100", "train", 100.0, 80.0)]
    fitted = calibrating.fit(outs)
    c = fitted.correction("h100-sxm-80gb", "train")
    assert c.level == "mode" and c.factor < 1.0
    assert fitted.correction("h100-sxm-80gb", "inference").level == "global"


def test_outliers_are_clipped() -> None:
    settings = calibrating.CalibrationSettings(prior_outcomes=1e-9)
    fitted = calibrating.fit([_o("t4", "train", 1.0, 1000.0)], settings)
    assert fitted.overall.factor == pytest.approx(4.0)


@pytest.mark.parametrize("predicted,measured", [(0.0, 1.0), (1.0, -1.0), (math.nan, 1.0)])
def test_bad_outcomes_raise(predicted: float, measured: float) -> None:
    with pytest.raises(InvalidRequestError, match="positive"):
        calibrating.fit([_o("t4", "train", predicted, measured)])


def test_apply_scales_and_widens() -> None:
    fitted = calibrating.fit([_o("t4", "train", 100.0, 50.0, model=f"m{i}") for i in range(50)])
    out = calibrating.apply(fitted, "t4", "train", 200.0, 190.0, 210.0)
    assert out.median_ms == pytest.approx(100.0, rel=0.05)
    assert out.p10_ms <= out.median_ms <= out.p90_ms
    assert out.p90_ms / out.median_ms >= math.exp(1.28 * out.correction.log_sd) - 1e-9


def test_apply_rejects_inverted_interval() -> None:
    with pytest.raises(InvalidRequestError, match="interval"):
        calibrating.apply(calibrating.fit([]), "t4", "train", 100.0, 120.0, 130.0)


def test_outcomes_excluding_model_and_device() -> None:
    outs = [_o("t4", "train", 1, 1, "a"), _o("v100", "train", 1, 1, "a"),
            _o("t4", "train", 1, 1, "b")]
    assert [o.model for o in calibrating.outcomes_excluding(outs, model="a")] == ["b"]
    assert calibrating.outcomes_excluding(outs, model="b", device="t4") == (outs[1],)
    assert set(calibrating.summary(calibrating.fit(outs))) == {
        "t4/train", "v100/train", "*/train", "*/*"}


def test_calibrate_without_outcomes_leaves_the_prediction_as_it_was() -> None:
    out = calibrating.calibrate(calibrating.CalibrationTable(), "t4", "train", 100.0, 90.0, 110.0)
    assert (out.median_ms, out.p10_ms, out.p90_ms) == (100.0, 90.0, 110.0)
    assert out.correction == calibrating.IDENTITY
    assert out.correction.as_dict() == {"factor": 1.0, "outcomes": 0, "level": "none"}


def test_calibrate_with_outcomes_is_apply_and_tolerates_rounding_in_the_interval() -> None:
    fitted = calibrating.fit([_o("t4", "train", 100.0, 150.0)])
    assert calibrating.calibrate(fitted, "t4", "train", 200.0, 190.0, 210.0) == calibrating.apply(
        fitted, "t4", "train", 200.0, 190.0, 210.0)
    # A summed p10 a hair above the summed median is rounding, not an inverted interval.
    out = calibrating.calibrate(fitted, "t4", "train", 100.0, 100.0 + 1e-12, 100.0)
    assert out.p10_ms <= out.median_ms <= out.p90_ms
    assert out.correction.level == "device+mode" and out.correction.outcomes == 1


def test_calibration_mode_of_a_request() -> None:
    modes = (calibrating.mode_of("train"), calibrating.mode_of("inference"))
    assert modes == ("train", "inference")
