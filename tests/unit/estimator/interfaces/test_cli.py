"""The `gpuplan` CLI, in process through `main(argv)` and once as a real subprocess."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import onnx
import pytest
from onnx import TensorProto, helper

from gpuplan_estimator.graph import examples
from gpuplan_estimator.interfaces import json_documents
from gpuplan_estimator.interfaces.cli import main, plans
from gpuplan_estimator.latency import bundles
from gpuplan_estimator.step import host
from gpuplan_testing import onnx_models

assert bundles.MANIFEST  # imported here so collection, not the first test, pays for LightGBM

RESNET = examples.light_resnet50_path()


def run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = main.main(argv)
    out, err = capsys.readouterr()
    return code, out, err


def one_error_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("gpuplan: error: ")
    return lines[0]


def tiny_model(path: Path, *, opset: int = 17) -> Path:
    """x[batch, sequence, 8] @ w[8, 4]: a model with two symbolic dims."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "sequence", 8])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", "sequence", 4])
    w = helper.make_tensor("w", TensorProto.FLOAT, [8, 4], [0.5] * 32)
    node = helper.make_node("MatMul", ["x", "w"], ["y"], name="proj")
    g = helper.make_graph([node], "tiny", [x], [y], initializer=[w])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    onnx.save(model, path)
    return path


