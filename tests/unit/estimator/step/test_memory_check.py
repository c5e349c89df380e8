"""Predicted memory against PyTorch's memory profiler on a real CPU training step (#19).

Parameters, gradients and optimizer state are arithmetic, so they must agree to 0.1 % (AdamW
keeps a 4-byte step counter per parameter tensor that the model leaves out); activations kept
for backward, and the step's peak of live tensors (`step.memory_walk`), to 5 % (docs/memory.md
has the full table, checkpointing included).
"""

from __future__ import annotations

import pytest

from gpuplan_estimator.core import options
from gpuplan_estimator.evaluation import memory_check

TOLERANCE_PCT = {"parameters": 0.1, "gradients": 0.1, "optimizer_state": 0.1,
                 "activations": 5.0, "step_peak": 5.0}


SDPA_CASE = memory_check.gpt2_case(checkpointing=False, sequence=256,
                                   attention=options.FUSED_ATTENTION)


@pytest.mark.parametrize("case", [memory_check.gpt2_case(checkpointing=False),
                                  SDPA_CASE, memory_check.cnn_case()],
                         ids=lambda c: f"{c.name}, {c.setting}")
def test_prediction_matches_the_measured_components(case: memory_check.MemoryCase) -> None:
    predicted, measured = memory_check.predict(case), memory_check.measure(case)
    assert measured["parameters"] > 0 and measured["activations"] > 0
    for component, tolerance in TOLERANCE_PCT.items():
        row = memory_check.MemoryRow(case.name, case.setting, component, predicted[component],
                               measured[component])
        assert abs(row.error_pct) <= tolerance, row


def test_checkpointing_lowers_the_measured_and_predicted_activations() -> None:
    plain, checkpointed = (memory_check.gpt2_case(checkpointing=c) for c in (False, True))
    assert memory_check.measure(checkpointed)["activations"] < memory_check.measure(
        plain)["activations"] / 4
    assert memory_check.predict(checkpointed)["activations"] < memory_check.predict(
        plain)["activations"] / 4


def test_render_names_the_command_and_torch_version() -> None:
    rows = [memory_check.MemoryRow("m", "s", "parameters", 110, 100)]
    text = memory_check.render(rows, command="cmd")
    assert "`cmd`" in text and "torch 2." in text
    assert "| m | s | parameters | 110 | 100 | +10.0 |" in text


def test_sdpa_keeps_no_score_matrix_and_the_fused_prediction_follows() -> None:
    """Hugging Face's "sdpa" GPT-2 keeps a third less than its eager twin at sequence 256 (the
    [batch, heads, S, S] probabilities are gone); priced as eager it would be ~45 % high."""
    eager = memory_check.gpt2_case(checkpointing=False, sequence=256)
    measured = memory_check.measure(SDPA_CASE)["activations"]
    assert measured < 0.8 * memory_check.measure(eager)["activations"]
    assert memory_check.predict(eager)["activations"] > 1.3 * measured
