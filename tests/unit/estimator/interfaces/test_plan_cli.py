"""`gpuplan plan`: the planner from the command line, in-process."""

import json
import pathlib

import onnx
import pytest

from gpuplan_estimator.interfaces.cli import main

RESNET50 = pathlib.Path(onnx.__file__).parent / "backend/test/data/light/light_resnet50.onnx"


def test_plan_json_respects_pools_and_deadline(capsys: pytest.CaptureFixture[str]) -> None:
    code = main.main(["plan", str(RESNET50), "--batch", "64", "--dataset-size", "64000",
                     "--pool", "NVIDIA-L4=2x4", "--pool", "NVIDIA-H100-80GB-HBM3=1x8",
                     "--deadline", "36000", "--json"])
    assert code == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["plan"]["gpu_type"] in {"NVIDIA-L4", "NVIDIA-H100-80GB-HBM3"}
    assert all(c["estimated_seconds"] <= 36000 for c in doc["candidates"])
    assert {c["gpu_type"] for c in doc["candidates"]} <= {"NVIDIA-L4", "NVIDIA-H100-80GB-HBM3"}
    l4_counts = {c["gpu_count"] for c in doc["candidates"] if c["gpu_type"] == "NVIDIA-L4"}
    assert max(l4_counts) <= 8


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--pool", "bad"], "--pool"),
        (["--pool", "TPU-v9=1x8"], "not in the GPU catalog"),
        (["--pool", "NVIDIA-L4=1x4", "--deadline", "0.001"], "deadline"),
    ],
)
def test_plan_errors_are_one_line_exit_2(args: list[str], message: str,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    code = main.main(["plan", str(RESNET50), "--batch", "64", "--dataset-size", "64000", *args])
    err = capsys.readouterr().err
    assert code == 2
    assert err.startswith("gpuplan: error:") and err.count("\n") == 1
    assert message in err
