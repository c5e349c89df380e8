"""The API port's TLS context, following its certificate files: cert-manager (or an operator
rotating the chart's Secret) renews the certificate in place, and the next TLS handshake serves
the new one without a restart.

Each handshake (the SNI callback, called with or without a server name) compares the files'
(mtime, size, inode) with those of the loaded pair: two `stat` calls. On a change the pair is
loaded into a new context and the handshake switches to it. A pair that does not load (a
rotation caught half-written: the new certificate beside the old key) keeps the old context and
is tried again at the next handshake, logged once per change.
"""

from __future__ import annotations

import logging
import ssl
from dataclasses import dataclass

from gpuplan_estimator.core.paths import FileStamp, file_stamp

log = logging.getLogger(__name__)

def server_context(cert_file: str, key_file: str) -> ssl.SSLContext:
    """A server context (TLS 1.2 or later) holding the pair; OSError/SSLError when it does not
    load."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_cert_chain(cert_file, key_file)
    return context


@dataclass(frozen=True)
class _Loaded:
    stamps: tuple[FileStamp, FileStamp]
    context: ssl.SSLContext


class ReloadingCertificate:
    """`context` is what the server listens with; its handshakes use the files' current pair.

    The first load's errors propagate (the caller names its flags); later ones keep serving the
    pair loaded last."""

    def __init__(self, cert_file: str, key_file: str) -> None:
        self.cert_file, self.key_file = cert_file, key_file
        stamps = self._stamps()
        self._loaded = _Loaded(stamps, server_context(cert_file, key_file))
        self._failed: tuple[FileStamp, FileStamp] | None = None
        self.reloads = 0
        self.context = server_context(cert_file, key_file)
        self.context.sni_callback = self._handshake

    def _stamps(self) -> tuple[FileStamp, FileStamp]:
        return (file_stamp(self.cert_file), file_stamp(self.key_file))

    def current(self) -> ssl.SSLContext:
        """The context of the files as they are now (reloaded when their stamps changed)."""
        try:
            stamps = self._stamps()
        except OSError as exc:  # a file gone mid-rotation: keep serving the loaded pair
            log.warning("TLS certificate files unreadable (%s); serving the loaded one", exc)
            return self._loaded.context
        if stamps == self._loaded.stamps:
            return self._loaded.context
        try:
            context = server_context(self.cert_file, self.key_file)
        except (OSError, ssl.SSLError) as exc:
            if stamps != self._failed:
                self._failed = stamps
                log.warning("TLS certificate %s with key %s changed but does not load (%s); "
                            "serving the previous one", self.cert_file, self.key_file, exc)
            return self._loaded.context
        self._loaded = _Loaded(stamps, context)
        self.reloads += 1
        log.info("TLS certificate %s reloaded", self.cert_file)
        return context

    def _handshake(self, connection: ssl.SSLObject | ssl.SSLSocket, _server_name: str | None,
                   _context: ssl.SSLContext) -> None:
        connection.context = self.current()
