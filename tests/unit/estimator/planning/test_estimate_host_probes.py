"""Estimates price the host with the probe stored for their device (issue #30): a device whose
nodes probed slower gets a longer host time and step; the others keep the default's."""

from __future__ import annotations

import base64
import dataclasses
import json
import pathlib
from typing import Any

import onnx
import pytest

from gpuplan_estimator import devices
from gpuplan_estimator.core.layers import ModelGraph
from gpuplan_estimator.cost import roofline
from gpuplan_estimator.devices.catalog import DeviceSpec
from gpuplan_estimator.interfaces import json_documents
from gpuplan_estimator.interfaces.cli import main as cli_main
from gpuplan_estimator.interfaces.http import wire
from gpuplan_estimator.latency import bundles
from gpuplan_estimator.latency.learned import LearnedPredictor
from gpuplan_estimator.perfdb.store import PerfStore
from gpuplan_estimator.planning import estimates
from gpuplan_estimator.step import host
from gpuplan_estimator.step.decomposition import TrainingSettings
from gpuplan_testing.contexts import roofline_context
from gpuplan_testing.layer_builders import layer, t
from gpuplan_testing.perfdb_contract import probe_row

TRAIN = TrainingSettings(batch_size=4)
FIGURES = {"eager_op_us": 10.0, "module_call_us": 30.0, "autocast_linear_us": 40.0,
           "linear_us": 15.0, "backward_node_us": 8.0, "optimizer_foreach_us_per_tensor": 2.0,
           "optimizer_for_loop_us_per_tensor": 11.0, "optimizer_fused_us_per_tensor": 0.5,
           "launch_latency_us": 5.0}
DEFAULT = host.HostProbe.from_figures(FIGURES, "the bundle's default")
SLOW = host.HostProbe.from_figures({k: 4.0 * v for k, v in FIGURES.items()}, "stored t4 probe")
UNIT = host.HostCoefficients(forward_kernel=1.0, forward_view=0.5, autocast_cast=1.0,
                             backward_kernel=1.0, autocast_backward=2.0, optimizer_tensor=1.0)
LIGHT = pathlib.Path(onnx.__file__).parent / "backend" / "test" / "data" / "light"


def blocks_graph(n: int = 3, batch: int = 4, width: int = 256) -> ModelGraph:
    """`n` Linear+Relu blocks: small kernels, so the host's time shows."""
    layers, x = [], "x"
    for i in range(n):
        layers.append(layer(f"fc{i}", "Gemm", [t(x, batch, width), t(f"w{i}", width, width),
                                               t(f"b{i}", width)],
                            [t(f"h{i}", batch, width)], params=[f"w{i}", f"b{i}"]))
        layers.append(layer(f"relu{i}", "Relu", [t(f"h{i}", batch, width)],
                            [t(f"a{i}", batch, width)]))
        x = f"a{i}"
    return ModelGraph("blocks", tuple(layers), (), {"batch": batch}, 17, ())


def resnet_estimate_body(names: list[str]) -> dict[str, Any]:
    model = base64.b64encode((LIGHT / "light_resnet50.onnx").read_bytes()).decode()
    return {"model_onnx_b64": model, "training": {"batch_size": 1, "dataset_size": 100,
                                                  "epochs": 1}, "devices": names}


def bundle_predictor(model: host.HostModel) -> LearnedPredictor:
    """A bundle of no kernel models (the roofline prices every kernel) whose manifest ships
    `model` as its host model, as a trained bundle's does."""
    manifest = {host.MANIFEST_KEY: host.model_to_json(model), "devices": []}
    return LearnedPredictor(bundles.Bundle(models={}, manifest=manifest))


@pytest.fixture(scope="module")
def gpus() -> list[DeviceSpec]:
    catalog = devices.load_catalog()
    return [catalog.resolve("h100-sxm-80gb"), catalog.resolve("NVIDIA Tesla T4")]


