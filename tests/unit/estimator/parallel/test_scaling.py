"""Data-parallel scaling: ring all-reduce arithmetic and fitting by differential evolution."""

import pytest

from gpuplan_estimator.parallel.scaling import ScalingModel, ScalingSample, fit_scaling


def test_single_gpu_has_no_allreduce() -> None:
    m = ScalingModel()
    ms = m.allreduce_ms(gradient_bytes=10**9, gpu_count=1, gpus_per_node=8, intra_node_gbps=600)
    assert ms == 0


def test_ring_allreduce_by_hand() -> None:
    m = ScalingModel(bandwidth_efficiency=1.0, hop_latency_us=0.0)
    # 4 GPUs, 1 GB of gradients, 100 GB/s: 2*3/4*1e9/1e11 s = 15 ms
    assert m.allreduce_ms(
        gradient_bytes=10**9, gpu_count=4, gpus_per_node=8, intra_node_gbps=100
    ) == pytest.approx(15.0)


def test_multi_node_uses_the_slower_network() -> None:
    m = ScalingModel(bandwidth_efficiency=1.0, hop_latency_us=0.0, inter_node_gbps=25)
    intra = m.allreduce_ms(gradient_bytes=10**9, gpu_count=8, gpus_per_node=8, intra_node_gbps=600)
    inter = m.allreduce_ms(gradient_bytes=10**9, gpu_count=16, gpus_per_node=8, intra_node_gbps=600)
    assert inter > 10 * intra


def test_overlap_hides_allreduce_behind_backward() -> None:
    m = ScalingModel(overlap=1.0)
    assert m.step_time_ms(compute_ms=30, backward_ms=20, optimizer_ms=1, allreduce_ms=15) == 31
    m0 = ScalingModel(overlap=0.0)
    assert m0.step_time_ms(compute_ms=30, backward_ms=20, optimizer_ms=1, allreduce_ms=15) == 46


def test_fit_recovers_constants_from_synthetic_runs() -> None:
    truth = ScalingModel(overlap=0.3, bandwidth_efficiency=0.6, hop_latency_us=20.0)
    samples = []
    for n in (2, 4, 8, 16):
        for grad in (10**8, 5 * 10**8, 2 * 10**9):
            ar = truth.allreduce_ms(gradient_bytes=grad, gpu_count=n, gpus_per_node=8,
                                    intra_node_gbps=300)
            step = truth.step_time_ms(compute_ms=50, backward_ms=30, optimizer_ms=2,
                                      allreduce_ms=ar)
            samples.append(ScalingSample(n, 8, 300, grad, 50, 30, 2, step))
    fitted = fit_scaling(samples, random_state=1)
    assert fitted.overlap == pytest.approx(0.3, abs=0.05)
    assert fitted.bandwidth_efficiency == pytest.approx(0.6, rel=0.05)


def test_fit_needs_enough_samples() -> None:
    with pytest.raises(ValueError, match="samples"):
        fit_scaling([])
