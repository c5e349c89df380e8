"""The install harness's pure parts: what it runs, mounts, probes and remaps for a container."""

from __future__ import annotations

import pathlib
import subprocess
from typing import Any

import pytest

from gpuplan_testing import install_harness as ih


@pytest.mark.parametrize(("image", "repo"), [
    ("ghcr.io/gpuplan/gpuplan:0.1.0", "ghcr.io/gpuplan/gpuplan"),
    ("registry:5000/a/b@sha256:abc", "registry:5000/a/b"),
    ("registry:5000/a/b:1.2@sha256:abc", "registry:5000/a/b"),
    ("busybox", "busybox"),
])
def test_image_repository_drops_tag_and_digest_not_a_registry_port(image: str, repo: str) -> None:
    assert ih.image_repository(image) == repo


def test_vars_expand_as_kubernetes_does() -> None:
    env = {"A": "1", "B": "x"}
    assert ih.expand_vars("--a=$(A) $(B)$(C) $$(A)", env) == "--a=1 x$(C) $(A)"


def test_argv_follows_command_args_and_image_entrypoint_rules() -> None:
    image = "ghcr.io/gpuplan/gpuplan:1"
    assert ih.container_argv({"name": "c", "image": image, "command": ["x"], "args": ["y"]}) == [
        "x", "y"]
    assert ih.container_argv({"name": "c", "image": image, "args": ["serve"]}) == [
        "gpuplan", "serve"]
    assert ih.container_argv({"name": "c", "image": image})[:2] == ["gpuplan", "serve"]
    with pytest.raises(ih.HarnessError, match="no command and no entrypoint"):
        ih.container_argv({"name": "c", "image": "unknown/image:1"})


def test_probes_resolve_named_ports_and_refuse_a_host() -> None:
    container: dict[str, Any] = {"name": "c", "ports": [{"name": "http", "containerPort": 8080}],
                 "readinessProbe": {"httpGet": {"path": "/readyz", "port": "http"}},
                 "livenessProbe": {"httpGet": {"path": "/healthz", "port": 10259,
                                               "scheme": "HTTPS"}}}
    ready, live = ih.probes_of(container)
    assert ready.url({}) == "http://127.0.0.1:8080/readyz"
    assert live.url({10259: 4000}) == "https://127.0.0.1:4000/healthz"
    container["readinessProbe"]["httpGet"]["host"] = "127.0.0.1"
    with pytest.raises(ih.HarnessError, match="from the node"):
        ih.probes_of(container)
    with pytest.raises(ih.HarnessError, match="no port named"):
        ih.probes_of({"name": "c", "livenessProbe": {"httpGet": {"port": "metrics"}}})


def test_paths_are_rewritten_only_as_whole_path_prefixes() -> None:
    rewrites = {"/data": "/run/m/0", "/etc/cfg": "/run/m/1"}
    assert ih.rewrite_paths("--config=/etc/cfg/config.yaml", rewrites) == (
        "--config=/run/m/1/config.yaml")
    assert ih.rewrite_paths("/data", rewrites) == "/run/m/0"
    assert ih.rewrite_paths("/database /x/data /data2", rewrites) == "/database /x/data /data2"


def test_a_mount_that_would_hide_another_source_goes_last() -> None:
    binds = [("/tmp/w/tmp", "/tmp"), ("/tmp/w/sa", "/var/run/secrets/sa"), ("/tmp/w/h", "/etc/x")]
    assert ih.bind_order(binds)[-1] == ("/tmp/w/tmp", "/tmp")


def test_every_port_value_gets_a_free_port_and_nothing_else_changes() -> None:
    values = {"estimator": {"port": 8080, "workers": 3},
              "scheduler": {"extender": {"port": 8888, "metricsPort": 9101, "weight": 5}},
              "operator": {"metricsPort": 9100, "portable": 1, "enabled": True}}
    overlay = ih.free_port_values(values)
    assert set(overlay) == {"estimator", "scheduler", "operator"}
    assert set(overlay["scheduler"]["extender"]) == {"port", "metricsPort"}
    assert set(overlay["operator"]) == {"metricsPort"}
    merged = ih.merge(values, overlay)
    assert merged["estimator"]["workers"] == 3 and merged["scheduler"]["extender"]["weight"] == 5


def test_the_sandbox_mounts_run_paths_and_execs_the_container(tmp_path: pathlib.Path) -> None:
    """Real unshare: a file under /var/run/secrets/... and a rewritten mount are readable."""
    base = tmp_path
    (base / "sa").mkdir()
    (base / "sa" / "token").write_text("tok")
    (base / "cfg").mkdir()
    (base / "cfg" / "c.yaml").write_text("cfg")
    binds = [(str(base / "sa"), ih.SA_MOUNT), (str(base / "cfg"), f"{ih.REWRITTEN_MOUNTS}/0")]
    argv = ih.sandbox_argv(binds, ["/bin/cat", f"{ih.SA_MOUNT}/token",
                                   f"{ih.REWRITTEN_MOUNTS}/0/c.yaml"])
    out = subprocess.run(argv, capture_output=True, text=True, timeout=30)
    assert (out.returncode, out.stdout) == (0, "tokcfg"), out.stderr


def test_a_tmp_bind_keeps_the_checkout_under_tmp_visible(tmp_path: pathlib.Path) -> None:
    """Real unshare: a container's emptyDir on /tmp must not hide a checkout (or virtualenv)
    that lies under /tmp, as in a CI clone there; the emptyDir itself is what /tmp shows."""
    checkout = tmp_path / "checkout"
    checkout.mkdir()
    (checkout / "marker").write_text("repo")
    empty_dir = tmp_path / "emptydir"
    empty_dir.mkdir()
    (empty_dir / "scratch").write_text("tmp")
    assert str(checkout).startswith("/tmp/"), "pytest's tmp_path is under /tmp here"
    argv = ih.sandbox_argv([(str(empty_dir), "/tmp")],
                           ["/bin/cat", str(checkout / "marker"), "/tmp/scratch"],
                           keep=[str(checkout)])
    out = subprocess.run(argv, capture_output=True, text=True, timeout=30)
    assert (out.returncode, out.stdout) == (0, "repotmp"), out.stderr
    hidden = subprocess.run(ih.sandbox_argv([(str(empty_dir), "/tmp")],
                                            ["/bin/cat", str(checkout / "marker")]),
                            capture_output=True, text=True, timeout=30)
    assert hidden.returncode != 0  # without keep, the bind hides it (the CI failure)
