"""The Kubernetes TokenReview call the write guard (`auth`) makes: who holds this bearer token?

`POST /apis/authentication.k8s.io/v1/tokenreviews` with the estimator's own credentials: the
pod's ServiceAccount in a cluster, a kubeconfig elsewhere (tests, a laptop). Every call has a
timeout; a server that cannot be reached or refuses the review raises `ReviewUnavailable`, which
the guard answers 503: an unverifiable caller is never let through (issue #16).
"""

from __future__ import annotations

import base64
import json
import os
import ssl
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import yaml

from gpuplan_estimator.core import streams

TOKENREVIEWS_PATH = "/apis/authentication.k8s.io/v1/tokenreviews"
IN_CLUSTER_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")
"""Where the kubelet mounts a pod's ServiceAccount token and the cluster CA."""
MAX_REVIEW_BYTES = 1 << 20
"""A TokenReview answer is a few hundred bytes; more is not one."""


class ReviewUnavailable(Exception):
    """The API server could not answer the review (down, timeout, refused, not a TokenReview)."""


class CredentialsError(Exception):
    """No usable credentials for the API server (no kubeconfig, broken kubeconfig)."""


@dataclass(frozen=True)
class Review:
    """The API server's verdict on one token."""
    authenticated: bool
    username: str
    """`system:serviceaccount:<ns>:<name>` for a ServiceAccount token; empty when not
    authenticated."""
    audiences: tuple[str, ...] = ()
    error: str = ""


@dataclass(frozen=True)
class ApiServer:
    """How to reach the API server as the estimator: URL, TLS, and a bearer token file
    (re-read on every call: projected tokens rotate) or a static token."""
    url: str
    ssl_context: ssl.SSLContext
    token_file: Path | None = None
    token: str | None = None

    def headers(self) -> dict[str, str]:
        """The estimator's own Authorization header (none with a client certificate)."""
        token = (self.token_file.read_text().strip() if self.token_file is not None
                 else self.token)
        return {"Authorization": f"Bearer {token}"} if token else {}


def in_cluster(environ: Mapping[str, str], directory: Path = IN_CLUSTER_DIR) -> ApiServer:
    """The pod's own ServiceAccount: KUBERNETES_SERVICE_HOST/PORT, its token and CA."""
    host, port = environ.get("KUBERNETES_SERVICE_HOST"), environ.get("KUBERNETES_SERVICE_PORT")
    if not host or not port:
        raise CredentialsError("not in a cluster: KUBERNETES_SERVICE_HOST/PORT unset")
    token_file, ca = directory / "token", directory / "ca.crt"
    if not token_file.is_file() or not ca.is_file():
        raise CredentialsError(f"no ServiceAccount token and CA in {directory} "
                               "(automountServiceAccountToken off?)")
    host = f"[{host}]" if ":" in host else host  # an IPv6 service address
    return ApiServer(f"https://{host}:{port}", ssl.create_default_context(cafile=str(ca)),
                     token_file=token_file)


def _file_or_data(spec: Mapping[str, Any], key: str, base: Path, scratch: Path) -> str | None:
    """Path of `key` (relative to the kubeconfig) or of its `key-data` written to `scratch`."""
    if spec.get(f"{key}-data"):
        target = scratch / key
        target.write_bytes(base64.b64decode(spec[f"{key}-data"]))
        return str(target)
    path = spec.get(key)
    return str(base / path) if path else None


def from_kubeconfig(path: Path) -> ApiServer:
    """The current context of a kubeconfig: server, CA, and a client certificate or token."""
    try:
        config = yaml.safe_load(path.read_text())
        contexts = {c["name"]: c["context"] for c in config.get("contexts") or ()}
        context = contexts[config["current-context"]]
        cluster = {c["name"]: c["cluster"] for c in config["clusters"]}[context["cluster"]]
        user = {u["name"]: u["user"] for u in config.get("users") or ()}.get(
            context.get("user"), {})
    except (OSError, yaml.YAMLError, KeyError, TypeError, AttributeError) as exc:
        raise CredentialsError(f"kubeconfig {path}: {type(exc).__name__}: {exc}") from exc
    base = path.resolve().parent
    with tempfile.TemporaryDirectory(prefix="gpuplan-kubeconfig-") as scratch_dir:
        scratch = Path(scratch_dir)  # inline keys exist on disk only while they are loaded
        ca = _file_or_data(cluster, "certificate-authority", base, scratch)
        context_ssl = ssl.create_default_context(cafile=ca)
        if cluster.get("insecure-skip-tls-verify"):
            context_ssl.check_hostname = False
            context_ssl.verify_mode = ssl.CERT_NONE
        cert = _file_or_data(user, "client-certificate", base, scratch)
        key = _file_or_data(user, "client-key", base, scratch)
        if cert is not None:
            context_ssl.load_cert_chain(cert, key)
    token_file = user.get("tokenFile")
    return ApiServer(str(cluster["server"]).rstrip("/"), context_ssl,
                     token_file=base / token_file if token_file else None,
                     token=user.get("token"))


