"""Shared types of the local testbed: the error type, the port set and the state-dir layout.

The testbed modules live in `testbed/` (not an installed package): `gpuplan_testbed.py` puts this
directory on `sys.path` when run as a script, and pytest's `pythonpath` does the same.
"""

from __future__ import annotations

import dataclasses
import pathlib
from dataclasses import dataclass

TESTBED_DIR = pathlib.Path(__file__).resolve().parent
REPO_ROOT = TESTBED_DIR.parent

# Start order; `down` stops in reverse. Names are used for log, pid and probe files.
COMPONENTS: tuple[str, ...] = (
    "etcd",
    "kube-apiserver",
    "kube-controller-manager",
    "kube-scheduler",
    "gpuplan-scheduler",
    "kwok",
)

GPUPLAN_SCHEDULER_NAME = "gpuplan-scheduler"
NODE_LABEL_SELECTOR = "gpuplan.io/testbed-node=true"


class TestbedError(RuntimeError):
    """The testbed could not be built, started, probed or stopped; the message says which part."""

    __test__ = False  # not a pytest test class despite the name


@dataclass(frozen=True)
class Ports:
    """TCP ports on 127.0.0.1, one per listener; all chosen free at `up` unless given."""

    etcd_client: int
    etcd_peer: int
    apiserver: int
    controller_manager: int
    scheduler_default: int
    scheduler_gpuplan: int
    kwok: int
    extender: int

    def as_dict(self) -> dict[str, int]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, raw: dict[str, int]) -> Ports:
        names = {f.name for f in dataclasses.fields(cls)}
        missing = names - raw.keys()
        if missing:
            raise TestbedError(f"state.json: ports lacks {sorted(missing)}")
        return cls(**{k: int(raw[k]) for k in names})


@dataclass(frozen=True)
class Layout:
    """Every path the testbed writes, all below one state directory (absolute paths only)."""

    state_dir: pathlib.Path

    @property
    def pki(self) -> pathlib.Path:
        return self.state_dir / "pki"

    @property
    def logs(self) -> pathlib.Path:
        return self.state_dir / "logs"

    @property
    def pids(self) -> pathlib.Path:
        return self.state_dir / "pids"

    @property
    def etcd_data(self) -> pathlib.Path:
        return self.state_dir / "etcd-data"

    @property
    def config(self) -> pathlib.Path:
        return self.state_dir / "config"

    @property
    def kubeconfig(self) -> pathlib.Path:
        return self.state_dir / "kubeconfig"

    @property
    def state_json(self) -> pathlib.Path:
        return self.state_dir / "state.json"

    def log(self, component: str) -> pathlib.Path:
        return self.logs / f"{component}.log"

    def pid(self, component: str) -> pathlib.Path:
        return self.pids / f"{component}.json"

    def pki_file(self, name: str) -> pathlib.Path:
        return self.pki / name
