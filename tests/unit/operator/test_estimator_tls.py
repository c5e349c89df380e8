"""The estimator serves HTTPS with `--tls-cert/--tls-key` (`serving.server_tls`), and the
operator's client checks its certificate against the mounted CA (`estimator_ca_file`):
accepted with the right CA, refused with another CA or the system's trust store."""

from __future__ import annotations

import asyncio
import functools
import pathlib
import ssl

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


def _served_certificate(url: str, ca_file: pathlib.Path) -> bytes:
    """The DER certificate a new connection to `url` is served, checked against `ca_file`."""
    import socket
    import ssl
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    context = ssl.create_default_context(cafile=str(ca_file))
    with socket.create_connection((parts.hostname, parts.port), timeout=10) as raw, \
            context.wrap_socket(raw, server_hostname=parts.hostname) as conn:
        der = conn.getpeercert(binary_form=True)
    assert der is not None
    return der


def _der(pem_file: pathlib.Path) -> bytes:
    from cryptography import x509
    from cryptography.hazmat.primitives import serialization

    return x509.load_pem_x509_certificate(pem_file.read_bytes()).public_bytes(
        serialization.Encoding.DER)


def test_a_certificate_renewed_in_place_is_served_without_a_restart(tmp_path: pathlib.Path
                                                                   ) -> None:
    """cert-manager rewrites tls.crt and tls.key; the next connection gets the new pair (a new
    CA here, so the old CA no longer verifies it), the one before got the old."""
    first = make_server_files(tmp_path / "first")
    live = tmp_path / "live"
    live.mkdir()
    for name in ("tls.crt", "tls.key"):
        (live / name).write_bytes((first.cert.parent / name).read_bytes())
    renewed = make_server_files(tmp_path / "renewed", ca_name="renewed CA")
    context = planner.PlannerContext(catalog=devices.load_catalog(),
                                     predictor=roofline.RooflinePredictor(),
                                     predictor_source="roofline")
    app = service.make_app(service.ServiceState(functools.partial(work.given_context, context)),
                           service.ServiceSettings(bundle_poll_s=3600))
    tls = serving.server_tls(str(live / "tls.crt"), str(live / "tls.key"))

    async def main() -> tuple[bytes, bytes]:
        async with LocalServer(app, ssl_context=tls) as srv:
            before = await asyncio.to_thread(_served_certificate, srv.url, first.ca)
            for name in ("tls.crt", "tls.key"):  # as a Secret volume: a new file, renamed in
                (live / f".{name}").write_bytes((renewed.cert.parent / name).read_bytes())
                (live / f".{name}").replace(live / name)
            after = await asyncio.to_thread(_served_certificate, srv.url, renewed.ca)
            return before, after

    before, after = asyncio.run(main())
    assert before == _der(first.cert)
    assert after == _der(renewed.cert)


def test_a_half_rotated_pair_keeps_the_loaded_certificate(tmp_path: pathlib.Path) -> None:
    """A new certificate beside the old key does not load: the previous pair stays in use, and
    once the key arrives the new pair is served."""
    from gpuplan_estimator.interfaces.http import tls

    first = make_server_files(tmp_path / "first")
    renewed = make_server_files(tmp_path / "renewed")
    live = tmp_path / "live"
    live.mkdir()
    cert, key = live / "tls.crt", live / "tls.key"
    cert.write_bytes(first.cert.read_bytes())
    key.write_bytes(first.key.read_bytes())
    reloading = tls.ReloadingCertificate(str(cert), str(key))
    loaded = reloading.current()
    cert.write_bytes(renewed.cert.read_bytes())
    assert reloading.current() is loaded and reloading.reloads == 0
    key.write_bytes(renewed.key.read_bytes())
    assert reloading.current() is not loaded and reloading.reloads == 1
    assert reloading.current() is reloading.current(), "unchanged files: no reload"


def test_the_operator_rebuilds_its_ca_context_only_when_the_ca_file_changes(
        tmp_path: pathlib.Path) -> None:
    one = make_server_files(tmp_path / "one")
    two = make_server_files(tmp_path / "two", ca_name="a renewed CA with a longer name")
    ca = tmp_path / "ca.crt"
    ca.write_bytes(one.ca.read_bytes())
    first = estimator_client.server_check(str(ca))
    assert estimator_client.server_check(str(ca)) is first, "read once while unchanged"
    ca.write_bytes(two.ca.read_bytes())
    rebuilt = estimator_client.server_check(str(ca))
    assert rebuilt is not first
    assert isinstance(rebuilt, ssl.SSLContext)
    [ca_cert] = rebuilt.get_ca_certs()
    assert "a renewed CA with a longer name" in str(ca_cert["subject"])
    assert estimator_client.server_check("") is True
