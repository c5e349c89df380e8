"""The chart's Kubernetes versions (#32 item 1): every minor from Chart.yaml's floor to its cap
has a kube-scheduler tag in one table (scheduler.image.tagsByMinor), the cap is the newest minor
the testbed builds, and a version outside the range is refused."""

from __future__ import annotations

import re
import subprocess

import pytest
import yaml

from gpuplan_testing.helm_render import CHART, ROOT, default_kube_version, helm

CHART_META = yaml.safe_load((CHART / "Chart.yaml").read_text())
TAGS_BY_MINOR: dict[str, str] = yaml.safe_load(
    (CHART / "values.yaml").read_text())["scheduler"]["image"]["tagsByMinor"]
# kubeVersion: ">=1.<floor>.0-0 <1.<cap + 1>.0-0"
RANGE = re.fullmatch(r">=1\.(\d+)\.0-0 <1\.(\d+)\.0-0", CHART_META["kubeVersion"])


def _template(kube_version: str, *sets: str) -> subprocess.CompletedProcess[str]:
    args = [helm(), "template", "t", str(CHART), "--kube-version", kube_version]
    for s in sets:
        args += ["--set", s]
    return subprocess.run(args, capture_output=True, text=True, timeout=60)


def _scheduler_image(out: subprocess.CompletedProcess[str]) -> str:
    assert out.returncode == 0, out.stderr
    [image] = [c["image"] for d in yaml.safe_load_all(out.stdout)
               if d and d["kind"] == "Deployment"
               for c in d["spec"]["template"]["spec"]["containers"]
               if c["name"] == "kube-scheduler"]
    return str(image)


def test_the_table_covers_exactly_the_supported_minors_up_to_the_testbeds() -> None:
    assert RANGE, CHART_META["kubeVersion"]
    floor, cap = int(RANGE[1]), int(RANGE[2]) - 1
    assert sorted(TAGS_BY_MINOR, key=lambda m: int(m.split(".")[1])) == [
        f"1.{m}" for m in range(floor, cap + 1)]
    # The cap is the newest version the testbed can build (testbed/k8s/<version>/go.mod, the
    # install test's `make testbed-compat`): nothing newer is claimed. `make test`'s default
    # version is one of the table's.
    buildable = [d.name for d in (ROOT / "testbed" / "k8s").iterdir() if (d / "go.mod").exists()]
    newest = max(buildable, key=lambda v: tuple(int(p) for p in v.removeprefix("v").split(".")))
    assert newest.removeprefix("v").split(".")[:2] == ["1", str(cap)], buildable
    default = default_kube_version()
    assert ".".join(default.split(".")[:2]) in TAGS_BY_MINOR and f"v{default}" in buildable
    for minor, tag in TAGS_BY_MINOR.items():
        assert tag.startswith(f"v{minor}."), (minor, tag)


@pytest.mark.parametrize("minor", sorted(TAGS_BY_MINOR))
def test_kube_scheduler_matches_the_cluster_minor(minor: str) -> None:
    image = _scheduler_image(_template(f"{minor}.3"))
    assert image == f"registry.k8s.io/kube-scheduler:{TAGS_BY_MINOR[minor]}"


@pytest.mark.parametrize("version", ["1.29.9", "1.38.0"])
def test_versions_outside_the_tested_range_are_refused(version: str) -> None:
    out = _template(version)
    assert out.returncode != 0
    assert "kubeVersion" in out.stderr and CHART_META["kubeVersion"] in out.stderr, out.stderr


def test_a_minor_missing_from_the_table_needs_an_explicit_tag() -> None:
    newest = max(TAGS_BY_MINOR, key=lambda m: int(m.split(".")[1]))
    unmapped = f"scheduler.image.tagsByMinor.{newest.replace('.', chr(92) + '.')}=null"
    out = _template(f"{newest}.0", unmapped)
    assert out.returncode != 0
    assert f"no kube-scheduler image for Kubernetes v{newest}.0" in out.stderr
    assert "scheduler.image.tag" in out.stderr
    pinned = _scheduler_image(_template(f"{newest}.0", unmapped,
                                        f"scheduler.image.tag=v{newest}.9"))
    assert pinned.endswith(f":v{newest}.9")
