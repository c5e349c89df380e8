"""The shipped bundle read lazily (#34): each kernel's boosters are parsed on first lookup, only
the kernels a request prices are read, and the numbers are those of a bundle read in full."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from gpuplan_estimator import devices, graph
from gpuplan_estimator.core.layers import ModelGraph
from gpuplan_estimator.core.workload import WorkItem
from gpuplan_estimator.cost.roofline import RooflinePredictor
from gpuplan_estimator.devices import local_cpu
from gpuplan_estimator.graph import hf_blocks
from gpuplan_estimator.latency import bundles, learned, selection
from gpuplan_estimator.planning import estimates
from gpuplan_estimator.step.decomposition import TrainingSettings, build_step

pytestmark = pytest.mark.skipif(not (bundles.SHIPPED_BUNDLE / bundles.MANIFEST).exists(),
                                reason="shipped bundle not built yet (make models)")

TINY_LLAMA = {"model_type": "llama", "hidden_size": 64, "num_attention_heads": 4,
              "num_key_value_heads": 2, "num_hidden_layers": 2, "intermediate_size": 160,
              "vocab_size": 128}
SETTINGS = TrainingSettings(batch_size=2, mode="train", optimizer="adamw", precision="fp32",
                            framework="pytorch-eager", attention="eager")
SEEN_GPU, UNSEEN_GPU = "t4", "h100-sxm-80gb"


def _graph() -> ModelGraph:
    source = hf_blocks.build_decoder(TINY_LLAMA, name="tiny").SerializeToString()
    return graph.load_at_batch(source, 2, {"sequence": 16})


def _items() -> tuple[WorkItem, ...]:
    return build_step(_graph(), SETTINGS).items


def _read_in_full(lazy: bundles.Bundle) -> bundles.Bundle:
    """The same bundle with every model parsed up front, as loading did before #34."""
    return dataclasses.replace(lazy, models=dict(lazy.models),
                               transfer_models=dict(lazy.transfer_models),
                               cpu_models=dict(lazy.cpu_models))


def _loaded(bundle: bundles.Bundle) -> dict[str, frozenset[str]]:
    parts = {"models": bundle.models, "transfer": bundle.transfer_models,
             "cpu": bundle.cpu_models}
    return {name: m.loaded() for name, m in parts.items()
            if isinstance(m, bundles.LazyKernelModels)}


def test_loading_reads_no_model_and_a_request_reads_only_what_it_prices() -> None:
    lazy = bundles.load_bundle(bundles.SHIPPED_BUNDLE, origin="shipped")
    assert _loaded(lazy) == {"models": frozenset(), "transfer": frozenset(),
                             "cpu": frozenset()}
    items = _items()
    kernels = {item.kernel for item in items}
    catalog = devices.load_catalog()
    predictor = learned.LearnedPredictor(lazy)

    predictor.predict(items, catalog.resolve(UNSEEN_GPU))  # a GPU the bundle never measured
    assert _loaded(lazy) == {"models": frozenset(), "cpu": frozenset(),
                             "transfer": frozenset(kernels & set(lazy.transfer_models))}
    assert _loaded(lazy)["transfer"] < set(lazy.transfer_models)  # not every kernel

    seen = catalog.resolve(SEEN_GPU)
    predictor.predict(items, seen)  # a measured GPU: the full models of the kernels it timed
    assert _loaded(lazy)["models"] == {k for k in kernels & set(lazy.models)
                                       if lazy.has_timed(k, seen)}
    assert _loaded(lazy)["cpu"] == frozenset()

    predictor.predict(items, local_cpu.local_cpu_device())
    assert _loaded(lazy)["cpu"] == kernels & set(lazy.cpu_models)


def test_a_lazily_read_bundle_predicts_exactly_what_a_fully_read_one_does() -> None:
    lazy = bundles.load_bundle(bundles.SHIPPED_BUNDLE, origin="shipped")
    full = _read_in_full(bundles.load_bundle(bundles.SHIPPED_BUNDLE, origin="shipped"))
    assert not _loaded(full)  # plain dicts: nothing is left to read
    catalog = devices.load_catalog()
    targets = [catalog.resolve(SEEN_GPU), catalog.resolve(UNSEEN_GPU),
               local_cpu.local_cpu_device()]
    items = _items()
    got = learned.LearnedPredictor(lazy).predict_many(items, targets)
    want = learned.LearnedPredictor(full).predict_many(items, targets)
    for g, w in zip(got, want, strict=True):
        for part in ("median_ms", "p10_ms", "p90_ms"):
            np.testing.assert_array_equal(getattr(g, part), getattr(w, part))
        assert g.predictor == w.predictor
    g_model, gpus = _graph(), targets[:2]
    lazy_steps = estimates.estimate(g_model, gpus, SETTINGS,
                                    predictor=selection.bounded(learned.LearnedPredictor(lazy)))
    full_steps = estimates.estimate(g_model, gpus, SETTINGS,
                                    predictor=selection.bounded(learned.LearnedPredictor(full)))
    assert lazy_steps == full_steps  # every field: time split, intervals, memory, labels


def test_a_long_lived_process_reads_every_model_up_front() -> None:
    """The service's workers read the whole bundle at start (`selection.read_every_model`), so
    no request pays for a parse; the roofline has nothing to read."""
    predictor, _ = selection.select_predictor(None, None)
    bundle = predictor.bundle  # type: ignore[attr-defined]
    assert _loaded(bundle)["models"] == frozenset()
    selection.read_every_model(predictor)
    assert _loaded(bundle) == {"models": frozenset(bundle.models),
                               "transfer": frozenset(bundle.transfer_models),
                               "cpu": frozenset(bundle.cpu_models)}
    selection.read_every_model(RooflinePredictor())  # no bundle: nothing to do, no error


def test_a_lazy_bundle_pickles_with_what_it_has_read() -> None:
    """The service hands its bundle to worker processes; a closure or a lock would not pickle."""
    import pickle

    lazy = bundles.load_bundle(bundles.SHIPPED_BUNDLE, origin="shipped")
    first = next(iter(lazy.models))
    _ = lazy.models[first]
    copy = pickle.loads(pickle.dumps(lazy))
    assert copy.models.loaded() == frozenset({first})
    assert set(copy.models) == set(lazy.models)
    assert copy.manifest == lazy.manifest
