"""An admission webhook that holds chosen writes of the operator open, so a test can SIGKILL
the operator while that write is in flight and then decide whether the write happens.

The kube-apiserver calls it over HTTPS (a throw-away self-signed certificate from `openssl`);
`matchConditions` send it only the writes of the campaign's step TrainingJobs, so every other
request of the namespace is untouched. A held request answers when released, or is refused
after `HOLD_LIMIT_S` (below the webhook's 30 s timeout).

    with HoldingWebhook(tmp) as hook:
        hook.install(admission_api, namespace, holds)   # {step: Hold}
        hook.wait_held(...); kill the operator; hook.release("job", allow=True)
        hook.uninstall(admission_api)
"""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import http.server
import json
import pathlib
import ssl
import subprocess
import threading
import time
import urllib.parse
from typing import Any

HOLD_LIMIT_S = 25.0
OWNER_LABEL = "gpuplan.io/trainingjob"
GPU_TYPE = "gpuplan.io/gpu-type"


@dataclasses.dataclass(frozen=True)
class Hold:
    """Which write to hold: the plan annotations of a TrainingJob, or the Job of one."""

    write: str  # "annotations" | "job"
    trainingjob: str

    def match(self) -> str:
        """CEL matchCondition selecting exactly this write."""
        if self.write == "annotations":
            new = f"has(object.metadata.annotations) && '{GPU_TYPE}' in object.metadata.annotations"
            old = (f"oldObject != null && has(oldObject.metadata.annotations) && "
                   f"'{GPU_TYPE}' in oldObject.metadata.annotations")
            return f"object.metadata.name == '{self.trainingjob}' && ({new}) && !({old})"
        return (f"has(object.metadata.labels) && '{OWNER_LABEL}' in object.metadata.labels && "
                f"object.metadata.labels['{OWNER_LABEL}'] == '{self.trainingjob}'")

    def rule(self) -> dict[str, Any]:
        if self.write == "annotations":
            return {"apiGroups": ["gpuplan.io"], "apiVersions": ["*"], "operations": ["UPDATE"],
                    "resources": ["trainingjobs"], "scope": "Namespaced"}
        return {"apiGroups": ["batch"], "apiVersions": ["*"], "operations": ["CREATE"],
                "resources": ["jobs"], "scope": "Namespaced"}


class _Slot:
    def __init__(self) -> None:
        self.held_at: float | None = None
        self.answered: bool | None = None
        self.allow = False
        self.released = threading.Event()
        self.done = threading.Event()


class HoldingWebhook:
    """HTTPS admission webhook on 127.0.0.1 holding the requests of its `Hold`s."""

    def __init__(self, workdir: pathlib.Path) -> None:
        self.workdir = workdir
        self.slots: dict[str, _Slot] = {}
        self.name = ""
        self._server: http.server.ThreadingHTTPServer | None = None
        self._cert = workdir / "webhook.crt"
        self._key = workdir / "webhook.key"

    # -- server
    def __enter__(self) -> HoldingWebhook:
        subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
                        "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1",
                        "-keyout", str(self._key), "-out", str(self._cert)],
                       check=True, capture_output=True, timeout=60)
        hook = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                review = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                allowed, message = hook._decide(
                    urllib.parse.urlsplit(self.path).path.strip("/"), review["request"])
                body = json.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                                   "response": {"uid": review["request"]["uid"],
                                                "allowed": allowed,
                                                "status": {"code": 200 if allowed else 403,
                                                           "message": message}}}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                with contextlib.suppress(OSError):  # the apiserver gave up waiting
                    self.wfile.write(body)

            def log_message(self, *_: Any) -> None:
                pass

        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        server.daemon_threads = True
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(str(self._cert), str(self._key))
        server.socket = ctx.wrap_socket(server.socket, server_side=True)
        self._server = server
        threading.Thread(target=server.serve_forever, daemon=True, name="chaos-webhook").start()
        return self

    def __exit__(self, *_: object) -> None:
        for slot in self.slots.values():
            slot.released.set()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()

    def _decide(self, step: str, request: dict[str, Any]) -> tuple[bool, str]:
        slot = self.slots.get(step)
        if slot is None:
            return True, "not held"
        slot.held_at = slot.held_at or time.monotonic()
        released = slot.released.wait(HOLD_LIMIT_S)
        allow = slot.allow if released else False
        slot.answered = allow
        slot.done.set()
        return allow, f"chaos-webhook {step}: {'allowed' if allow else 'refused'} after a hold"

    # -- configuration
    def install(self, admission: Any, namespace: str, holds: dict[str, Hold]) -> None:
        """Create the ValidatingWebhookConfiguration, one webhook per step."""
        assert self._server is not None
        port = self._server.server_address[1]
        self.name = f"chaos-hold-{namespace}"[:63]
        ca = base64.b64encode(self._cert.read_bytes()).decode()
        self.slots = {step: _Slot() for step in holds}
        webhooks = [{
            "name": f"{step}.chaos.gpuplan.io",
            "clientConfig": {"url": f"https://127.0.0.1:{port}/{step}", "caBundle": ca},
            "rules": [hold.rule()],
            "matchConditions": [{"name": "step", "expression": hold.match()}],
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}},
            "failurePolicy": "Fail", "sideEffects": "None", "timeoutSeconds": 30,
            "admissionReviewVersions": ["v1"],
        } for step, hold in holds.items()]
        admission.create_validating_webhook_configuration(
            {"apiVersion": "admissionregistration.k8s.io/v1",
             "kind": "ValidatingWebhookConfiguration", "metadata": {"name": self.name},
             "webhooks": webhooks}, _request_timeout=30)

    def uninstall(self, admission: Any) -> None:
        with contextlib.suppress(Exception):
            admission.delete_validating_webhook_configuration(self.name, _request_timeout=30)

    # -- holds
    def held(self) -> list[str]:
        return [s for s, slot in self.slots.items() if slot.held_at is not None
                and not slot.done.is_set()]

    def first_hold_age(self) -> float | None:
        times = [s.held_at for s in self.slots.values() if s.held_at is not None]
        return time.monotonic() - min(times) if times else None

    def release(self, step: str, *, allow: bool, timeout_s: float = 10.0) -> bool | None:
        """Answer the held request of `step`; returns the answer given (None: never held)."""
        slot = self.slots[step]
        slot.allow = allow
        slot.released.set()
        if slot.held_at is None:
            return None
        slot.done.wait(timeout_s)
        return slot.answered
