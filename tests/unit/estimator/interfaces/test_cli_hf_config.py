"""`gpuplan estimate --hf-config`: today's families in seconds, and errors before any work
(#34, #35): required flags and sizes checked from the config, unsupported architectures
refused by name, a missing torch is exit 4, exporter failures are one plain line."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from gpuplan_estimator.graph import exporting, hf_blocks, hf_seq2seq, hf_whisper, zoo
from gpuplan_estimator.interfaces.cli import main

CONFIGS = Path(zoo.__file__).parent.parent / "data" / "model_configs"
LLAMA_70B = str(CONFIGS / "llama2_70b.json")


def run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = main.main(argv)
    out, err = capsys.readouterr()
    return code, out, err


def write(tmp_path: Path, config: dict[str, object], name: str = "config") -> str:
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps(config))
    return str(path)


@pytest.mark.parametrize("name", ["mixtral_8x7b", "llama2_7b", "t5_base"])
def test_shipped_configs_estimate_without_torch(name: str, capsys: pytest.CaptureFixture[str]
                                                ) -> None:
    """Written from the config (no export): parameters as the closed form (= published)."""
    code, out, err = run(["estimate", "--hf-config", str(CONFIGS / f"{name}.json"), "--batch",
                          "1", "--dim", "sequence=512", "--device", "h200-sxm-141gb",
                          "--json"], capsys)
    assert code in (0, 3), err  # 3: fits no device; the estimate is still printed
    doc = json.loads(out)
    config = zoo.load_hf_config(CONFIGS / f"{name}.json")
    assert doc["model"]["parameters"] == (
        hf_seq2seq.parameter_count(hf_seq2seq.seq2seq_shape(config)) if name == "t5_base"
        else hf_blocks.parameter_count(hf_blocks.decoder_shape(config)))
    assert "building" not in err  # no export's progress line


@pytest.mark.parametrize("mode", ["train", "inference"])
def test_whisper_estimates_from_its_config(mode: str, capsys: pytest.CaptureFixture[str]) -> None:
    """Written from the config (no export); the sequence is the decoder's, its tokens the
    throughput's; training prices backward and AdamW state, inference neither."""
    code, out, err = run(["estimate", "--hf-config", str(CONFIGS / "whisper_base.json"),
                          "--mode", mode, "--batch", "4", "--dim", "sequence=448", "--device",
                          "h100-sxm-80gb", "--json"], capsys)
    assert code == 0, err
    doc = json.loads(out)
    assert doc["model"]["parameters"] == hf_whisper.parameter_count(
        hf_whisper.whisper_shape(zoo.load_hf_config(CONFIGS / "whisper_base.json")))
    assert doc["model"]["dim_bindings"] == {"batch": 4, "sequence": 448}
    est = doc["devices"][0]
    throughput = est["throughput"]
    assert throughput["tokens_per_s"] == pytest.approx(448 * throughput["samples_per_s"])
    optimizer_state = est["memory"]["optimizer_state_bytes"]
    if mode == "train":
        assert est["backward_ms"] > est["forward_ms"] > 0
        assert optimizer_state == 2 * est["memory"]["parameters_bytes"]  # AdamW's two moments
    else:
        assert est["backward_ms"] == 0 and optimizer_state == 0
    assert "building" not in err


def test_whisper_names_the_decoder_length_flag(capsys: pytest.CaptureFixture[str]) -> None:
    config = str(CONFIGS / "whisper_large.json")
    for extra, needle in (([], "give the decoder's length in tokens (--dim sequence=N, at most "
                                "448)"),
                          (["--dim", "sequence=1024"], "position table has 448 rows")):
        code, out, err = run(["estimate", "--hf-config", config, "--batch", "8", *extra], capsys)
        assert code == 2 and out == ""
        assert err.startswith("gpuplan: error: --dim sequence: ") and needle in err


def test_a_missing_sequence_is_named_before_anything_is_built(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    neo = write(tmp_path, {"model_type": "gpt_neo", "hidden_size": 64, "num_layers": 2,
                           "num_heads": 4, "vocab_size": 128})
    for argv in (["--hf-config", LLAMA_70B, "--batch", "8"], ["--hf-config", neo, "--batch", "2"]):
        code, out, err = run(["estimate", *argv], capsys)
        assert code == 2 and out == ""
        assert err.startswith("gpuplan: error: --dim sequence: ") and "building" not in err


def test_a_size_beyond_any_gpu_is_refused_from_the_config(
        capsys: pytest.CaptureFixture[str]) -> None:
    """#35: sequence=16777216 ran 43 s and 8.6 GB, then blamed a corrupt graph."""
    code, out, err = run(["estimate", "--hf-config", LLAMA_70B, "--batch", "8", "--dim",
                          "sequence=16777216"], capsys)
    assert code == 2 and out == ""
    assert err.startswith("gpuplan: error: --dim sequence: ")
    assert "attention scores" in err and "hostile" not in err and len(err.splitlines()) == 1


def test_known_unsupported_architectures_are_refused_by_name(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for kind, reason in exporting.UNSUPPORTED_MODEL_TYPES.items():
        config = write(tmp_path, {"model_type": kind, "d_model": 64})
        code, out, err = run(["estimate", "--hf-config", config, "--batch", "2", "--dim",
                              "sequence=16"], capsys)
        assert code == 2 and out == ""
        assert f"{kind!r} is not supported: {reason}" in err and "building" not in err


def test_a_missing_torch_is_exit_4(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                   capsys: pytest.CaptureFixture[str]) -> None:
    """As every other missing optional package (interfaces/cli/exits.py)."""
    monkeypatch.setitem(sys.modules, "torch", None)  # `import torch` now fails
    neo = write(tmp_path, {"model_type": "gpt_neo", "hidden_size": 64, "num_layers": 2,
                           "num_heads": 4, "vocab_size": 128})
    code, out, err = run(["estimate", "--hf-config", neo, "--batch", "2", "--dim",
                          "sequence=16"], capsys)
    assert code == 4 and out == ""
    assert "pip install 'gpuplan[torch]'" in err and len(err.strip().splitlines()) == 1


def test_exporter_failures_read_as_one_plain_line() -> None:
    """torch's messages carry terminal colour codes and run over many lines."""
    exc = RuntimeError("\x1b[31m\x1b[1mFailed to export\x1b[0m: step 1/3\n\nTraceback ...\n")
    assert exporting.first_line(exc) == "RuntimeError: Failed to export: step 1/3"
    assert exporting.first_line(ValueError("")) == "ValueError"


def test_plan_checks_the_config_before_building_too(capsys: pytest.CaptureFixture[str]) -> None:
    base = ["plan", "--hf-config", LLAMA_70B, "--batch", "8", "--dataset-size", "1000"]
    for extra, needle in (([], "give the sequence length"),
                          (["--dim", "sequence=16777216"], "attention scores")):
        code, out, err = run([*base, *extra], capsys)
        assert code == 2 and out == ""
        assert err.startswith("gpuplan: error: --dim sequence: ") and needle in err
