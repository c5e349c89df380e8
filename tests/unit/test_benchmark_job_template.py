"""The benchmark Job template renders to a valid batch/v1 Job pinned to one GPU type."""

import pathlib
import string

import yaml

ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_template_renders_a_pinned_gpu_job() -> None:
    text = (ROOT / "benchmark-jobs" / "job-template.yaml").read_text()
    rendered = string.Template(text).substitute(
        NAME="bench-l4", NAMESPACE="gpuplan", GPU_PRODUCT="NVIDIA-L4", IMAGE="img:1",
        DB_SECRET="perfdb", BUDGET_MINUTES="30")
    job = yaml.safe_load(rendered)
    assert job["kind"] == "Job" and job["apiVersion"] == "batch/v1"
    pod = job["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == {"nvidia.com/gpu.product": "NVIDIA-L4"}
    container = pod["containers"][0]
    assert container["resources"]["limits"] == {"nvidia.com/gpu": 1}
    assert container["args"][:3] == ["bench", "--device", "cuda"]
    assert "--sweep" in container["args"]


def test_every_sweep_spec_is_listed_for_the_image() -> None:
    sweeps = sorted((ROOT / "benchmark-jobs" / "sweeps").glob("*.yaml"))
    assert sweeps
    dockerfile = (ROOT / "benchmark-jobs" / "Dockerfile.cuda").read_text()
    assert "COPY benchmark-jobs/sweeps /sweeps" in dockerfile
