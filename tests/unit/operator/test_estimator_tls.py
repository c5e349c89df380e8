"""The estimator serves HTTPS with `--tls-cert/--tls-key` (`serving.server_tls`), and the
operator's client checks its certificate against the mounted CA (`estimator_ca_file`):
accepted with the right CA, refused with another CA or the system's trust store."""

from __future__ import annotations

import asyncio
import functools
import pathlib

import pytest

from gpuplan_estimator import devices
from gpuplan_estimator.core.errors import GpuplanError
from gpuplan_estimator.cost import roofline
from gpuplan_estimator.interfaces.cli import serving
from gpuplan_estimator.interfaces.http import service, wire, work
from gpuplan_estimator.planning import planner
from gpuplan_operator import estimator_client
from gpuplan_operator.core import errors
from gpuplan_testing.certificates import make_server_files
from gpuplan_testing.operator_builders import LocalServer

OUTCOME = {"job_uid": "u1", "gpu_type": "NVIDIA-L4", "gpu_count": 1,
           "estimated_seconds": 100.0, "actual_seconds": 110.0, "namespace": "team-a"}


def _post_over_tls(tmp_path: pathlib.Path, ca_file: str) -> list[wire.OutcomeRequest]:
    """Serve the estimator with a certificate of a fresh CA; post one outcome trusting
    `ca_file` (a path, or "" for the system store). The outcomes the service stored."""
    files = make_server_files(tmp_path / "server")
    stored: list[wire.OutcomeRequest] = []

    def sink(req: wire.OutcomeRequest, _device: str) -> tuple[int, bool]:
        stored.append(req)
        return len(stored), True

    context = planner.PlannerContext(catalog=devices.load_catalog(),
                                     predictor=roofline.RooflinePredictor(),
                                     predictor_source="roofline")
    app = service.make_app(service.ServiceState(functools.partial(work.given_context, context)),
                           service.ServiceSettings(bundle_poll_s=3600), outcome_sink=sink)
    tls = serving.server_tls(str(files.cert), str(files.key))

    async def main() -> None:
        async with LocalServer(app, ssl_context=tls) as srv:
            assert srv.url.startswith("https://")
            await estimator_client.report_outcome(
                srv.url, OUTCOME, timeout_seconds=10,
                ca_file=ca_file.replace("{server}", str(files.ca)))

    asyncio.run(main())
    return stored


def test_the_operator_posts_to_an_https_estimator_it_verifies(tmp_path: pathlib.Path) -> None:
    stored = _post_over_tls(tmp_path, "{server}")
    assert [(r.job_uid, r.namespace) for r in stored] == [("u1", "team-a")]


def test_a_certificate_of_another_ca_is_refused(tmp_path: pathlib.Path) -> None:
    other = make_server_files(tmp_path / "other", ca_name="someone else's CA")
    with pytest.raises(errors.EstimatorUnavailableError, match=r"[Cc]ertificate"):
        _post_over_tls(tmp_path, str(other.ca))


def test_without_a_ca_file_the_system_store_refuses_a_private_ca(tmp_path: pathlib.Path
                                                                  ) -> None:
    with pytest.raises(errors.EstimatorUnavailableError, match=r"[Cc]ertificate"):
        _post_over_tls(tmp_path, "")


def test_an_unreadable_ca_file_is_named(tmp_path: pathlib.Path) -> None:
    with pytest.raises(errors.EstimatorUnavailableError, match=r"no-such-ca\.crt"):
        estimator_client.server_check(str(tmp_path / "no-such-ca.crt"))


def test_the_estimators_tls_flags_go_together_and_name_themselves(tmp_path: pathlib.Path
                                                                  ) -> None:
    files = make_server_files(tmp_path)
    assert serving.server_tls(None, None) is None
    with pytest.raises(GpuplanError, match="--tls-cert and --tls-key go together"):
        serving.server_tls(str(files.cert), None)
    with pytest.raises(GpuplanError, match="--tls-cert/--tls-key: cannot load"):
        serving.server_tls(str(files.ca), str(files.key))  # the key is not the CA's
