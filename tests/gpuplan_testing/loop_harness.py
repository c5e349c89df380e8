"""Helpers of the retraining-loop test (tests/integration/test_retraining_loop.py).

* `LoopTimeline`: wall-clock stamps of the loop's stages, written as JSON when asked.
* `local_argv` / `local_env`: a Job's container command as a local process. The image's
  entrypoint is `gpuplan`; `$(VAR)` in args is expanded from the container's env as the kubelet
  does; `secretKeyRef` env values are read from the Secret. The GPU mapping (what the GPU node
  would have given) is the caller's.
* `finish_pod`: the Job's pod ends with the local process's exit code. The pods of this test
  never reach a kubelet (kwok would end them on its own clock), so the test writes the
  terminal status a kubelet would, and the real Job controller takes it from there
  (podFailurePolicy included).
* `scrape`, `sample`: the operator's /metrics; `alert_fires`: the chart's alert rule evaluated by
  promtool over the scraped values held constant (None when promtool is absent).
"""

from __future__ import annotations

import base64
import datetime as dt
import json
import os
import pathlib
import re
import shutil
import subprocess
import tempfile
import time
import urllib.request
from collections.abc import Mapping, Sequence
from typing import Any

import yaml
from prometheus_client.parser import text_string_to_metric_families

ROOT = pathlib.Path(__file__).resolve().parents[2]
ALERT_RULES = ROOT / "charts" / "gpuplan" / "files" / "alerts.yaml"
_VAR = re.compile(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)")


class LoopTimeline:
    """Stages of the loop with the time each was reached (first time only)."""

    def __init__(self) -> None:
        self.started = time.monotonic()
        self.stages: list[dict[str, Any]] = []
        self.result = "incomplete"
        """"passed" once every assertion held; otherwise the failure's first line."""

    def mark(self, stage: str) -> None:
        if any(s["stage"] == stage for s in self.stages):
            return
        self.stages.append({
            "stage": stage,
            "at": dt.datetime.now(dt.UTC).isoformat(timespec="milliseconds"),
            "seconds_from_start": round(time.monotonic() - self.started, 1)})

    def as_dict(self) -> dict[str, Any]:
        return {"schema_version": 1, "kind": "LoopTimeline", "result": self.result,
                "stages": self.stages}

    def write(self, path: pathlib.Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(self.as_dict(), indent=2) + "\n", encoding="utf-8")


def secret_value(core_v1: Any, namespace: str, name: str, key: str) -> str:
    secret = core_v1.read_namespaced_secret(name, namespace, _request_timeout=30)
    return base64.b64decode(secret.data[key]).decode()


def local_env(core_v1: Any, namespace: str, container: Any, scratch: pathlib.Path
              ) -> dict[str, str]:
    """The container's env for a local process: secret refs resolved; its HOME/TMPDIR/cache
    (container paths on emptyDirs) moved under `scratch`."""
    env: dict[str, str] = {}
    for var in container.env or []:
        if var.value_from is not None and var.value_from.secret_key_ref is not None:
            ref = var.value_from.secret_key_ref
            env[var.name] = secret_value(core_v1, namespace, ref.name, ref.key)
        elif var.value is not None:
            env[var.name] = var.value
    for name in ("HOME", "TMPDIR", "XDG_CACHE_HOME"):
        if name in env:
            path = scratch / name.lower()
            path.mkdir(parents=True, exist_ok=True)
            env[name] = str(path)
    return env


def expand(args: Sequence[str], env: Mapping[str, str]) -> list[str]:
    """`$(VAR)` expanded from `env` (unknown ones stay as written, as the kubelet leaves them)."""
    return [_VAR.sub(lambda m: env.get(m.group(1), m.group(0)), a) for a in args]


def replace_flag(args: Sequence[str], flag: str, value: str) -> list[str]:
    """`args` with the value after `flag` replaced; the flag must be there."""
    out = list(args)
    i = out.index(flag)
    out[i + 1] = value
    return out


def run_local(argv: Sequence[str], env: Mapping[str, str], log: pathlib.Path,
              timeout_s: float) -> int:
    """Run `argv` with the test's Python path plus `env`; stdout+stderr to `log`."""
    full = {**os.environ, **env, "PYTHONPATH": os.pathsep.join(
        [str(ROOT / "tests"), os.environ.get("PYTHONPATH", "")])}
    full.pop("KUBECONFIG", None)  # the Jobs' pods have no cluster credentials either
    with log.open("ab") as out:
        done = subprocess.run(list(argv), env=full, stdout=out, stderr=subprocess.STDOUT,
                              timeout=timeout_s, check=False)
    return done.returncode


def job_pod(core_v1: Any, namespace: str, job_name: str) -> Any | None:
    pods = core_v1.list_namespaced_pod(namespace, label_selector=f"job-name={job_name}",
                                       _request_timeout=30).items
    return pods[0] if pods else None


def finish_pod(core_v1: Any, pod: Any, exit_code: int) -> None:
    """Write the terminal status a kubelet would after the container exited `exit_code`."""
    now = dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    container = pod.spec.containers[0]
    terminated = {"exitCode": exit_code, "reason": "Completed" if exit_code == 0 else "Error",
                  "startedAt": now, "finishedAt": now}
    status = {
        "phase": "Succeeded" if exit_code == 0 else "Failed",
        "conditions": [{"type": "Ready", "status": "False", "reason": "PodCompleted",
                        "lastTransitionTime": now}],
        "containerStatuses": [{"name": container.name, "image": container.image, "imageID": "",
                               "ready": False, "restartCount": 0,
                               "state": {"terminated": terminated}}],
    }
    core_v1.patch_namespaced_pod_status(pod.metadata.name, pod.metadata.namespace,
                                        {"status": status}, _request_timeout=30)


def scrape(port: int) -> str:
    return str(urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics",
                                      timeout=10).read().decode())


def sample(text: str, name: str, **labels: str) -> float | None:
    """The value of sample `name` whose labels include `labels`, or None."""
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                return float(s.value)
    return None


def alert_fires(alert: str, series: Mapping[str, Sequence[float]], *, interval: str,
                eval_time: str) -> bool | None:
    """Whether the chart's rule `alert` fires at `eval_time` over `series` (PromQL series
    selector → values, one per `interval`), by promtool; None when promtool is absent."""
    promtool = shutil.which("promtool")
    if promtool is None:
        return None
    test = {"rule_files": [str(ALERT_RULES)], "evaluation_interval": interval,
            "tests": [{"interval": interval,
                       "input_series": [{"series": k, "values": " ".join(map(_num, v))}
                                        for k, v in series.items()],
                       "alert_rule_test": [{"eval_time": eval_time, "alertname": alert,
                                            "exp_alerts": []}]}]}
    with tempfile.TemporaryDirectory(prefix="gpuplan-alert-") as d:
        path = pathlib.Path(d) / "test.yaml"
        path.write_text(yaml.safe_dump(test), encoding="utf-8")
        done = subprocess.run([promtool, "test", "rules", str(path)], capture_output=True,
                              text=True, timeout=60, check=False)
    if done.returncode == 0:
        return False  # "no alerts" held
    if "got:[" in done.stdout + done.stderr or "alertname: " + alert in done.stdout + \
            done.stderr:
        return True
    raise AssertionError(f"promtool failed: {done.stdout}{done.stderr}")


def _num(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else repr(float(value))