def test_estimate_json_schema(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(["estimate", str(RESNET), "--device", "h100-sxm-80gb", "--device",
                          "NVIDIA-A100-SXM4-80GB", "--json", "--epochs", "2",
                          "--dataset-size", "100", "--prefer", "fastest"], capsys)
    assert code == 0, err
    doc = json.loads(out)
    assert doc["schema_version"] == json_documents.SCHEMA_VERSION
    assert doc["predictor_source"] == "roofline" or doc["predictor_source"].startswith("bundle:")
    assert doc["settings"] == {"mode": "train", "optimizer": "adamw",
                               "optimizer_impl": "foreach", "precision": "fp32",
                               "attention": "eager",
                               "batch_size": 1, "epochs": 2, "dataset_size": 100}
    assert doc["kind"] == "Estimate"
    # Ranked by the objective: the faster step first, and it is the recommendation (at batch
    # 1 the host issuing kernels takes much of either GPU's step, so which one wins is not
    # asserted).
    steps = [d["step_time_ms"] for d in doc["devices"]]
    assert steps == sorted(steps)
    assert {d["device"] for d in doc["devices"]} == {"h100-sxm-80gb", "a100-sxm4-80gb"}
    assert doc["objective"]["prefer"] == "fastest"
    assert doc["objective"]["recommended"] == doc["devices"][0]["device"]
    assert doc["devices"][0]["host"]["bound"] in ("host", "gpu")
    assert doc["devices"][0]["host"]["host_ms"] > 0
    dev = doc["devices"][0]
    assert dev["data_basis"] == "extrapolated" or doc["predictor_source"] == "roofline"
    assert dev["throughput"]["samples_per_s"] == pytest.approx(1000 / dev["step_time_ms"])
    # ResNet-50 forward is ~4.1 GMAC per image: 3 x 8.2 GFLOP for a training step of one.
    assert 2.2e10 < doc["model"]["flops_per_step"] < 2.7e10
    assert 0 < dev["mfu"] < 1
    assert dev["cost_usd"]["total"] == pytest.approx(
        dev["cost_usd"]["price_per_hour"] * dev["total_seconds"] / 3600)
    assert dev["step_time_ms"] == pytest.approx(
        dev["forward_ms"] + dev["backward_ms"] + dev["optimizer_ms"])
    assert dev["total_seconds"] == pytest.approx(2 * dev["epoch_seconds"])
    assert dev["fits"] is True and dev["memory_bytes"] > 0
    assert "layers" not in dev


def test_estimate_text_with_all_layers(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(["estimate", str(RESNET), "--device", "t4", "--mode", "inference",
                        "--explain", "--layers", "--precision", "fp16"], capsys)
    assert code == 0
    assert "inference, batch 1" in out and "precision fp16" in out
    assert "optimizer" not in out  # inference updates no weights
    assert "by op type:" in out and "every layer" in out and out.count(" Conv ") >= 53
    assert "memory" in out and "fits" in out


def test_tiny_model_dims_and_unbound_dim(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    model = tiny_model(tmp_path / "tiny.onnx")
    code, _, err = run(["estimate", str(model), "--batch", "2", "--device", "t4"], capsys)
    assert code == 2 and "sequence" in one_error_line(err)
    code, out, err = run(["estimate", str(model), "--batch", "2", "--dim", "sequence=16",
                          "--device", "t4", "--json", "--layers"], capsys)
    assert code == 0, err
    layer, loss = json.loads(out)["devices"][0]["layers"]  # the training loss is a layer
    assert layer["op_type"] == "MatMul" and layer["backward_ms"] > 0
    assert loss["op_type"] == "LogSoftmax" and loss["name"].endswith(".loss")


def test_onnxruntime_framework_folds_resnet_batchnorms(
    capsys: pytest.CaptureFixture[str]
) -> None:
    forward = {}
    convs = 0
    for fw in ("pytorch-eager", "onnxruntime"):
        code, out, err = run(["estimate", str(RESNET), "--device", "t4", "--mode", "inference",
                              "--framework", fw, "--json", "--layers"], capsys)
        assert code == 0, err
        layers = json.loads(out)["devices"][0]["layers"]
        forward[fw] = {ly["op_type"]: 0.0 for ly in layers}
        for ly in layers:
            forward[fw][ly["op_type"]] += ly["forward_ms"]
        convs = sum(ly["op_type"] == "Conv" for ly in layers)
    assert forward["pytorch-eager"]["BatchNormalization"] > 0
    assert forward["onnxruntime"]["BatchNormalization"] == 0  # folded into the 53 convs
    # Eager PyTorch's kernels run on the stream, their dispatch on the host's clock; without a
    # host model (onnxruntime) each conv keeps the eager-call timing of its rows.
    assert forward["onnxruntime"]["Conv"] == pytest.approx(
        forward["pytorch-eager"]["Conv"] + convs * host.EAGER_CALL_DISPATCH_MS)


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["estimate", str(RESNET), "--device", "h100-sxm-81gb"], "did you mean"),
        (["estimate", str(RESNET), "--batch", "0"], "must be between 1 and"),
        (["estimate", str(RESNET), "--epochs", "3", "--device", "t4"], "--dataset-size"),
        (["estimate", str(RESNET), "--dim", "sequence"], "NAME=VALUE"),
        (["estimate", "/nonexistent/model.onnx"], "/nonexistent/model.onnx"),
        (["estimate", str(RESNET), "--optimizer", "lamb"], "invalid choice"),
        (["estimate", str(RESNET), "--framework", "onnxruntime", "--device", "t4"],
         "inference only"),
        (["estimate", str(RESNET), "--attention", "flash"], "invalid choice"),
        (["estimate", str(RESNET), "--framework", "onnxruntime", "--mode", "inference",
          "--attention", "fused", "--device", "t4"], "attention: fused attention is priced"),
        (["nonsense"], "invalid choice"),
        (["estimate", str(RESNET), "--optimizer", "rmsprop", "--optimizer-impl", "fused"],
         "--optimizer-impl: torch.optim has no fused rmsprop"),
        (["estimate", str(RESNET), "--optimizer", "rmsprop", "--optimizer-impl", "fused",
          "--gpus", "2", "--dp", "2", "--batch", "8"],
         "--optimizer-impl: torch.optim has no fused rmsprop"),
        (["plan", str(RESNET), "--batch", "8", "--dataset-size", "80", "--optimizer", "rmsprop",
          "--optimizer-impl", "fused"], "--optimizer-impl: torch.optim has no fused rmsprop"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(
    argv: list[str], needle: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run(argv, capsys)
    assert code == 2 and out == ""
    assert needle in one_error_line(err)


def test_fixed_batch_model_is_rebatched_to_the_requested_batch(
    capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run(["estimate", str(RESNET), "--batch", "32", "--device", "t4", "--json",
                          "--layers"], capsys)
    assert code == 0, err
    doc = json.loads(out)
    assert doc["settings"]["batch_size"] == 32
    code, out, err = run(["estimate", str(RESNET), "--device", "t4", "--json"], capsys)
    assert code == 0, err
    assert json.loads(out)["settings"]["batch_size"] == 1  # without --batch: the graph's own


def test_a_model_whose_constants_keep_its_batch_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "folded.onnx"
    onnx.save(onnx_models.batch_folded_model(), path)
    code, out, err = run(["estimate", str(path), "--batch", "4", "--device", "t4"], capsys)
    assert code == 2 and out == ""
    assert "--batch: the model has a fixed batch of 1" in one_error_line(err)


def test_bad_model_files(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    text = tmp_path / "notes.onnx"
    text.write_text("this is not a protobuf at all\n" * 10)
    truncated = tmp_path / "truncated.onnx"
    truncated.write_bytes(RESNET.read_bytes()[:5000])
    old = tiny_model(tmp_path / "old.onnx", opset=5)
    for path in (text, truncated, old):
        code, _, err = run(["estimate", str(path), "--device", "t4"], capsys)
        assert code == 2
        assert str(path) in one_error_line(err)


def test_debug_shows_the_traceback(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(["--debug", "estimate", str(RESNET), "--device", "nope-gpu"], capsys)
    assert code == 2 and "Traceback" in err and err.strip().endswith("nope-gpu'")


def test_devices_lists_the_catalog(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(["devices", "--json"], capsys)
    doc = json.loads(out)
    assert doc["schema_version"] == 1 and doc["kind"] == "DeviceList"
    rows = doc["devices"]
    assert code == 0 and len(rows) >= 10
    assert {row["data_basis"] for row in rows} <= {"measured", "probed", "extrapolated",
                                                    "roofline"}
    assert {"key", "memory_bytes", "mem_bandwidth_gbps", "peak_tflops"} <= set(rows[0])
    code, out, _ = run(["devices"], capsys)
    assert code == 0 and "h100-sxm-80gb" in out


def test_strip_then_estimate_the_compressed_copy(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    dest = tmp_path / "resnet.onnx.xz"
    code, out, _ = run(["strip", str(RESNET), str(dest), "--compress", "xz"], capsys)
    assert code == 0 and f"-> {dest}" in out and "bytes" in out
    code, out, err = run(["estimate", str(dest), "--device", "l4", "--json"], capsys)
    assert code == 0, err
    assert json.loads(out)["model"]["parameters"] > 25_000_000


def test_demo_on_one_device(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(["demo", "--device", "a100-sxm4-80gb"], capsys)
    assert code == 0, err
    assert "== ResNet-50" in out and "== GPT-2 medium" in out
    assert "gpt2-medium" in out and "most expensive layers" in out


def test_demo_leaves_out_a_gpu_without_the_cases_precision(
        capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(["demo", "--device", "t4", "--device", "l4"], capsys)
    assert code == 0, err
    resnet, gpt2 = out.split("== GPT-2 medium")
    assert "t4" in resnet  # fp32 ResNet-50 runs on a T4
    assert "(left out, no bf16 math units: t4)" in gpt2


def test_no_command_prints_help_and_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run([], capsys)
    assert code == 2 and "estimate" in err


@pytest.mark.slow  # a fresh interpreter imports onnx, numpy and LightGBM: seconds on 2 cores
def test_subprocess_exit_code_and_single_line(tmp_path: Path) -> None:
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"\x00\x01garbage")
    proc = subprocess.run(
        [sys.executable, "-m", "gpuplan_estimator.interfaces.cli.main", "estimate", str(bad)],
        capture_output=True, text=True, timeout=60, check=False,
    )
    assert proc.returncode == 2
    assert proc.stdout == ""
    assert one_error_line(proc.stderr)
    assert "Traceback" not in proc.stderr




def test_a_fused_optimizer_prices_a_shorter_update(capsys: pytest.CaptureFixture[str]) -> None:
    steps = {}
    for impl in ("foreach", "fused"):
        code, out, err = run(["estimate", "--hf-config", str(examples.GPT2_CONFIG), "--batch",
                              "2", "--dim", "sequence=128", "--device", "h100-sxm-80gb",
                              "--optimizer-impl", impl, "--json"], capsys)
        assert code == 0, err
        doc = json.loads(out)
        assert doc["settings"]["optimizer_impl"] == impl
        steps[impl] = doc["devices"][0]
    # One pass over p, g and both moments instead of eight: the update moves 28 of 80 bytes
    # per parameter, and the forward and backward are the same work.
    assert steps["fused"]["optimizer_ms"] < 0.6 * steps["foreach"]["optimizer_ms"]
    assert steps["fused"]["forward_ms"] == steps["foreach"]["forward_ms"]


def test_estimate_from_a_hf_config_needs_no_onnx_file(capsys: pytest.CaptureFixture[str]
                                                      ) -> None:
    config = str(examples.GPT2_CONFIG)
    code, out, err = run(["estimate", "--hf-config", config, "--batch", "2", "--dim",
                          "sequence=128", "--device", "t4", "--json"], capsys)
    assert code == 0, err
    doc = json.loads(out)
    assert doc["model"]["name"] == "gpt2_med" and doc["settings"]["batch_size"] == 2
    assert doc["model"]["dim_bindings"]["sequence"] == 128


def test_estimate_exports_an_architecture_the_zoo_lacks(tmp_path: Path,
                                                        capsys: pytest.CaptureFixture[str]
                                                        ) -> None:
    """A Llama config is written block by block from the config (`hf_blocks`)."""
    config = tmp_path / "tiny-llama.json"
    config.write_text(json.dumps({
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64,
        "num_attention_heads": 4, "num_key_value_heads": 2, "num_hidden_layers": 2,
        "intermediate_size": 160, "vocab_size": 128}))
    code, out, err = run(["estimate", "--hf-config", str(config), "--batch", "2", "--dim",
                          "sequence=16", "--device", "t4", "--json"], capsys)
    assert code == 0, err
    doc = json.loads(out)
    assert doc["model"]["name"] == "tiny-llama"
    # 2 layers of (4 + 2·2/4) q/k/v/o 64x64-equivalents and 3 MLP 64x160, norms, embedding
    per_layer = 64 * 64 * 2 + 2 * 64 * 32 + 3 * 64 * 160 + 2 * 64
    assert doc["model"]["parameters"] == 2 * per_layer + 64 + 2 * 128 * 64


FACTORY = """
import torch


def build():
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8))
    return model, (torch.zeros(4, 32),)


def not_a_pair():
    return torch.nn.Linear(2, 2)
"""


@pytest.mark.parametrize("argv", [
    ["--batch", "9223372036854775808"], ["--batch", "2", "--dim", "sequence=" + "9" * 23]])
def test_counts_beyond_any_model_are_one_line_errors(argv: list[str],
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    """Issue #21: these printed an OverflowError traceback (exit 1)."""
    code, out, err = run(["estimate", str(RESNET), "--device", "t4", *argv], capsys)
    assert code == 2 and out == ""
    assert f"must be between 1 and {2**24}" in one_error_line(err)  # core.limits' caps


def test_estimate_exports_a_torch_factory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "my_factory.py").write_text(FACTORY)
    monkeypatch.chdir(tmp_path)
    code, out, err = run(["estimate", "--torch", "my_factory:build", "--device", "t4",
                          "--json"], capsys)
    assert code == 0, err
    doc = json.loads(out)
    assert doc["model"]["parameters"] == 32 * 64 + 64 + 64 * 8 + 8
    assert doc["settings"]["batch_size"] == 4
    for spec, needle in [("my_factory", "expected package.module:factory"),
                         ("my_factory:missing", "has no attribute 'missing'")]:
        code, out, err = run(["estimate", "--torch", spec, "--device", "t4"], capsys)
        assert code == 2 and needle in one_error_line(err)
    code, out, err = run(["estimate", "--torch", "my_factory:not_a_pair"], capsys)
    assert code == 2 and "must return (nn.Module, example_args" in err.splitlines()[-1]


@pytest.mark.parametrize(("argv", "needle"), [
    (["estimate", "--device", "t4"], "give an ONNX file, --hf-config CONFIG_JSON or --torch"),
    (["estimate", str(RESNET), "--hf-config", "c.json"], "exactly one"),
    (["estimate", "--hf-config", "/nonexistent/config.json"], "/nonexistent/config.json"),
    (["estimate", "--hf-config", str(examples.GPT2_CONFIG), "--batch", "2"], "sequence"),
])
def test_hf_config_errors_are_one_line(argv: list[str], needle: str,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(argv, capsys)
    assert code == 2 and out == ""
    assert needle in one_error_line(err)


def test_an_eager_attention_estimate_says_how_to_price_it_fused(
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    config = tmp_path / "gpt2.json"
    config.write_text(json.dumps({"model_type": "gpt2", "n_embd": 64, "n_head": 4,
                                  "n_layer": 2, "vocab_size": 1000, "n_positions": 256}))
    argv = ["estimate", "--hf-config", str(config), "--batch", "2", "--dim", "sequence=256",
            "--device", "h100-sxm-80gb"]
    code, out, err = run(argv, capsys)
    assert code == 0, err
    assert "attention: 2 attention core(s) priced eager" in out
    assert "--attention fused" in out
    code, out, err = run([*argv, "--attention", "fused"], capsys)
    assert code == 0, err
    assert "fused attention" in out and "priced eager" not in out


def test_fused_attention_on_a_graph_without_a_core_says_it_is_priced_eager(
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    argv = ["estimate", str(tiny_model(tmp_path / "tiny.onnx")), "--batch", "2", "--dim",
            "sequence=16", "--device", "h100-sxm-80gb", "--attention", "fused"]
    code, out, err = run(argv, capsys)
    assert code == 0, err
    (line,) = [ln for ln in out.splitlines() if ln.startswith("attention:")]
    assert line.startswith("attention: NOT FUSED:") and "no attention core" in line
    code, out, err = run([*argv, "--json"], capsys)
    assert code == 0, err
    report = json.loads(out)["attention"]
    assert (report["requested"], report["cores"], report["fused_cores"]) == ("fused", 0, 0)
    assert "no attention core" in report["warning"]
    code, out, err = run(argv[:-2], capsys)  # eager: nothing to say about a graph like this
    assert code == 0, err
    assert "attention:" not in out


# -- #35: mistakes answered in the flags typed, before any model is built; an export that
# dropped what training runs named on stderr and in the document.

EXPORTS = Path(__file__).resolve().parents[3] / "fixtures" / "exports"


@pytest.mark.parametrize(("argv", "line"), [
    (["plan", str(RESNET), "--batch", "8", "--dataset-size", "100", "--pool", "t4=0x8"],
     "gpuplan: error: --pool t4=0x8: nodes must be ≥ 1"),
    (["plan", str(RESNET), "--batch", "8", "--dataset-size", "100", "--pool", "t4=1x0"],
     "gpuplan: error: --pool t4=1x0: GPUs per node must be ≥ 1"),
    # A file that does not exist: the flag check must come first, not the model's reading.
    (["estimate", "nowhere.onnx", "--batch", "8", "--device", "t4", "--epochs", "3"],
     "gpuplan: error: --epochs: needs --dataset-size N too (samples per epoch)"),
])
def test_a_bad_flag_is_named_as_typed(argv: list[str], line: str,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(argv, capsys)
    assert code == 2
    assert one_error_line(err) == line


def test_an_unknown_dim_is_listed_against_the_graph_s_dims(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    model = tiny_model(tmp_path / "tiny.onnx")
    code, _, err = run(["estimate", str(model), "--batch", "2", "--dim", "seq=16", "--device",
                        "t4"], capsys)
    assert code == 2
    assert one_error_line(err).startswith(
        "gpuplan: error: unknown dim(s) 'seq'; this graph's dims: batch, sequence; unbound "
        "symbolic dimension(s) in ")


def test_wire_paths_read_as_the_flags_that_set_them() -> None:
    specs = ["t4=1x8", "l4=2x4"]
    assert plans.in_flags(("inventory[1].free_gpus",
                           "Input should be greater than or equal to 0"), specs) == (
        "--pool l4=2x4", "free_gpus must be ≥ 0")
    assert plans.in_flags(("training.dims", "too big"), specs) == ("--dim", "too big")
    assert plans.in_flags(("objective.deadline_seconds", "Input should be greater than 0"),
                          specs) == ("--deadline", "must be > 0")


@pytest.mark.parametrize("command", ["estimate", "plan"])
def test_a_folded_export_priced_for_training_warns_with_the_fix(
        command: str, capsys: pytest.CaptureFixture[str]) -> None:
    model = str(EXPORTS / "cnn-torchscript-eval.onnx")
    tail = (["--device", "t4"] if command == "estimate"
            else ["--dataset-size", "64", "--pool", "t4=1x1"])
    code, out, err = run([command, model, "--batch", "8", "-o", "json", *tail], capsys)
    assert code == 0, err
    [warning] = json.loads(out)["warnings"]
    assert "BatchNorm looks folded" in warning and "TrainingMode.TRAINING" in warning
    assert f"gpuplan: warning: {warning}" in err.splitlines()
    if command == "estimate":
        code, out, err = run([command, model, "--batch", "8", "-o", "json", "--mode",
                              "inference", *tail], capsys)
        assert code == 0 and json.loads(out)["warnings"] == [] and "warning" not in err


@pytest.mark.parametrize("export", ["torchscript-train", "dynamo-optimize-off"])
def test_explain_finds_the_blocks_of_either_exporter(export: str,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    """#35: dynamo names nodes node_Conv_12 and keeps the module path in metadata
    (pkg.torch.onnx.name_scopes); TorchScript puts it in the name. Both roll up by block."""
    code, out, err = run(["estimate", str(EXPORTS / f"cnn-{export}.onnx"), "--batch", "8",
                          "--device", "t4", "--explain"], capsys)
    assert code == 0, err
    assert "carry no block structure" not in out
    rows = [line.split()[0] for line in out.split("by block:")[1].splitlines()[2:6]]
    assert {r.split("/")[0] for r in rows} <= {"blocks.0", "blocks.1", "blocks.2", "blocks.3",
                                                "(outside"}
    assert any(r.startswith("blocks.") for r in rows)
