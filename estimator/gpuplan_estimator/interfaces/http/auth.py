"""Who may write: the estimator's write endpoints verify the caller's Kubernetes identity.

`POST /v1/outcomes` moves the calibration of every GPU and `POST /v1/models/{v}/activate`
changes the served bundle; unauthenticated, any pod could do either (issue #16: three posts
moved a T4 prediction from 56.6 to 190.5 ms). In `tokenreview` mode a write must carry
`Authorization: Bearer <ServiceAccount token>`; the API server says whose token it is
(`tokenreview`) and the username must be on the allow-list. Reads stay open.

Answers: 401 for a missing, malformed or rejected token; 403 for a verified caller not on the
list; 503 when the API server cannot be asked (never fail open). A positive review is cached by
the token's SHA-256 for a short TTL in a bounded LRU, so a burst of outcomes costs one review.
"""

from __future__ import annotations

import collections
import hashlib
import ipaddress
import logging
import os
import re
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal, Protocol

from aiohttp import web

from gpuplan_estimator.interfaces.http import admission, tokenreview, work

log = logging.getLogger(__name__)

Mode = Literal["tokenreview", "none"]
MODES: tuple[Mode, ...] = ("tokenreview", "none")
SERVICE_ACCOUNT_SUBJECT = re.compile(
    r"^system:serviceaccount:[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?:"
    r"[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$")
"""`system:serviceaccount:<namespace>:<name>`, the username the API server gives an SA token."""
MAX_TOKEN_CHARS = 16 * 1024
"""A ServiceAccount JWT is about 1 KB; a longer header value is not one."""
LOOPBACK_NAMES = frozenset({"localhost", "localhost.localdomain"})


@dataclass(frozen=True)
class WriteAuthSettings:
    """How the write endpoints authenticate and authorize callers."""
    mode: Mode
    """`tokenreview`: verify the bearer token with the API server; `none`: writes are open
    (only for a service bound to loopback, or by explicit choice)."""
    allowed_subjects: tuple[str, ...] = ()
    """ServiceAccount usernames allowed to write (`system:serviceaccount:<ns>:<name>`)."""
    audiences: tuple[str, ...] = ()
    """Audiences the token must be for (TokenReview `spec.audiences`); empty: the API server's
    own, which the kubelet-mounted ServiceAccount token carries."""
    kubeconfig: str | None = None
    """Credentials for the TokenReview; None: the pod's ServiceAccount, else $KUBECONFIG."""
    timeout_s: float = 5.0
    """Deadline of one TokenReview call."""
    cache_ttl_s: float = 60.0
    """How long a verified token stays verified without asking again (a deleted
    ServiceAccount's token keeps writing at most this long)."""
    cache_entries: int = 1024
    """Most verified tokens remembered (least recently used evicted first)."""

    def problems(self) -> list[str]:
        """Every invalid field, named as its command-line option."""
        out: list[str] = []
        if self.mode not in MODES:
            out.append(f"--write-auth: need one of {', '.join(MODES)}, got {self.mode!r}")
        if self.mode == "tokenreview" and not self.allowed_subjects:
            out.append("--write-allowed-subjects: tokenreview needs at least one "
                       "system:serviceaccount:<namespace>:<name>")
        for subject in self.allowed_subjects:
            if not SERVICE_ACCOUNT_SUBJECT.match(subject):
                out.append(f"--write-allowed-subjects: {subject!r} is not "
                           "system:serviceaccount:<namespace>:<name>")
        if not self.timeout_s > 0:
            out.append(f"--write-auth-timeout: must be > 0, got {self.timeout_s}")
        if not self.cache_ttl_s >= 0:
            out.append(f"--write-auth-cache-ttl: must be >= 0, got {self.cache_ttl_s}")
        if not self.cache_entries >= 1:
            out.append(f"write auth cache entries: must be >= 1, got {self.cache_entries}")
        return out


def is_loopback(host: str) -> bool:
    """True when `host` (a listen address) only accepts connections from this machine."""
    if host.lower() in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def default_mode(host: str) -> Mode | None:
    """The mode when none is given: `none` on loopback (a laptop's `gpuplan serve`), else None:
    a service other machines can reach must say how writes are authenticated."""
    return "none" if is_loopback(host) else None


def bearer_token(header: str | None) -> str | None:
    """The token of an `Authorization: Bearer <token>` header; None when absent or not one."""
    if not header:
        return None
    scheme, _, token = header.strip().partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token or len(token) > MAX_TOKEN_CHARS \
            or any(c.isspace() for c in token):
        return None
    return token


Clock = Callable[[], float]
"""Monotonic seconds (`time.monotonic`); tests pass their own."""


class VerifiedTokens:
    """Positive reviews by token SHA-256 → (username, expiry), bounded, least recently used
    evicted. The token itself is never kept."""

    def __init__(self, ttl_s: float, entries: int, clock: Clock = time.monotonic) -> None:
        self._ttl_s = ttl_s
        self._entries = entries
        self._clock = clock
        self._by_digest: collections.OrderedDict[str, tuple[str, float]] = \
            collections.OrderedDict()

    @staticmethod
    def digest(token: str) -> str:
        """The cache key of `token`."""
        return hashlib.sha256(token.encode()).hexdigest()

    def get(self, token: str) -> str | None:
        """The username of a token verified less than the TTL ago, else None."""
        key = self.digest(token)
        found = self._by_digest.get(key)
        if found is None:
            return None
        username, expires = found
        if self._clock() >= expires:
            del self._by_digest[key]
            return None
        self._by_digest.move_to_end(key)
        return username

    def put(self, token: str, username: str) -> None:
        """Remember a verified token for the TTL."""
        if self._ttl_s <= 0:
            return
        key = self.digest(token)
        self._by_digest[key] = (username, self._clock() + self._ttl_s)
        self._by_digest.move_to_end(key)
        while len(self._by_digest) > self._entries:
            self._by_digest.popitem(last=False)

    def __len__(self) -> int:
        return len(self._by_digest)


