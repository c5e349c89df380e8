"""HTTPS on the estimator Service (issue #33, docs/security.md#tls): the chart's three sources of
the certificate, the estimator's flags and probes, and the operator's https URL and CA."""

from __future__ import annotations

import base64
import datetime
from typing import Any

import pytest
import yaml
from cryptography import x509

from gpuplan_testing.helm_render import render

ON = "estimator.tls.enabled=true"


def objects(*sets: str) -> list[dict[str, Any]]:
    out = render(*sets)
    assert out.returncode == 0, out.stderr
    return [d for d in yaml.safe_load_all(out.stdout) if d]


def named(docs: list[dict[str, Any]], kind: str, name: str) -> list[dict[str, Any]]:
    return [d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name]


def pod(docs: list[dict[str, Any]], component: str) -> dict[str, Any]:
    (deploy,) = named(docs, "Deployment", f"t-gpuplan-{component}")
    spec: dict[str, Any] = deploy["spec"]["template"]["spec"]
    return spec


def env(container: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e.get("value", "") for e in container["env"]}


def test_tls_is_off_by_default() -> None:
    docs = objects()
    assert named(docs, "Secret", "t-gpuplan-estimator-tls") == []
    (est,) = pod(docs, "estimator")["containers"]
    assert "--tls-cert" not in est["args"]
    assert est["readinessProbe"]["httpGet"]["scheme"] == "HTTP"
    (op,) = pod(docs, "operator")["containers"]
    assert env(op)["GPUPLAN_ESTIMATOR_URL"].startswith("http://")
    assert "GPUPLAN_ESTIMATOR_CA_FILE" not in env(op)


def test_the_chart_made_certificate_is_served_over_https_and_trusted_by_the_operator() -> None:
    docs = objects(ON)
    (secret,) = named(docs, "Secret", "t-gpuplan-estimator-tls")
    assert secret["type"] == "kubernetes.io/tls"
    pem = {k: base64.b64decode(v) for k, v in secret["data"].items()}
    ca = x509.load_pem_x509_certificate(pem["ca.crt"])
    cert = x509.load_pem_x509_certificate(pem["tls.crt"])
    cert.verify_directly_issued_by(ca)
    names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert "t-gpuplan-estimator.default.svc" in names.get_values_for_type(x509.DNSName)
    assert cert.not_valid_after_utc - cert.not_valid_before_utc <= datetime.timedelta(days=366)

    est_pod = pod(docs, "estimator")
    (est,) = est_pod["containers"]
    args = est["args"]
    assert args[args.index("--tls-cert") + 1] == "/etc/gpuplan/tls/tls.crt"
    assert args[args.index("--tls-key") + 1] == "/etc/gpuplan/tls/tls.key"
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert est[probe]["httpGet"]["scheme"] == "HTTPS"
    (tls,) = [v for v in est_pod["volumes"] if v["name"] == "tls"]
    assert tls["secret"]["secretName"] == "t-gpuplan-estimator-tls"

    op_pod = pod(docs, "operator")
    (op,) = op_pod["containers"]
    assert env(op)["GPUPLAN_ESTIMATOR_URL"] == "https://t-gpuplan-estimator.default.svc:8080"
    assert env(op)["GPUPLAN_ESTIMATOR_CA_FILE"] == "/etc/gpuplan/estimator-ca/ca.crt"
    (ca_volume,) = [v for v in op_pod["volumes"] if v["name"] == "estimator-ca"]
    assert ca_volume["secret"]["items"] == [{"key": "ca.crt", "path": "ca.crt"}]  # no key


def test_cert_manager_writes_the_secret_when_an_issuer_is_named() -> None:
    docs = objects(ON, "estimator.tls.certManager.issuerRef.name=my-ca",
                   "estimator.tls.certManager.issuerRef.kind=ClusterIssuer")
    assert named(docs, "Secret", "t-gpuplan-estimator-tls") == []
    (cert,) = named(docs, "Certificate", "t-gpuplan-estimator-tls")
    assert cert["spec"]["secretName"] == "t-gpuplan-estimator-tls"
    assert cert["spec"]["issuerRef"] == {"name": "my-ca", "kind": "ClusterIssuer"}
    assert "t-gpuplan-estimator.default.svc" in cert["spec"]["dnsNames"]


def test_an_existing_secret_is_used_as_it_is() -> None:
    docs = objects(ON, "estimator.tls.secretName=estimator-certs")
    assert not [d for d in docs if "tls" in d["metadata"]["name"]
                and d["kind"] in {"Secret", "Certificate"}]
    (tls,) = [v for v in pod(docs, "estimator")["volumes"] if v["name"] == "tls"]
    assert tls["secret"]["secretName"] == "estimator-certs"
    (ca,) = [v for v in pod(docs, "operator")["volumes"] if v["name"] == "estimator-ca"]
    assert ca["secret"]["secretName"] == "estimator-certs"


@pytest.mark.parametrize("bad", ["estimator.tls.secretName=Not_A_Name",
                                 "estimator.tls.selfSigned.days=0",
                                 "estimator.tls.certManager.issuer=x"])
def test_bad_tls_values_are_refused_by_the_schema(bad: str) -> None:
    out = render(ON, bad)
    assert out.returncode != 0 and "tls" in out.stderr, out.stderr
