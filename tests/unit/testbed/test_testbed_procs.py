"""Process handling and PKI of the testbed, with real short-lived processes and real openssl."""

from __future__ import annotations

import os
import pathlib
import shutil
import subprocess
import sys
import time

import pytest
import testbed_procs as procs
from testbed_common import Layout, TestbedError
from testbed_lock import add_user, exclusive, remove_user
from testbed_pki import PKI_FILES, ensure_pki


@pytest.fixture
def layout(tmp_path: pathlib.Path) -> Layout:
    return Layout(tmp_path)


def group_members(pgid: int) -> list[int]:
    """Live processes of the group; zombies are dead, just not yet reaped (by init, here)."""
    members = []
    for entry in pathlib.Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                state = (entry / "stat").read_text().rpartition(")")[2].split()[0]
                if os.getpgid(int(entry.name)) == pgid and state != "Z":
                    members.append(int(entry.name))
            except (ProcessLookupError, FileNotFoundError):
                pass
    return members


def test_free_ports_are_distinct_loopback_ports() -> None:
    ports = procs.free_ports(8)
    assert len(set(ports)) == 8 and all(1024 <= p <= 65535 for p in ports)


def test_start_records_and_stop_kills_the_whole_group(layout: Layout) -> None:
    # The child forks a grandchild; stopping the group must take both down.
    script = "import subprocess,time; subprocess.Popen(['sleep','30']); time.sleep(30)"
    record = procs.start(layout, "sleeper", [sys.executable, "-c", script])
    assert procs.read_record(layout, "sleeper") == record
    assert procs.is_alive(record) and procs.rss_bytes(record) > 0
    # Both must exist before the stop, or "no member left" below would hold trivially.
    deadline_s = time.monotonic() + 10
    while len(group_members(record["pid"])) < 2 and time.monotonic() < deadline_s:
        time.sleep(0.05)
    assert len(group_members(record["pid"])) == 2
    assert procs.stop(layout, "sleeper", grace_s=5) is True
    assert not procs.is_alive(record)
    assert procs.read_record(layout, "sleeper") is None
    assert group_members(record["pid"]) == []
    assert procs.stop(layout, "sleeper") is False  # idempotent


def test_recycled_pid_is_not_treated_as_ours(layout: Layout) -> None:
    record = procs.start(layout, "sleeper", ["/bin/sleep", "30"])
    try:
        assert procs.is_alive(record)  # ours, alive: only the start time tells it apart
        assert not procs.is_alive(dict(record, start_ticks=record["start_ticks"] - 1))
    finally:
        procs.stop(layout, "sleeper", grace_s=5)


def test_wait_until_names_a_component_that_died_and_shows_its_log(layout: Layout) -> None:
    procs.start(layout, "crasher", ["/bin/sh", "-c", "echo 'bad flag --frobnicate'; exit 3"])
    with pytest.raises(TestbedError, match="crasher exited during start-up") as err:
        procs.wait_until(layout, "crasher", lambda: False, timeout_s=10)
    assert "bad flag --frobnicate" in str(err.value)


def test_wait_until_times_out_with_the_component_name(layout: Layout) -> None:
    procs.start(layout, "slowpoke", ["/bin/sleep", "30"])
    try:
        with pytest.raises(TestbedError, match=r"slowpoke not ready after 0 s"):
            procs.wait_until(layout, "slowpoke", lambda: False, timeout_s=0.2)
    finally:
        procs.stop(layout, "slowpoke", grace_s=5)


def test_missing_binary_points_at_the_build(layout: Layout) -> None:
    with pytest.raises(TestbedError, match="make testbed-build"):
        procs.start(layout, "etcd", [str(layout.state_dir / "nope" / "etcd")])


def test_http_probe_is_false_when_nothing_listens() -> None:
    (port,) = procs.free_ports(1)
    assert procs.http_ok(f"http://127.0.0.1:{port}/healthz") is False


@pytest.mark.skipif(shutil.which("openssl") is None, reason="openssl CLI not installed")
def test_pki_admin_cert_is_signed_by_the_ca_and_in_system_masters(tmp_path: pathlib.Path) -> None:
    ensure_pki(tmp_path)
    assert all((tmp_path / f).is_file() for f in PKI_FILES)
    verify = subprocess.run(["openssl", "verify", "-CAfile", "ca.crt", "admin.crt",
                             "apiserver.crt"], cwd=tmp_path, capture_output=True, text=True)
    assert verify.returncode == 0, verify.stderr
    subject = subprocess.run(["openssl", "x509", "-noout", "-subject", "-in", "admin.crt"],
                             cwd=tmp_path, capture_output=True, text=True).stdout
    assert "O = system:masters" in subject
    sans = subprocess.run(["openssl", "x509", "-noout", "-ext", "subjectAltName", "-in",
                           "apiserver.crt"], cwd=tmp_path, capture_output=True, text=True).stdout
    assert "IP Address:127.0.0.1" in sans
    before = (tmp_path / "ca.crt").read_bytes()
    ensure_pki(tmp_path)  # second call reuses the existing PKI
    assert (tmp_path / "ca.crt").read_bytes() == before


def test_exclusive_lock_excludes_a_second_holder(layout: Layout) -> None:
    with exclusive(layout), pytest.raises(TestbedError, match="still held"), \
            exclusive(layout, timeout_s=0.3):
        pass
    with exclusive(layout, timeout_s=0.3):  # released again
        pass


def test_last_user_count_ignores_dead_users(layout: Layout) -> None:
    other = subprocess.Popen(["/bin/sleep", "30"])
    try:
        add_user(layout)
        add_user(layout, other.pid)
        assert remove_user(layout) == 1  # the sleeping user remains
        other.kill()
        other.wait()
        assert remove_user(layout) == 0  # dead users are pruned, not counted
        assert not list((layout.state_dir / "users").glob("*.json"))
    finally:
        other.kill()
