"""`gpuplan plan`: the planner from the command line, in-process."""

import json
import pathlib
import re

import onnx
import pytest
import yaml

from gpuplan_estimator.interfaces.cli import main, plans

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
        (["--pool", "TPU-v9=1x8"], "unknown device 'TPU-v9'"),
        (["--deadline", "2 hours"], "expected a duration like 2h, 90m, 1h30m or seconds"),
        (["--deadline", "0s"], "must be a duration longer than 0s"),
    ],
)
def test_plan_errors_are_one_line_exit_2(args: list[str], message: str,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    code = main.main(["plan", str(RESNET50), "--batch", "64", "--dataset-size", "64000", *args])
    err = capsys.readouterr().err
    assert code == 2
    assert err.startswith("gpuplan: error:") and err.count("\n") == 1
    assert message in err


def test_an_infeasible_plan_exits_3_with_one_line_per_gpu_type(
        capsys: pytest.CaptureFixture[str]) -> None:
    code = main.main(["plan", str(RESNET50), "--batch", "64", "--dataset-size", "64000",
                      "--pool", "NVIDIA-L4=1x4", "--pool", "t4=1x2", "--deadline", "1s"])
    err = capsys.readouterr().err.splitlines()
    assert code == 3
    assert err[0] == "gpuplan: error: no GPU type and count satisfies the request:"
    assert [line.split(":")[0].strip() for line in err[1:]] == ["NVIDIA-L4", "t4"]
    assert all("deadline is 1.0 s" in line for line in err[1:])


def test_deadline_durations_read_like_the_crd(capsys: pytest.CaptureFixture[str]) -> None:
    docs = []
    for deadline in ("2h", "7200", "1h60m"):
        code = main.main(["plan", str(RESNET50), "--batch", "64", "--dataset-size", "64000",
                          "--pool", "NVIDIA-L4=1x4", "--deadline", deadline, "-o", "yaml"])
        assert code == 0
        docs.append(yaml.safe_load(capsys.readouterr().out))
    assert {d["objective"]["deadline_seconds"] for d in docs} == {7200.0}
    assert docs[0]["schema_version"] == 1 and docs[0]["kind"] == "Plan"


def test_plan_table_shows_memory_interval_rejections_and_all_rows(
        capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["plan", str(RESNET50), "--batch", "240", "--dataset-size", "64000",
            "--pool", "p4=1x8", "--pool", "NVIDIA-L4=2x4", "--pool", "t4=2x8",
            "--max-gpus", "16"]
    assert main.main(argv) == 0
    out = capsys.readouterr().out
    assert out.startswith("plan: ") and "p10-p90" in out and "memory" in out
    assert "(--epochs defaults to 1)" in out
    assert "MEMORY/GPU" in out and "P10-P90" in out
    # 240 does not split over 7 GPUs: the rejections say so. One T4 (15 GB) holds batch 240
    # only by accumulating gradients over two micro-batches: the plan says how it runs.
    assert "rejected (" in out and "t4 x 7: (x7) batch 240 does not split evenly" in out
    assert "LAYOUT" in out and "STRATEGY" in out
    assert re.search(r"t4 +measured +1 +1 +1x1x1 m=2 +accumulate x2", out)
    assert "runs as dp=" in out and "memory strategy:" in out
    shown = [line for line in out.splitlines()
             if line.lstrip("* ").startswith(("NVIDIA-L4 ", "p4 ", "t4 ")) and " x " not in line]
    assert len(shown) <= 10 and "--all lists every one" in out
    assert main.main([*argv, "--all"]) == 0
    every = capsys.readouterr().out
    total = int(every.split("candidates (")[1].split(" of ")[1].split(",")[0])
    rows = [line for line in every.splitlines()
            if line.lstrip("* ").startswith(("NVIDIA-L4 ", "p4 ", "t4 ")) and " x " not in line]
    assert len(rows) == total > 10


def test_a_fused_plan_of_a_model_without_attention_says_it_is_priced_eager(
        capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["plan", str(RESNET50), "--batch", "64", "--dataset-size", "64000", "--pool",
            "NVIDIA-L4=2x4", "--attention", "fused"]
    assert main.main(argv) == 0
    (line,) = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("attention:")]
    assert line.startswith("attention: NOT FUSED:") and "no attention core" in line
    assert main.main([*argv, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["attention"]["fused_cores"] == 0


def test_a_candidates_layout_names_its_expert_parallelism_only_when_there_is_some() -> None:
    split = {"dp": 8, "tp": 1, "pp": 1, "micro_batches": 2, "micro_batch": 4, "ep": 4}
    assert plans.layout_text(split) == "dp=8 ep=4 tp=1 pp=1, 2 micro-batches of 4"
    # A plan from an estimator before expert parallelism has no ep: as it was.
    older = {k: v for k, v in split.items() if k != "ep"}
    assert plans.layout_text(older) == "dp=8 tp=1 pp=1, 2 micro-batches of 4"
    assert plans.layout_text({**split, "ep": 1}) == plans.layout_text(older)
