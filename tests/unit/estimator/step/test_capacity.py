"""Fit decisions against configurations known to run or to run out of memory (issue #30).

Capacity is what the card gives a process (NVML's total, `usable_memory_mib` in gpus.yaml),
and the need is the walked allocated peak plus the CUDA context and allocator reserve.
"""

from __future__ import annotations

from typing import Any

import pytest

from gpuplan_estimator import devices
from gpuplan_estimator.core.layers import ModelGraph
from gpuplan_estimator.cost import roofline
from gpuplan_estimator.graph import batching, exporting
from gpuplan_estimator.planning import estimates
from gpuplan_estimator.step import memory
from gpuplan_estimator.step.decomposition import TrainingSettings

GIB = 2**30
# Published GPT-3 shapes (Brown et al. 2020, Table 2.1): XL 24 x 2048, 2.7B 32 x 2560.
GPT3_XL = {"model_type": "gpt2", "n_layer": 24, "n_embd": 2048, "n_head": 16,
           "n_positions": 2048, "vocab_size": 50257}
GPT3_2_7B = {**GPT3_XL, "n_layer": 32, "n_embd": 2560, "n_head": 32}
GPT2_MEDIUM = {"model_type": "gpt2", "n_layer": 24, "n_embd": 1024, "n_head": 16,
               "n_positions": 1024, "vocab_size": 50257}


def gpt(config: dict[str, Any], batch: int, sequence: int) -> ModelGraph:
    source = exporting.hf_config_graph(config, batch=batch, sequence=sequence, label="gpt",
                                       name="gpt")
    return batching.load_at_batch(source, batch, {batching.SEQUENCE_DIM: sequence}, name="gpt")


@pytest.fixture(scope="module")
def catalog() -> devices.Catalog:
    return devices.load_catalog()


@pytest.mark.parametrize("key", ["l4", "a10", "a10g"])
def test_a_24_gb_card_gives_a_process_about_22_5_gib(catalog: devices.Catalog, key: str) -> None:
    spec = catalog.resolve(key)
    assert 22.4 * GIB < memory.usable_memory_bytes(spec) < 22.6 * GIB < spec.memory_bytes
    assert spec.usable_memory_source


@pytest.mark.parametrize("config", [GPT3_XL, GPT3_2_7B], ids=["gpt3-xl", "gpt3-2.7b"])
@pytest.mark.parametrize("attention", ["eager", "fused"])
def test_gpt3_fp32_inference_that_ran_on_an_l4_fits(catalog: devices.Catalog,
                                                    config: dict[str, Any],
                                                    attention: str) -> None:
    # Published runs: batch 2, sequence 2048, fp32 inference on a 24 GB L4.
    m = memory.training_memory(gpt(config, 2, 2048), TrainingSettings(
        batch_size=2, mode="inference", precision="fp32", attention=attention))
    assert m.fits(catalog.resolve("l4")), m.as_dict()


@pytest.mark.parametrize("attention", ["eager", "fused"])
def test_gpt2_medium_fp32_training_at_batch_8_does_not_fit_an_l4(catalog: devices.Catalog,
                                                                attention: str) -> None:
    m = memory.training_memory(gpt(GPT2_MEDIUM, 8, 1024), TrainingSettings(
        batch_size=8, precision="fp32", attention=attention))
    assert not m.fits(catalog.resolve("l4")), m.as_dict()


def test_the_estimate_reports_and_uses_the_usable_capacity(catalog: devices.Catalog) -> None:
    l4 = catalog.resolve("l4")
    g = gpt(GPT2_MEDIUM, 8, 1024)
    (e,) = estimates.estimate(g, [l4], TrainingSettings(batch_size=8, precision="fp32"),
                              predictor=roofline.RooflinePredictor())
    assert e.memory_available_bytes == memory.usable_memory_bytes(l4) < l4.memory_bytes
    assert e.fits is False


@pytest.mark.slow  # exports torchvision's ResNet-50 once (10-20 s on a loaded 2-core host)
def test_resnet50_fp32_training_at_batch_256_does_not_fit_an_a10(
        catalog: devices.Catalog) -> None:
    # Allocated 21.5 GiB and reserved 23.6 GiB on an H200 (hack/memory_probe.py): it runs out
    # of memory on a card that gives a process 22.5 GiB.
    from gpuplan_estimator.evaluation import model_step_scoring, model_steps

    (case,) = model_steps.select_cases(model_steps.FULL_CASES, ["resnet50"])
    g = model_step_scoring.case_graph(case, 256)
    for optimizer in ("adamw", "momentum"):
        m = memory.training_memory(g, TrainingSettings(batch_size=256, precision="fp32",
                                                       optimizer=optimizer))
        assert not m.fits(catalog.resolve("a10")), (optimizer, m.as_dict())
