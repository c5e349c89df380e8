"""hack/image_check.py reads the repo's Dockerfiles: the release, packages, pip specs, USER and
ENTRYPOINT/CMD it replays are the Dockerfiles' own, and it refuses what it cannot replay."""

import importlib.util
import pathlib
import sys
from types import ModuleType

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]


def _load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("image_check", ROOT / "hack" / "image_check.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules["image_check"] = module  # dataclasses resolve their annotations through it
    spec.loader.exec_module(module)
    return module


ic = _load()


def _parse(relative: str):  # type: ignore[no-untyped-def]
    return ic.parse_dockerfile((ROOT / relative).read_text())


def test_every_dockerfile_in_the_repo_is_checked() -> None:
    found = {str(p.relative_to(ROOT)) for p in ROOT.rglob("Dockerfile*")
             if not {".venv", "node_modules", ".git"} & set(p.relative_to(ROOT).parts)}
    assert found == {image.dockerfile for image in ic.IMAGES}


def test_main_image_is_pinned_non_root_with_libgomp() -> None:
    df = _parse("Dockerfile")
    assert ic.re.fullmatch(r"python:3\.11\.\d+-slim-bookworm@sha256:[0-9a-f]{64}", df.base_image)
    assert "libgomp1" in df.apt_packages
    assert df.user == "65532:65532" and ic.user_spec(df.user) == "65532:65532"
    assert df.entrypoint == ("gpuplan",)
    assert df.cmd[0] == "serve" and ic.cmd_port(df.cmd) == 8080
    assert df.pip_specs == (".[serve,operator,postgres]",)
    assert ic.project_spec_extras(df.pip_specs[0]) == ("serve", "operator", "postgres")
    base = ic.resolve_base(df.base_image, df.apt_packages)
    assert (base.distro, base.suite, base.python_version) == ("debian", "bookworm", "3.11")
    assert df.volumes == ("/data",)


def test_cuda_image_has_onnxruntime_gpu_and_runs_as_the_jobs_uid() -> None:
    df = _parse("benchmark-jobs/Dockerfile.cuda")
    assert ic.re.fullmatch(r"nvidia/cuda:[\w.-]+-ubuntu22\.04@sha256:[0-9a-f]{64}", df.base_image)
    assert {"python3.11", "python3.11-venv", "libgomp1"} <= set(df.apt_packages)
    assert any(s.startswith("onnxruntime-gpu") for s in df.pip_specs)
    assert df.user == "65532:65532"  # gpuplan_operator.core.benchmarks runs the Job as 65532
    base = ic.resolve_base(df.base_image, df.apt_packages)
    assert (base.distro, base.suite, base.python_version) == ("ubuntu", "jammy", "3.11")
    bench = ic.cpu_bench_argv(df.cmd)
    assert bench[bench.index("--device") + 1] == "cpu"
    assert bench[bench.index("--backend") + 1] == "onnxruntime"
    assert bench[bench.index("--sweep") + 1] == "/sweeps"


def test_logical_lines_join_continuations_and_drop_comments() -> None:
    text = "FROM x\n# note\nRUN a \\\n    # inside\n    && b \\\n\n    && c\nUSER 1\n"
    assert list(ic.logical_lines(text)) == ["FROM x", "RUN a && b && c", "USER 1"]
    with pytest.raises(ValueError, match="continuation"):
        list(ic.logical_lines("RUN a \\"))


@pytest.mark.parametrize(("command", "packages"), [
    ("apt-get update && apt-get install -y --no-install-recommends libgomp1 curl "
     "&& rm -rf /var/lib/apt/lists/*", ["libgomp1", "curl"]),
    ("apt-get install -y a; apt install -y b", ["a", "b"]),
    ("pip install apt-get", []),
])
def test_apt_packages_stop_at_shell_operators(command: str, packages: list[str]) -> None:
    assert ic.apt_packages(command) == packages


def test_pip_specs_unquote_and_skip_options() -> None:
    command = ('pip install --no-compile ".[bench,torch]" && pip uninstall -y onnxruntime '
               '&& python -m pip install "onnxruntime-gpu>=1.20,<1.24"')
    assert ic.pip_specs(command) == [".[bench,torch]", "onnxruntime-gpu>=1.20,<1.24"]
    assert ic.project_spec_extras("onnxruntime-gpu>=1.20") is None
    assert ic.project_spec_extras(".") == ()


def test_without_extras_drops_only_the_named_extras() -> None:
    assert ic.without_extras('pip install ".[bench,postgres,torch]"', ["torch"]) == \
        'pip install ".[bench,postgres]"'
    assert ic.without_extras("pip install .[torch]", ["torch"]) == "pip install ."
    assert ic.without_extras("pip install .[torch]", []) == "pip install .[torch]"


def test_env_expands_like_docker() -> None:
    pairs = ic.env_pairs('PATH=/opt/v/bin:$PATH HOME=/home/u MSG="a b"')
    assert pairs == [("PATH", "/opt/v/bin:$PATH"), ("HOME", "/home/u"), ("MSG", "a b")]
    assert ic.expand_env("/opt/v/bin:$PATH:${NOPE}", {"PATH": "/bin"}) == "/opt/v/bin:/bin:"
    assert ic.env_pairs("LEGACY some value") == [("LEGACY", "some value")]


def test_exec_and_shell_forms() -> None:
    assert ic.exec_form('["gpuplan", "serve"]') == ("gpuplan", "serve")
    assert ic.exec_form("gpuplan serve") == ("/bin/sh", "-c", "gpuplan serve")
    with pytest.raises(ValueError):
        ic.exec_form('["gpuplan", 1]')


def test_from_reads_arg_defaults_and_refuses_what_it_cannot_replay() -> None:
    df = ic.parse_dockerfile("ARG BASE=python:3.11-slim-bookworm\nFROM ${BASE}\nUSER 7\n"
                             'ENTRYPOINT ["a"]\nCMD ["b"]\n')
    assert df.base_image == "python:3.11-slim-bookworm" and df.cmd == ("b",)
    with pytest.raises(ValueError, match="ARG"):
        ic.parse_dockerfile("FROM ${MISSING}\n")
    with pytest.raises(ValueError, match="stage name"):
        ic.parse_dockerfile("FROM a AS build\n")
    with pytest.raises(ValueError, match="multi-stage"):
        ic.parse_dockerfile("FROM a\nFROM c\n")
    with pytest.raises(ValueError, match="ADD"):
        ic.parse_dockerfile("FROM a\nADD x /x\n")
    # A later ENTRYPOINT resets CMD, as in Docker.
    assert ic.parse_dockerfile('FROM a\nCMD ["x"]\nENTRYPOINT ["y"]\n').cmd == ()


@pytest.mark.parametrize("image", [
    "python:3.11-slim",  # trixie today, bookworm last year: the release must be named
    "ubuntu:22.04",
    "nvidia/cuda:12.4.1-runtime-ubuntu20.04",
])
def test_unknown_or_unpinned_release_bases_are_refused(image: str) -> None:
    with pytest.raises(ValueError):
        ic.resolve_base(image, ["python3.11"])


def test_cuda_base_needs_exactly_one_python_from_apt() -> None:
    with pytest.raises(ValueError, match=r"one pythonX\.Y"):
        ic.resolve_base("nvidia/cuda:12.4.1-runtime-ubuntu22.04", ["curl"])


@pytest.mark.parametrize("user", ["gpuplan", "0", "0:0", "1000:staff", ""])
def test_user_must_be_numeric_and_not_root(user: str) -> None:
    with pytest.raises(ValueError):
        ic.user_spec(user)


def test_manylinux_platforms_stop_at_the_release_glibc() -> None:
    jammy = ic.manylinux_platforms(ic.GLIBC_MINOR_BY_SUITE["jammy"])
    assert "manylinux_2_35_x86_64" in jammy and "manylinux_2_17_x86_64" in jammy
    assert "manylinux_2_36_x86_64" not in jammy and "manylinux2014_x86_64" in jammy


def test_the_runtime_script_drops_to_the_user_on_a_read_only_root(tmp_path: pathlib.Path) -> None:
    (tmp_path / "data").mkdir()
    box = ic.Container(tmp_path, {"PATH": "/usr/bin"}, "/src", "65532:65532", ("/data",))
    script = box.script(["gpuplan", "--version"], read_only=True)
    assert script[:5] == ["unshare", "--mount", "--net", "--pid", "--fork"]
    body = script[-1]
    assert f"mount -o remount,ro,bind {tmp_path}" in body
    assert f"tmpfs {tmp_path}/data" in body  # VOLUME stays writable
    assert "--userspec=65532:65532" in body and "HOME=/" in body
    assert body.rstrip().endswith("img gpuplan --version")
    assert "remount,ro" not in box.script(["true"], read_only=False)[-1]


# -- #35: docs/install.md's torch image is the shipped Dockerfile plus the torch extra ----------


def test_the_documented_torch_image_is_the_dockerfile_with_the_torch_extra(
        tmp_path: pathlib.Path) -> None:
    import re
    import subprocess

    doc = (ROOT / "docs" / "install.md").read_text()
    [expression] = re.findall(r"^sed '([^']+)' Dockerfile", doc, re.M)
    dockerfile = (ROOT / "Dockerfile").read_text()
    edited = subprocess.run(["sed", expression], input=dockerfile, capture_output=True,
                            text=True, check=True, timeout=30).stdout
    changed = [(a, b) for a, b in zip(dockerfile.splitlines(), edited.splitlines(), strict=True)
               if a != b]
    assert len(changed) == 1  # the extras of the one pip install, nothing else
    shipped, torch_image = ic.parse_dockerfile(dockerfile), ic.parse_dockerfile(edited)
    assert ".[serve,operator,postgres]" in shipped.pip_specs
    assert tuple(torch_image.pip_specs) == (".[serve,operator,postgres,torch]",)
    assert (torch_image.user, torch_image.entrypoint) == (shipped.user, shipped.entrypoint)
    example = (ROOT / "docs" / "examples" / "trainingjob-llama-hf-config.yaml").read_text()
    assert "docs/install.md#an-estimator-image-with-torch" in example
    assert "## An estimator image with torch" in doc