def test_a_slower_stored_probe_lengthens_its_devices_host_time(gpus: list[DeviceSpec]) -> None:
    model = host.HostModel(DEFAULT, UNIT)
    graph = blocks_graph()
    base = estimates.estimate(graph, gpus, TRAIN, predictor=roofline.RooflinePredictor(),
                              host_model=model)
    probed = estimates.estimate(graph, gpus, TRAIN, predictor=roofline.RooflinePredictor(),
                                host_model=model, host_probes={"t4": SLOW})
    (h100, t4), (h100_p, t4_p) = base, probed
    assert h100_p == h100  # no probe stored for it: the default prices it, unchanged
    assert t4.host_ms is not None and t4_p.host_ms is not None
    assert t4_p.host_ms == pytest.approx(t4.host_ms * 4.0)  # every figure of SLOW is 4x
    assert t4_p.step_time_ms > t4.step_time_ms and t4_p.host_bound
    assert (t4.host_source, t4_p.host_source) == (DEFAULT.source, SLOW.source)
    assert t4_p.gpu_busy_ms == pytest.approx(t4.gpu_busy_ms)  # the kernels are the same


def test_the_bundles_coefficients_apply_to_the_stored_probe(gpus: list[DeviceSpec]) -> None:
    predictor = bundle_predictor(host.HostModel(DEFAULT, UNIT))
    graph = blocks_graph()
    (_, t4) = estimates.estimate(graph, gpus, TRAIN, predictor=predictor)
    (_, t4_p) = estimates.estimate(graph, gpus, TRAIN, predictor=predictor,
                                   host_probes={"t4": SLOW})
    assert t4.host_source == DEFAULT.source and t4_p.host_source == SLOW.source
    assert t4_p.host_ms == pytest.approx(4.0 * t4.host_ms)  # type: ignore[operator]


def test_a_probe_without_coefficients_prices_nothing(gpus: list[DeviceSpec]) -> None:
    (_, t4) = estimates.estimate(blocks_graph(), gpus, TRAIN,
                                 predictor=roofline.RooflinePredictor(),
                                 host_probes={"t4": SLOW})
    assert t4.host_ms is None and t4.step_time_ms == pytest.approx(t4.gpu_busy_ms)


def test_the_planner_context_carries_the_probes_to_estimates() -> None:
    ctx = dataclasses.replace(roofline_context(),
                              predictor=bundle_predictor(host.HostModel(DEFAULT, UNIT)))
    req = wire.parse_estimate_request(resnet_estimate_body(["NVIDIA-L4", "Tesla T4"]))
    plain = json_documents.estimate_request_json(req, ctx)
    probed = json_documents.estimate_request_json(
        req, dataclasses.replace(ctx, host_probes={"t4": SLOW}))
    (l4, t4), (l4_p, t4_p) = plain["devices"], probed["devices"]
    assert l4_p["step_time_ms"] == l4["step_time_ms"]
    assert t4_p["step_time_ms"] > t4["step_time_ms"]


def test_the_cli_reads_probes_from_the_database_it_is_given(
        tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]) -> None:
    bundle = bundle_predictor(host.HostModel(DEFAULT, UNIT)).bundle
    bundle_dir = bundles.save_bundle(bundle, tmp_path / "bundle")
    url = f"sqlite:///{tmp_path / 'perf.db'}"
    with PerfStore.open(url) as store:
        store.add_host_probe(probe_row("t4", "Xeon", 4.0 * FIGURES["eager_op_us"]))
    argv = ["estimate", str(LIGHT / "light_resnet50.onnx"), "--batch", "1", "--device", "t4",
            "--bundle", str(bundle_dir), "-o", "json", "--no-progress"]

    def host_of(extra: list[str]) -> dict[str, Any]:
        assert cli_main.main([*argv, *extra]) == 0
        (device,) = json.loads(capsys.readouterr().out)["devices"]
        return dict(device["host"])

    default, stored = host_of([]), host_of(["--host-probes-db", url])
    assert default["probe"] == DEFAULT.source
    assert stored["probe"].startswith("host probe 1 of t4 | Xeon")
    assert stored["host_ms"] > default["host_ms"]


def test_plans_price_the_host_with_the_stored_probe_too() -> None:
    ctx = dataclasses.replace(roofline_context(),
                              predictor=bundle_predictor(host.HostModel(DEFAULT, UNIT)))
    body = {**resnet_estimate_body([]), "objective": {"prefer": "fastest", "max_gpus": 1},
            "inventory": [{"gpu_type": "Tesla-T4", "gpus_per_node": 1, "nodes": 1,
                           "free_gpus": 1}]}
    del body["devices"]
    req = wire.parse_plan_request(body)
    plain = json_documents.plan_request_json(req, ctx)["plan"]
    probed = json_documents.plan_request_json(
        req, dataclasses.replace(ctx, host_probes={"t4": SLOW}))["plan"]
    assert probed["step_time_ms"] > plain["step_time_ms"]
