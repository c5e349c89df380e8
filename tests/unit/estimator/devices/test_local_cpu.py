"""CPU device: /proc parsing, a real (small) calibration, the JSON cache."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpuplan_estimator.core import errors
from gpuplan_estimator.devices import local_cpu

SMALL = local_cpu.CalibrationSizes(
    matmul_sizes=(64, 128), matmul_repeats=2, copy_bytes=8 * 2**20, copy_repeats=2
)
FACTS = local_cpu.HostFacts(model_name="Test CPU 9000 @ 3.0GHz", cores=4,
                          memory_bytes=16 * 2**30, max_clock_mhz=3000.0, l2_cache_mb=1.0)


class CountingMeasure:
    def __init__(self, gflops: float = 100.0, gbps: float = 20.0) -> None:
        self.calls = 0
        self.result = local_cpu.HostPeaks(peak_gflops_fp32=gflops, mem_bandwidth_gbps=gbps)

    def __call__(self, sizes: local_cpu.CalibrationSizes) -> local_cpu.HostPeaks:
        self.calls += 1
        return self.result


def test_real_measurement_is_positive_and_cached(tmp_path: Path) -> None:
    spec = local_cpu.local_cpu_device(cache_dir=tmp_path, sizes=SMALL, clock=lambda: 1.7e9)
    assert spec.key == "cpu" and spec.vendor == "cpu"
    # A 64..128 matmul on any machine of the last decade is between 0.1 and 100000 GFLOP/s.
    assert 0.1 < spec.peak_tflops["fp32"] * 1000 < 1e5
    assert 0.1 < spec.mem_bandwidth_gbps < 1e4
    (path,) = tmp_path.iterdir()
    doc = json.loads(path.read_text())
    assert doc["measured_at"].startswith("2023-11-14") and doc["measured_at_unix"] == 1.7e9
    assert doc["command"] == local_cpu.COMMAND and doc["sizes"]["matmul_sizes"] == [64, 128]
    assert doc["loadavg_1m"] >= 0
    assert doc["peak_gflops_fp32"] == pytest.approx(spec.peak_tflops["fp32"] * 1000)
    again = local_cpu.local_cpu_device(cache_dir=tmp_path, measure=False)
    assert again == spec


def test_host_facts_of_this_machine() -> None:
    facts = local_cpu.host_facts()
    assert facts.cores >= 1 and facts.memory_bytes > 2**28 and facts.model_name


def test_second_call_reads_the_cache_without_measuring(tmp_path: Path) -> None:
    fake = CountingMeasure()
    first = local_cpu.local_cpu_device(cache_dir=tmp_path, measure_fn=fake, facts=FACTS)
    second = local_cpu.local_cpu_device(cache_dir=tmp_path, measure_fn=fake, facts=FACTS)
    assert fake.calls == 1 and first == second
    assert first.peak_tflops["fp32"] == pytest.approx(0.1) and first.mem_bandwidth_gbps == 20.0
    assert (first.name, first.sm_count, first.memory_bytes) == (FACTS.model_name, 4, 16 * 2**30)
    assert [p.name for p in tmp_path.iterdir()] == ["cpu-test-cpu-9000-3-0ghz-4c.json"]


def test_cache_is_keyed_by_model_and_core_count(tmp_path: Path) -> None:
    fake = CountingMeasure()
    local_cpu.local_cpu_device(cache_dir=tmp_path, measure_fn=fake, facts=FACTS)
    other = local_cpu.HostFacts(**{**FACTS.__dict__, "cores": 8})
    local_cpu.local_cpu_device(cache_dir=tmp_path, measure_fn=fake, facts=other)
    assert fake.calls == 2 and len(list(tmp_path.iterdir())) == 2


def test_no_cache_and_no_measuring_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(errors.CalibrationError, match=r"no CPU calibration at .*cpu-test-cpu-9000"):
        local_cpu.local_cpu_device(cache_dir=tmp_path, measure=False, facts=FACTS)


@pytest.mark.parametrize("content", ["{not json", "[]", '{"schema_version": 1}',
                                     '{"schema_version": 1, "peak_gflops_fp32": -1, '
                                     '"mem_bandwidth_gbps": 3}'])
def test_corrupt_cache_is_remeasured(tmp_path: Path, content: str) -> None:
    path = local_cpu.cache_path(tmp_path, FACTS)
    path.write_text(content)
    with pytest.raises(errors.CalibrationError):
        local_cpu.local_cpu_device(cache_dir=tmp_path, measure=False, facts=FACTS)
    fake = CountingMeasure(gflops=50.0)
    spec = local_cpu.local_cpu_device(cache_dir=tmp_path, measure_fn=fake, facts=FACTS)
    assert fake.calls == 1 and spec.peak_tflops["fp32"] == pytest.approx(0.05)
    assert json.loads(path.read_text())["peak_gflops_fp32"] == 50.0


def test_a_zero_measurement_is_refused(tmp_path: Path) -> None:
    with pytest.raises(errors.CalibrationError, match="measured nothing"):
        local_cpu.local_cpu_device(cache_dir=tmp_path, facts=FACTS,
                                 measure_fn=CountingMeasure(gflops=0.0))


def test_default_cache_dir_follows_xdg(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert local_cpu.default_cache_dir() == tmp_path / "gpuplan"
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert local_cpu.default_cache_dir() == Path.home() / ".cache" / "gpuplan"


def test_host_facts_from_proc_and_sys_files(tmp_path: Path) -> None:
    proc, sysfs = tmp_path / "proc", tmp_path / "sys"
    proc.mkdir()
    (proc / "cpuinfo").write_text(
        "processor\t: 0\nmodel name\t: Fancy CPU X\ncpu MHz\t\t: 2400.5\n\n"
        "processor\t: 1\nmodel name\t: Fancy CPU X\ncpu MHz\t\t: 3100.0\n"
    )
    (proc / "meminfo").write_text("MemTotal:       32768000 kB\nMemFree: 1 kB\n")
    for index, level, size in (("index0", "1", "32K"), ("index2", "2", "2048K")):
        d = sysfs / "devices/system/cpu/cpu0/cache" / index
        d.mkdir(parents=True)
        (d / "level").write_text(level + "\n")
        (d / "size").write_text(size + "\n")
    facts = local_cpu.host_facts(proc_root=proc, sys_root=sysfs)
    assert facts.model_name == "Fancy CPU X"
    assert facts.memory_bytes == 32768000 * 1024
    assert facts.max_clock_mhz == 3100.0 and facts.l2_cache_mb == 2.0


def test_missing_meminfo_is_an_error(tmp_path: Path) -> None:
    (tmp_path / "cpuinfo").write_text("model name : X\n")
    with pytest.raises(errors.CalibrationError, match="MemTotal"):
        local_cpu.host_facts(proc_root=tmp_path, sys_root=tmp_path)
