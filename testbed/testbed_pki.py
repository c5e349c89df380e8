"""Throw-away PKI for the testbed, made with the `openssl` CLI (Debian package `openssl`).

One CA signs the apiserver's serving certificate and the admin client certificate (group
`system:masters`, which bypasses RBAC); a separate key pair signs service-account tokens.
EC P-256 keys: generating them is instant, unlike RSA on a busy 2-core machine.
"""

from __future__ import annotations

import pathlib
import shutil
import subprocess

from testbed_common import TestbedError

OPENSSL_TIMEOUT_S = 30
VALID_DAYS = 30
APISERVER_SANS = (
    "IP:127.0.0.1,DNS:localhost,IP:10.0.0.1,DNS:kubernetes,DNS:kubernetes.default,"
    "DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local"
)
PKI_FILES = ("ca.crt", "ca.key", "apiserver.crt", "apiserver.key", "admin.crt", "admin.key",
             "sa.key", "sa.pub")


def ensure_pki(pki_dir: pathlib.Path) -> None:
    """Create the PKI in `pki_dir` unless every file already exists (reused across restarts)."""
    if all((pki_dir / f).is_file() for f in PKI_FILES):
        return
    if shutil.which("openssl") is None:
        raise TestbedError("openssl not found: install the Debian package 'openssl'")
    pki_dir.mkdir(parents=True, exist_ok=True)
    _openssl(pki_dir, "ecparam", "-name", "prime256v1", "-genkey", "-noout", "-out", "ca.key")
    _openssl(pki_dir, "req", "-x509", "-new", "-key", "ca.key", "-subj", "/CN=gpuplan-testbed-ca",
             "-days", str(VALID_DAYS), "-out", "ca.crt")
    _leaf(pki_dir, "apiserver", "/CN=kube-apiserver",
          f"subjectAltName={APISERVER_SANS}\nextendedKeyUsage=serverAuth\n")
    _leaf(pki_dir, "admin", "/O=system:masters/CN=testbed-admin",
          "extendedKeyUsage=clientAuth\n")
    _openssl(pki_dir, "ecparam", "-name", "prime256v1", "-genkey", "-noout", "-out", "sa.key")
    _openssl(pki_dir, "ec", "-in", "sa.key", "-pubout", "-out", "sa.pub")
    for name in ("ca.key", "apiserver.key", "admin.key", "sa.key"):
        (pki_dir / name).chmod(0o600)


def _leaf(pki_dir: pathlib.Path, name: str, subject: str, extensions: str) -> None:
    ext_file = pki_dir / f"{name}.ext"
    ext_file.write_text(extensions)
    _openssl(pki_dir, "ecparam", "-name", "prime256v1", "-genkey", "-noout", "-out", f"{name}.key")
    _openssl(pki_dir, "req", "-new", "-key", f"{name}.key", "-subj", subject, "-out", f"{name}.csr")
    _openssl(pki_dir, "x509", "-req", "-in", f"{name}.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
             "-CAcreateserial", "-days", str(VALID_DAYS), "-extfile", ext_file.name,
             "-out", f"{name}.crt")


def _openssl(cwd: pathlib.Path, *args: str) -> None:
    try:
        subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, text=True,
                       timeout=OPENSSL_TIMEOUT_S)
    except subprocess.CalledProcessError as exc:
        raise TestbedError(f"openssl {args[0]} failed in {cwd}: {exc.stderr.strip()}") from exc
    except subprocess.TimeoutExpired as exc:
        raise TestbedError(f"openssl {args[0]} timed out after {OPENSSL_TIMEOUT_S} s") from exc