class Reviewer(Protocol):
    """Asks the API server about a token (`tokenreview.TokenReviewer`)."""

    async def review(self, token: str, audiences: Sequence[str]) -> tokenreview.Review:
        """The verdict; raises `tokenreview.ReviewUnavailable` when none can be had."""

    async def close(self) -> None:
        """Release connections."""
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class Denied(Exception):
    """A write refused: the HTTP status, the envelope's reason and a message for the caller."""

    def __init__(self, status: int, reason: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.reason = reason


class WriteGuard:
    """Decides whether a write request may proceed (`check`), and wraps write handlers."""

    def __init__(self, settings: WriteAuthSettings, reviewer: Reviewer | None = None,
                 clock: Clock = time.monotonic) -> None:
        if settings.mode == "tokenreview" and reviewer is None:
            raise ValueError("tokenreview mode needs a reviewer")
        self.settings = settings
        self._reviewer = reviewer
        self._allowed = frozenset(settings.allowed_subjects)
        self.verified = VerifiedTokens(settings.cache_ttl_s, settings.cache_entries, clock)

    async def check(self, authorization: str | None) -> str | None:
        """The caller's username (None in `none` mode); raises Denied with 401/403/503."""
        if self.settings.mode == "none":
            return None
        token = bearer_token(authorization)
        if token is None:
            raise Denied(401, "Unauthenticated", "this endpoint needs 'Authorization: Bearer "
                         "<token>' with the caller's Kubernetes ServiceAccount token")
        username = await self._verified(token)
        if username not in self._allowed:
            log.warning("write refused for %s: not in --write-allowed-subjects", username)
            raise Denied(403, "Forbidden", f"{username} may not write to the estimator "
                         "(not in its allowed subjects)")
        return username

    async def fairness_key(self, authorization: str | None, asserted: str | None,
                           peer: str | None) -> str:
        """Whose share of the workers and queues a request uses (issue #33). Only an allowed
        writer (the operator), verified like a write, may say which tenant a request is for
        (the TrainingJob's namespace, `asserted`); anyone else is keyed by its address, the
        header ignored. With writes open (`none`) nobody is verified: address and header."""
        if self.settings.mode == "none":
            return admission.client_key(asserted, peer)
        token = bearer_token(authorization)
        try:
            username = await self._verified(token) if token is not None else None
        except Denied:
            username = None
        if username is None or username not in self._allowed:
            return admission.client_key(None, peer)
        return admission.client_key(asserted, username)

    async def _verified(self, token: str) -> str:
        """The username of a token the API server accepts for our audiences; Denied (401, or
        503 when it cannot be asked) otherwise."""
        username = self.verified.get(token)
        if username is None:
            assert self._reviewer is not None
            try:
                review = await self._reviewer.review(token, self.settings.audiences)
            except tokenreview.ReviewUnavailable as exc:
                log.warning("write refused, caller not verifiable: %s", exc)
                raise Denied(503, "AuthUnavailable", "cannot verify the caller's token with "
                             "the Kubernetes API server now; retry later") from exc
            wanted = set(self.settings.audiences)
            if not review.authenticated or (wanted and not wanted & set(review.audiences)):
                raise Denied(401, "Unauthenticated", "the bearer token was not accepted by "
                             "the Kubernetes API server (invalid, expired or wrong audience)")
            username = review.username
            self.verified.put(token, username)
        return username

    def protect(self, handler: Handler) -> Handler:
        """`handler`, answered only for callers `check` lets through."""
        async def guarded(request: web.Request) -> web.StreamResponse:
            try:
                await self.check(request.headers.get("Authorization"))
            except Denied as exc:
                reply = work.error_reply(exc.status, exc.reason, str(exc))
                headers = ({"WWW-Authenticate": 'Bearer realm="gpuplan-estimator"'}
                           if exc.status == 401 else None)
                return web.json_response(reply.body, status=reply.status, headers=headers)
            return await handler(request)
        return guarded

    async def close(self) -> None:
        """Release the reviewer's connections (the service's cleanup)."""
        if self._reviewer is not None:
            await self._reviewer.close()


OPEN = WriteAuthSettings(mode="none")
"""Writes open to anyone who can connect: tests and a loopback-bound `gpuplan serve`."""


def build_guard(settings: WriteAuthSettings, environ: Mapping[str, str] | None = None
                ) -> WriteGuard:
    """The guard for `settings`, with a TokenReview client on the estimator's credentials
    (raises `tokenreview.CredentialsError` when it has none)."""
    if settings.mode == "none":
        return WriteGuard(settings)
    api = tokenreview.resolve_credentials(settings.kubeconfig,
                                          os.environ if environ is None else environ)
    reviewer = tokenreview.TokenReviewer(api, timeout_s=settings.timeout_s)
    return WriteGuard(settings, reviewer)