def resolve_credentials(kubeconfig: str | None, environ: Mapping[str, str]) -> ApiServer:
    """An explicit kubeconfig, else the pod's ServiceAccount, else $KUBECONFIG (the order of
    the Kubernetes client libraries); CredentialsError when none applies."""
    if kubeconfig:
        return from_kubeconfig(Path(kubeconfig))
    if environ.get("KUBERNETES_SERVICE_HOST"):
        return in_cluster(environ)
    if environ.get("KUBECONFIG"):
        return from_kubeconfig(Path(environ["KUBECONFIG"].split(os.pathsep)[0]))
    raise CredentialsError("TokenReview needs the API server: run in a pod, or give "
                           "--write-auth-kubeconfig (or $KUBECONFIG)")


def review_body(token: str, audiences: Sequence[str]) -> dict[str, Any]:
    """The TokenReview object to create (pure)."""
    spec: dict[str, Any] = {"token": token}
    if audiences:
        spec["audiences"] = list(audiences)
    return {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview", "spec": spec}


def parse_review(document: Any) -> Review:
    """The verdict in a created TokenReview; ReviewUnavailable when it is not one."""
    status = document.get("status") if isinstance(document, Mapping) else None
    if not isinstance(status, Mapping):
        raise ReviewUnavailable("the API server's answer has no TokenReview status")
    authenticated = status.get("authenticated") is True
    user = status.get("user")
    user = user if isinstance(user, Mapping) else {}
    username = str(user.get("username", "")) if authenticated else ""
    audiences = tuple(str(a) for a in status.get("audiences") or ())
    return Review(authenticated and bool(username), username, audiences,
                  str(status.get("error", "")))


class TokenReviewer:
    """Creates TokenReviews over one connection pool; `close()` at shutdown."""

    def __init__(self, api: ApiServer, *, timeout_s: float) -> None:
        self.api = api
        self.timeout_s = timeout_s
        self._session: aiohttp.ClientSession | None = None

    async def review(self, token: str, audiences: Sequence[str]) -> Review:
        """The API server's verdict on `token`; ReviewUnavailable on any failure to get one."""
        if self._session is None:  # created on the serving loop, not at import
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(ssl=self.api.ssl_context))
        url = self.api.url + TOKENREVIEWS_PATH
        try:
            headers = self.api.headers()
            async with self._session.post(
                    url, json=review_body(token, audiences), headers=headers,
                    timeout=aiohttp.ClientTimeout(total=self.timeout_s)) as resp:
                raw = await streams.read_capped(resp.content, MAX_REVIEW_BYTES)
                status = resp.status
        except (TimeoutError, aiohttp.ClientError, OSError) as exc:
            raise ReviewUnavailable(f"TokenReview at {url}: {type(exc).__name__}: {exc}") from exc
        if status not in {200, 201}:  # 401/403 here: the estimator's own identity or RBAC
            raise ReviewUnavailable(f"TokenReview at {url} answered {status}: "
                                    f"{raw[:300].decode(errors='replace')}")
        if len(raw) > MAX_REVIEW_BYTES:
            raise ReviewUnavailable(f"TokenReview answer larger than {MAX_REVIEW_BYTES} bytes")
        try:
            return parse_review(json.loads(raw))
        except ValueError as exc:
            raise ReviewUnavailable(f"TokenReview answer is not JSON: {exc}") from exc

    async def close(self) -> None:
        """Close the connection pool."""
        if self._session is not None:
            await self._session.close()
