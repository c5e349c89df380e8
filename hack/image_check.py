#!/usr/bin/env python3
"""Build each image's root filesystem without Docker and run the image inside it.

For every Dockerfile listed in IMAGES, the Dockerfile itself is the source of truth: its FROM
line picks the distribution release (python:3.11-slim-bookworm is Debian bookworm, whose python3
is 3.11; nvidia/cuda:…-ubuntu22.04 is Ubuntu jammy), its `apt-get install` packages are put into
the root filesystem by mmdebstrap, and then its ENV/WORKDIR/COPY/RUN/USER instructions are
replayed in order inside a chroot: the RUN lines run literally (`apt-get` is a shim there that
only checks the package is already installed), with pip offline against a wheelhouse downloaded
on the host for the image's Python and glibc. Finally each image's checks run as the
Dockerfile's USER, with its ENTRYPOINT, on a read-only root filesystem, in a private network
namespace: `gpuplan serve` is the image's CMD itself, probed on /healthz.

Needs root (mmdebstrap --mode=root, chroot, mount and network namespaces) and a Debian/Ubuntu
mirror; caches root filesystems, the Ubuntu keyring and the wheelhouses under
$GPUPLAN_IMAGE_CACHE (default ~/.cache/gpuplan/images), so a warm run downloads nothing.
Run it with `make image-check`; `--list` prints what the Dockerfiles say without building.
"""

from __future__ import annotations

import argparse
import dataclasses
import fcntl
import hashlib
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

# The shell a container runtime starts with when the image sets no PATH of its own (Docker's
# and containerd's default), and HOME for a user without a passwd entry (also their default).
RUNTIME_DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
RUNTIME_DEFAULT_HOME = "/"

# glibc minor version of each release: the newest manylinux_2_N tag its wheels may carry.
GLIBC_MINOR_BY_SUITE = {"bookworm": 36, "trixie": 41, "jammy": 35, "noble": 39}
UBUNTU_SUITE_BY_VERSION = {"22.04": "jammy", "24.04": "noble"}
DEBIAN_MIRROR = "http://deb.debian.org/debian"
DEBIAN_SECURITY_MIRROR = "http://deb.debian.org/debian-security"
UBUNTU_MIRROR = "http://archive.ubuntu.com/ubuntu"
UBUNTU_SECURITY_MIRROR = "http://security.ubuntu.com/ubuntu"
# Debian does not package Ubuntu's archive key; this is jammy's ubuntu-keyring .deb, pinned by
# the sha256 seen on 2026-11-25 (its 2018 key's fingerprint is F6EC B376 2474 EDA9 D21B 7022
# 8719 20D1 991B C93C, Ubuntu's published archive signing key).
UBUNTU_KEYRING_URL = (
    f"{UBUNTU_MIRROR}/pool/main/u/ubuntu-keyring/ubuntu-keyring_2021.03.26_all.deb")
UBUNTU_KEYRING_SHA256 = "0d0e7ed6b112f5d03eabf3c7eb01ebdacf9c57714b279e90495cfc58c8c4520f"
UBUNTU_KEYRING_MEMBER = "etc/apt/trusted.gpg.d/ubuntu-keyring-2018-archive.gpg"


# ---------------------------------------------------------------------------------------------
# Parsing (pure)


@dataclasses.dataclass(frozen=True)
class Instruction:
    """One Dockerfile instruction: keyword upper-cased, the rest of its logical line verbatim."""

    keyword: str
    value: str


@dataclasses.dataclass(frozen=True)
class Dockerfile:
    """What a (single-stage) Dockerfile says, in order, plus the facts read off it."""

    base_image: str
    instructions: tuple[Instruction, ...]
    apt_packages: tuple[str, ...]
    pip_specs: tuple[str, ...]
    user: str
    entrypoint: tuple[str, ...]
    cmd: tuple[str, ...]
    volumes: tuple[str, ...] = ()


@dataclasses.dataclass(frozen=True)
class BaseImage:
    """How to stand in for a base image with distribution packages."""

    distro: str  # "debian" or "ubuntu"
    suite: str
    packages: tuple[str, ...]
    env: tuple[tuple[str, str], ...]
    # The python:* images install Python under /usr/local; a venv there is the stand-in.
    venv_prefix: str | None
    python_version: str | None
    note: str


def logical_lines(text: str) -> Iterator[str]:
    """Join backslash continuations and drop comment lines, as Docker's parser does."""
    parts: list[str] = []
    for raw in text.splitlines():
        line = raw.strip()
        if line.startswith("#") or (not line and parts):
            continue  # comments (even inside a continuation) and blank continuation lines
        if line.endswith("\\"):
            parts.append(line[:-1].strip())
            continue
        parts.append(line)
        joined = " ".join(p for p in parts if p)
        parts = []
        if joined:
            yield joined
    if parts:
        raise ValueError("Dockerfile ends inside a line continuation")


def substitute_args(text: str, args: Mapping[str, str]) -> str:
    """Expand ${NAME} and $NAME from ARG defaults; an unknown name is an error, not empty."""

    def one(match: re.Match[str]) -> str:
        name = match.group(1) or match.group(2)
        if name not in args:
            raise ValueError(f"${name} has no ARG default")
        return args[name]

    return re.sub(r"\$\{(\w+)\}|\$(\w+)", one, text)


def exec_form(value: str) -> tuple[str, ...]:
    """ENTRYPOINT/CMD: JSON exec form as is, shell form wrapped in /bin/sh -c."""
    if value.startswith("["):
        parsed = json.loads(value)
        if not isinstance(parsed, list) or not all(isinstance(p, str) for p in parsed):
            raise ValueError(f"exec form must be a JSON list of strings: {value}")
        return tuple(parsed)
    return ("/bin/sh", "-c", value)


def env_pairs(value: str) -> list[tuple[str, str]]:
    """ENV KEY=VALUE … (or the legacy `ENV KEY VALUE`), values unquoted but not yet expanded."""
    tokens = shlex.split(value, posix=True)
    if tokens and "=" not in tokens[0]:
        return [(tokens[0], value.split(None, 1)[1].strip() if len(tokens) > 1 else "")]
    pairs = []
    for token in tokens:
        key, sep, val = token.partition("=")
        if not sep:
            raise ValueError(f"ENV token without '=': {token}")
        pairs.append((key, val))
    return pairs


def expand_env(value: str, env: Mapping[str, str]) -> str:
    """Docker's ENV expansion: $VAR and ${VAR} from the environment so far, empty if unset."""
    return re.sub(r"\$\{(\w+)\}|\$(\w+)", lambda m: env.get(m.group(1) or m.group(2), ""), value)


def _words(command: str) -> list[str]:
    lexer = shlex.shlex(command, posix=True, punctuation_chars=";&|")
    lexer.whitespace_split = True
    return list(lexer)


def _operands(words: Sequence[str], verb: Sequence[str]) -> list[str]:
    """Non-option words after each occurrence of `verb` (e.g. apt-get install) up to an operator."""
    found: list[str] = []
    n = len(verb)
    for i in range(len(words) - n + 1):
        if list(words[i:i + n]) != list(verb):
            continue
        for word in words[i + n:]:
            if word in {"&&", "||", ";", "|", "&"}:
                break
            if not word.startswith("-"):
                found.append(word)
    return found


def apt_packages(command: str) -> list[str]:
    """Packages a RUN command installs with apt-get/apt install."""
    words = _words(command)
    return _operands(words, ["apt-get", "install"]) + _operands(words, ["apt", "install"])


def pip_specs(command: str) -> list[str]:
    """Requirement specs a RUN command passes to pip install (`python -m pip` too)."""
    return _operands(_words(command), ["pip", "install"])


def parse_dockerfile(text: str) -> Dockerfile:
    """Read a single-stage Dockerfile; refuse what this checker cannot replay faithfully."""
    args: dict[str, str] = {}
    base = ""
    instructions: list[Instruction] = []
    apt: list[str] = []
    pip: list[str] = []
    user = ""
    entrypoint: tuple[str, ...] = ()
    cmd: tuple[str, ...] = ()
    volumes: list[str] = []
    for line in logical_lines(text):
        keyword, _, value = line.partition(" ")
        keyword, value = keyword.upper(), value.strip()
        if keyword == "ARG" and not base:
            name, _, default = value.partition("=")
            args[name.strip()] = default.strip().strip('"')
            continue
        if keyword == "FROM":
            if base:
                raise ValueError("multi-stage Dockerfiles are not supported")
            words = [w for w in value.split() if not w.startswith("--platform=")]
            if len(words) != 1:
                raise ValueError(f"FROM with a stage name or options: {value}")
            base = substitute_args(words[0], args)
            continue
        if not base:
            raise ValueError(f"{keyword} before FROM")
        if keyword in {"ADD", "ONBUILD", "SHELL"}:
            raise ValueError(f"{keyword} is not replayed by image_check.py")
        if keyword == "RUN":
            apt.extend(p for p in apt_packages(value) if p not in apt)
            pip.extend(p for p in pip_specs(value) if p not in pip)
        elif keyword == "USER":
            user = value
        elif keyword == "ENTRYPOINT":
            entrypoint = exec_form(value)
            cmd = ()  # Docker: a later ENTRYPOINT resets an inherited CMD
        elif keyword == "CMD":
            cmd = exec_form(value)
        elif keyword == "VOLUME":
            volumes.extend(exec_form(value) if value.startswith("[") else value.split())
        instructions.append(Instruction(keyword, value))
    if not base:
        raise ValueError("no FROM")
    return Dockerfile(base, tuple(instructions), tuple(apt), tuple(pip), user, entrypoint, cmd,
                      tuple(volumes))


def resolve_base(image: str, apt: Sequence[str]) -> BaseImage:
    """The distribution release and packages standing in for a base image; unknown is an error."""
    name = image.split("@", 1)[0]
    python = re.fullmatch(r"python:(\d+\.\d+)(?:\.\d+)?-slim-(bookworm|trixie)", name)
    if python:
        version, suite = python.groups()
        return BaseImage(
            "debian", suite, ("python3", "python3-venv", "ca-certificates", "netbase", "tzdata"),
            (("PATH", RUNTIME_DEFAULT_PATH), ("LANG", "C.UTF-8")),
            "/usr/local", version,
            f"Debian {suite}'s python3 in a venv at /usr/local for {name}'s python.org build")
    cuda = re.fullmatch(
        r"nvidia/cuda:([\d.]+)-(?:cudnn\d*-)?(?:runtime|devel|base)-ubuntu(\d\d\.\d\d)", name)
    if cuda and cuda.group(2) in UBUNTU_SUITE_BY_VERSION:
        pythons = sorted({m.group(1) for p in apt if (m := re.fullmatch(r"python(\d\.\d+)", p))})
        if len(pythons) != 1:
            raise ValueError(f"{name}: the Dockerfile must apt-get install one pythonX.Y, "
                             f"found {pythons}")
        return BaseImage(
            "ubuntu", UBUNTU_SUITE_BY_VERSION[cuda.group(2)], ("ca-certificates",),
            (("PATH", RUNTIME_DEFAULT_PATH), ("NVIDIA_VISIBLE_DEVICES", "all")),
            None, pythons[0],
            f"Ubuntu {cuda.group(2)} without CUDA {cuda.group(1)}'s libraries (no GPU here; "
            "NVIDIA's apt repository is not needed for the CPU checks)")
    raise ValueError(f"no stand-in for base image {image}; add one to resolve_base")


def apt_sources(base: BaseImage) -> list[str]:
    """One-line apt sources for mmdebstrap: release, updates and security."""
    if base.distro == "debian":
        return [f"deb {DEBIAN_MIRROR} {base.suite} main",
                f"deb {DEBIAN_MIRROR} {base.suite}-updates main",
                f"deb {DEBIAN_SECURITY_MIRROR} {base.suite}-security main"]
    return [f"deb {UBUNTU_MIRROR} {base.suite} main universe",
            f"deb {UBUNTU_MIRROR} {base.suite}-updates main universe",
            f"deb {UBUNTU_SECURITY_MIRROR} {base.suite}-security main universe"]


def manylinux_platforms(glibc_minor: int) -> list[str]:
    """pip --platform values a glibc 2.N x86_64 system accepts (pip does not expand these)."""
    tags = [f"manylinux_2_{m}_x86_64" for m in range(glibc_minor, 4, -1)]
    return [*tags, "manylinux2014_x86_64", "manylinux2010_x86_64", "manylinux1_x86_64"]


def project_spec_extras(spec: str) -> tuple[str, ...] | None:
    """The extras of a `.[a,b]` spec (the project itself), None for any other requirement."""
    match = re.fullmatch(r"\.(?:\[([\w,\s-]*)\])?", spec.strip("'\""))
    if not match:
        return None
    return tuple(e.strip() for e in (match.group(1) or "").split(",") if e.strip())


def without_extras(command: str, dropped: Sequence[str]) -> str:
    """A RUN command with `dropped` extras removed from its `.[…]` specs."""
    if not dropped:
        return command

    def one(match: re.Match[str]) -> str:
        kept = [e.strip() for e in match.group(1).split(",") if e.strip() not in dropped]
        return f".[{','.join(kept)}]" if kept else "."

    return re.sub(r"\.\[([\w,\s-]*)\]", one, command)


def user_spec(user: str) -> str:
    """USER as chroot --userspec wants it; names are refused (the kubelet needs numbers)."""
    uid, _, gid = user.partition(":")
    if not uid.isdigit() or (gid and not gid.isdigit()):
        raise ValueError(f"USER {user!r} must be numeric UID[:GID] (runAsNonRoot needs a number)")
    if uid == "0":
        raise ValueError("USER 0 runs the image as root")
    return f"{uid}:{gid or uid}"


# ---------------------------------------------------------------------------------------------
# The images and what runs inside each


@dataclasses.dataclass(frozen=True)
class Check:
    """A command run inside the image as its USER; `argv` after the ENTRYPOINT when `entry`."""

    name: str
    argv: tuple[str, ...]
    entry: bool = True
    expect: str = ""  # a substring the output must contain


# A tiny ONNX model written inside the image, so `gpuplan estimate` reads a real file.
TINY_MODEL = (
    "import onnx, onnx.helper as h\n"
    "x = h.make_tensor_value_info('x', onnx.TensorProto.FLOAT, ['batch', 64])\n"
    "y = h.make_tensor_value_info('y', onnx.TensorProto.FLOAT, ['batch', 32])\n"
    "w = h.make_tensor('w', onnx.TensorProto.FLOAT, [64, 32], [0.0] * 2048)\n"
    "g = h.make_graph([h.make_node('MatMul', ['x', 'w'], ['y'])], 'tiny', [x], [y], [w])\n"
    "onnx.save(h.make_model(g), '/tmp/tiny.onnx')\n")

COMMON_CHECKS = (
    Check("version", ("--version",), expect="gpuplan "),
    Check("lightgbm imports (libgomp1)", ("python3", "-c",
          "import lightgbm, lightgbm.basic; print('lightgbm', lightgbm.__version__)"),
          entry=False, expect="lightgbm "),
    # On a catalog GPU, so the shipped LightGBM bundle predicts (not only the roofline).
    Check("estimate a tiny ONNX model with the shipped bundle", ("/bin/sh", "-c",
          f"python3 -c {shlex.quote(TINY_MODEL)} && exec gpuplan estimate /tmp/tiny.onnx "
          "--batch 8 --device t4 --device cpu --json"), entry=False,
          expect='"predictor_source": "bundle:'),
)


@dataclasses.dataclass(frozen=True)
class Image:
    """A Dockerfile and the checks its image must pass."""

    dockerfile: str
    checks: tuple[Check, ...]
    # Probe GET /healthz while the image's own ENTRYPOINT+CMD runs.
    serve_cmd: bool
    # `--device cuda` in CMD becomes cpu and the backend onnxruntime, with a tiny budget.
    cpu_bench_from_cmd: bool
    # Extras too heavy to download in CI (torch pulls ~5 GB of CUDA wheels); --with-all adds them.
    heavy_extras: tuple[str, ...] = ()
    # `docker run -e` for the CMD: what a run outside Kubernetes must say.
    cmd_env: tuple[tuple[str, str], ...] = ()


IMAGES = (
    Image("Dockerfile", (
        *COMMON_CHECKS,
        Check("operator --help", ("gpuplan-operator", "--help"), entry=False, expect="usage"),
        Check("extender --help", ("gpuplan-extender", "--help"), entry=False, expect="usage"),
        Check("postgres driver", ("python3", "-c", "import psycopg; print(psycopg.__version__)"),
              entry=False),
    ), serve_cmd=True, cpu_bench_from_cmd=False,
        # tokenreview (the chart's setting) needs a Kubernetes API; the install test covers it.
        cmd_env=(("GPUPLAN_WRITE_AUTH", "none"),)),
    Image("benchmark-jobs/Dockerfile.cuda", (
        *COMMON_CHECKS,
        Check("bench --help", ("bench", "--help"), expect="--sweep"),
        Check("onnxruntime-gpu (CUDA execution provider built in)", ("python3", "-c",
              "import onnxruntime as o; p = o.get_available_providers(); print(p); "
              "assert 'CUDAExecutionProvider' in p, p"),
              entry=False, expect="CUDAExecutionProvider"),
        Check("NVML bindings", ("python3", "-c", "import pynvml; print('pynvml ok')"),
              entry=False, expect="pynvml ok"),
    ), serve_cmd=False, cpu_bench_from_cmd=True, heavy_extras=("torch",)),
)


def cpu_bench_argv(cmd: Sequence[str]) -> tuple[str, ...]:
    """The image's CMD on the CPU: onnxruntime backend, one kernel family, three rows."""
    argv = list(cmd)
    for flag, value in (("--device", "cpu"), ("--backend", "onnxruntime")):
        if flag not in argv:
            raise ValueError(f"CMD {cmd} has no {flag}")
        argv[argv.index(flag) + 1] = value
    return (*argv, "--families", "gemm", "--samples", "3", "--repeats", "1", "--threads", "1",
            "--db", "sqlite:////tmp/bench.db", "--no-progress")


def cmd_port(cmd: Sequence[str]) -> int:
    """The --port a serving CMD listens on."""
    if "--port" not in cmd:
        raise ValueError(f"CMD {cmd} names no --port to probe")
    return int(cmd[list(cmd).index("--port") + 1])


# ---------------------------------------------------------------------------------------------
# Building and running (side effects)


# The CUDA image's root filesystem (without torch) is ~1.5 GB; a tmpfs only when that leaves room.
TMPFS_SIZE = "4g"
TMPFS_MIN_AVAILABLE_BYTES = 6 * 2**30


def mem_available_bytes() -> int:
    """MemAvailable from /proc/meminfo."""
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("/proc/meminfo has no MemAvailable")


def log(message: str) -> None:
    """Progress on stderr with a UTC clock."""
    print(f"[image-check {time.strftime('%H:%M:%S', time.gmtime())}] {message}",
          file=sys.stderr, flush=True)


def digest(*parts: object) -> str:
    """A short stable cache key."""
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:16]


def ubuntu_keyring(cache: Path) -> Path:
    """Ubuntu's archive key, downloaded once and checked against the pinned sha256."""
    key = cache / "keyrings" / "ubuntu-archive-2018.gpg"
    if key.exists():
        return key
    key.parent.mkdir(parents=True, exist_ok=True)
    deb = key.parent / Path(UBUNTU_KEYRING_URL).name
    subprocess.run(["curl", "-fsSL", "-o", str(deb), UBUNTU_KEYRING_URL], check=True)
    got = hashlib.sha256(deb.read_bytes()).hexdigest()
    if got != UBUNTU_KEYRING_SHA256:
        raise RuntimeError(f"{deb}: sha256 {got}, pinned {UBUNTU_KEYRING_SHA256}")
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run(["dpkg-deb", "-x", str(deb), tmp], check=True)
        shutil.copy(Path(tmp) / UBUNTU_KEYRING_MEMBER, key)
    return key


def base_rootfs(cache: Path, base: BaseImage, packages: Sequence[str]) -> Path:
    """mmdebstrap tarball of the release with the base's and the Dockerfile's packages."""
    sources = apt_sources(base)
    wanted = sorted(set(base.packages) | set(packages))
    tarball = cache / "rootfs" / f"{base.suite}-{digest(sources, wanted)}.tar"
    if tarball.exists():
        log(f"rootfs cached: {tarball.name}")
        return tarball
    tarball.parent.mkdir(parents=True, exist_ok=True)
    cmd = ["mmdebstrap", "--mode=root", "--variant=minbase", "--quiet",
           f"--include={','.join(wanted)}",
           "--aptopt=APT::Install-Recommends \"false\""]
    partial = tarball.with_suffix(".partial.tar")
    log(f"mmdebstrap {base.suite} + {', '.join(wanted)}")
    # apt reads the keyring as its sandbox user, who cannot enter /root: hand it a copy in /tmp.
    with tempfile.TemporaryDirectory() as tmp:
        if base.distro == "ubuntu":
            key = Path(tmp) / "ubuntu-archive.gpg"
            shutil.copy(ubuntu_keyring(cache), key)
            Path(tmp).chmod(0o755)
            key.chmod(0o644)
            cmd.append(f"--keyring={key}")
        subprocess.run([*cmd, base.suite, str(partial), *sources], check=True)
    partial.rename(tarball)
    return tarball


def build_requires() -> list[str]:
    """The project's [build-system] requires (pip builds `.` offline in the image)."""
    import tomllib

    data = tomllib.loads((REPO / "pyproject.toml").read_text())
    return list(data["build-system"]["requires"])


def wheelhouse(cache: Path, specs: Sequence[str], python: str, glibc_minor: int) -> Path:
    """Wheels for the image's Python and glibc, downloaded on the host once per input set."""
    pyproject = (REPO / "pyproject.toml").read_text()
    requirements: list[str] = []
    for spec in specs:
        extras = project_spec_extras(spec)
        if extras is None:
            requirements.append(spec.strip("'\""))
        else:
            requirements.append(f"{REPO}[{','.join(extras)}]" if extras else str(REPO))
    requirements.extend(build_requires())
    house = cache / "wheels" / digest(pyproject, sorted(specs), python, glibc_minor)
    if (house / ".complete").exists():
        log(f"wheelhouse cached: {house.name} ({len(list(house.glob('*.whl')))} wheels)")
        return house
    house.mkdir(parents=True, exist_ok=True)
    log(f"pip download for cp{python.replace('.', '')} glibc 2.{glibc_minor}: {requirements}")
    platforms = [arg for p in manylinux_platforms(glibc_minor) for arg in ("--platform", p)]
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_FIND_LINKS")}
    subprocess.run(
        [sys.executable, "-m", "pip", "download", "--quiet", "--dest", str(house),
         "--only-binary=:all:", "--python-version", python, "--implementation", "cp",
         "--abi", f"cp{python.replace('.', '')}", *platforms, *requirements],
        check=True, env=env, cwd=cache)
    for built in house.glob("gpuplan-*"):
        built.unlink()  # the image builds the project from its copied sources, as docker would
    (house / ".complete").touch()
    return house


APT_SHIM = """#!/bin/sh
# image_check.py: packages were installed by mmdebstrap; check, don't download.
set -e
case "$*" in *install*) ;; *) exit 0 ;; esac
for p in "$@"; do
  case "$p" in -*|install|apt-get|apt) continue ;; esac
  dpkg-query -W -f='${Status}\\n' "$p" 2>/dev/null | grep -q 'install ok installed' \\
    || { echo "image-check: $p is not in the root filesystem" >&2; exit 100; }
done
"""


@dataclasses.dataclass
class Container:
    """An extracted root filesystem and the runtime state the Dockerfile has built up."""

    root: Path
    env: dict[str, str]
    workdir: str = "/"
    user: str = "0:0"
    # VOLUME paths: writable (a fresh tmpfs owned like the image's directory) on a read-only root.
    volumes: tuple[str, ...] = ()

    def script(self, argv: Sequence[str], *, read_only: bool, user: str | None = None,
               binds: Mapping[str, Path] | None = None, body: str | None = None) -> list[str]:
        """unshare argv: private mount and network namespaces, /proc, /dev, tmpfs /tmp, chroot."""
        r = shlex.quote(str(self.root))
        lines = ["set -e", f"mount --bind {r} {r}", f"mount -t proc proc {r}/proc",
                 f"mount --rbind /dev {r}/dev", f"mount -t tmpfs -o mode=1777 tmpfs {r}/tmp"]
        for target, source in (binds or {}).items():
            lines.append(f"mkdir -p {r}{target} && mount --bind -o ro {source} {r}{target}")
        home = self.env.get("HOME", RUNTIME_DEFAULT_HOME)
        if read_only:
            lines.append(f"mount -o remount,ro,bind {r}")
            if home != "/":  # the benchmark Job mounts an emptyDir there
                lines.append(f"mount -t tmpfs -o mode=1777 tmpfs {r}{shlex.quote(home)}")
            for volume in self.volumes:
                path = self.root / volume.lstrip("/")
                st = path.stat()
                lines.append(f"mount -t tmpfs -o mode={st.st_mode & 0o7777:o},uid={st.st_uid},"
                             f"gid={st.st_gid} tmpfs {shlex.quote(str(path))}")
        lines.append("ip link set lo up")
        env = {"HOME": home, **self.env}
        run = ["chroot", f"--userspec={user or self.user}", str(self.root), "/usr/bin/env", "-i",
               *(f"{k}={v}" for k, v in env.items()),
               "/bin/sh", "-c", 'cd "$0" && exec "$@"', self.workdir]
        lines.append("img() { " + " ".join(shlex.quote(a) for a in run) + ' "$@"; }')
        lines.append(body if body is not None else
                     "img " + " ".join(shlex.quote(a) for a in argv))
        # A PID namespace too: when this shell (its init) exits, the kernel kills what is left.
        return ["unshare", "--mount", "--net", "--pid", "--fork", "--", "/bin/sh", "-c",
                "\n".join(lines)]


def replay(df: Dockerfile, base: BaseImage, tarball: Path, house: Path, work: Path,
           dropped_extras: Sequence[str]) -> Container:
    """Extract the base and replay ENV/WORKDIR/COPY/RUN/USER in order, offline."""
    root = work / "rootfs"
    root.mkdir()
    subprocess.run(["tar", "-xf", str(tarball), "-C", str(root)], check=True)
    box = Container(root, dict(base.env))
    if base.venv_prefix:
        subprocess.run(box.script(["python3", "-m", "venv", base.venv_prefix], read_only=False),
                       check=True)
    shim_dir = root / ".image-check"
    shim_dir.mkdir()
    for name in ("apt-get", "apt"):
        (shim_dir / name).write_text(APT_SHIM)
        (shim_dir / name).chmod(0o755)
    for ins in df.instructions:
        if ins.keyword == "ENV":
            for key, value in env_pairs(ins.value):
                box.env[key] = expand_env(value, box.env)
        elif ins.keyword == "WORKDIR":
            box.workdir = expand_env(ins.value, box.env)
            (root / box.workdir.lstrip("/")).mkdir(parents=True, exist_ok=True)
        elif ins.keyword == "COPY":
            copy_into(root, box.workdir, ins.value)
        elif ins.keyword == "USER":
            box.user = user_spec(ins.value)
        elif ins.keyword == "RUN":
            # BuildKit recreates a WORKDIR that an earlier RUN deleted (both images remove /src).
            (root / box.workdir.lstrip("/")).mkdir(parents=True, exist_ok=True)
            command = without_extras(ins.value, dropped_extras)
            log(f"RUN {command[:100]}{'…' if len(command) > 100 else ''}")
            build_env = {**box.env, "PATH": f"/.image-check:{box.env.get('PATH', '')}",
                         "PIP_NO_INDEX": "1", "PIP_FIND_LINKS": "/.wheelhouse",
                         "DEBIAN_FRONTEND": "noninteractive"}
            runner = Container(root, build_env, box.workdir, box.user)
            subprocess.run(runner.script(["/bin/sh", "-c", command], read_only=False,
                                         binds={"/.wheelhouse": house}), check=True)
        elif ins.keyword == "VOLUME":
            box.volumes = df.volumes
            for volume in df.volumes:
                (root / volume.lstrip("/")).mkdir(parents=True, exist_ok=True)
        elif ins.keyword in {"ENTRYPOINT", "CMD", "LABEL", "EXPOSE", "STOPSIGNAL",
                             "HEALTHCHECK"}:
            continue
        else:
            raise ValueError(f"{ins.keyword} is not replayed by image_check.py")
    shutil.rmtree(shim_dir)
    (root / ".wheelhouse").rmdir()
    # So does a container runtime when the container starts.
    (root / box.workdir.lstrip("/")).mkdir(parents=True, exist_ok=True)
    return box


def copy_into(root: Path, workdir: str, value: str) -> None:
    """COPY src… dest from the repo (the build context); directories copy their contents."""
    words = [w for w in value.split() if not w.startswith("--")]
    *sources, dest = words
    target = Path(dest if dest.startswith("/") else f"{workdir}/{dest}")
    into_dir = dest.endswith("/") or len(sources) > 1
    for source in sources:
        src = REPO / source
        if not src.exists():
            raise FileNotFoundError(f"COPY {source}: not in the build context")
        out = root / target.relative_to("/")
        if src.is_dir():
            shutil.copytree(src, out, dirs_exist_ok=True,
                            ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info"))
        else:
            if into_dir:
                out.mkdir(parents=True, exist_ok=True)
                out = out / src.name
            out.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, out)


def run_check(box: Container, entrypoint: Sequence[str], check: Check) -> tuple[bool, str]:
    """One check as the image's USER on a read-only root; (passed, output tail)."""
    argv = [*entrypoint, *check.argv] if check.entry else list(check.argv)
    started = time.monotonic()
    proc = subprocess.run(box.script(argv, read_only=True), capture_output=True, text=True,
                          timeout=300)
    out = (proc.stdout + proc.stderr).strip()
    ok = proc.returncode == 0 and check.expect in out
    log(f"{check.name}: exit {proc.returncode} in {time.monotonic() - started:.1f} s")
    return ok, out[-600:]


def serve_check(box: Container, argv: Sequence[str], port: int) -> tuple[bool, str]:
    """Start the image's ENTRYPOINT+CMD, poll GET /healthz on its port like a kubelet, stop it."""
    probe = (
        "import os, sys, time, urllib.request\n"
        f"url = 'http://127.0.0.1:{port}/healthz'\n"
        "server = int(sys.argv[1])\n"
        "deadline = time.monotonic() + 120\n"
        "while True:\n"
        "    try:\n"
        "        body = urllib.request.urlopen(url, timeout=2).read().decode()\n"
        "        print('healthz 200', body); break\n"
        "    except OSError as exc:\n"
        "        try:\n"
        "            os.kill(server, 0)\n"
        "        except ProcessLookupError:\n"
        "            raise SystemExit(f'the server exited before answering /healthz: {exc}')\n"
        "        except PermissionError:\n"
        "            pass  # alive, another user's process\n"
        "        if time.monotonic() > deadline: raise SystemExit(f'no /healthz: {exc}')\n"
        "        time.sleep(0.5)\n")
    log_file = shlex.quote(f"{box.root}/tmp/serve.log")  # the image's tmpfs /tmp
    proc_dir = shlex.quote(f"{box.root}/proc")  # this PID namespace's /proc
    uid = box.user.split(":")[0]
    body = "\n".join([
        "img " + " ".join(shlex.quote(a) for a in argv) + f" >{log_file} 2>&1 &",
        "pid=$!",
        "set +e",
        f"img python3 -c {shlex.quote(probe)} $pid",
        "rc=$?",
        # SIGTERM to every process as the kubelet sends it (kill -1 spares this shell, the
        # namespace's init); whatever still runs 20 s later dies with the namespace.
        "kill -TERM -1 2>/dev/null",
        "i=0",
        f"while grep -qs '^Uid:[[:space:]]*{uid}[[:space:]]' {proc_dir}/[0-9]*/status"
        " && [ $i -lt 40 ]; do sleep 0.5; i=$((i+1)); done",
        "echo \"server processes gone $((i / 2)) s after SIGTERM (at most 20)\"",
        f"tail -n 15 {log_file}",
        "exit $rc"])
    started = time.monotonic()
    proc = subprocess.run(box.script([], read_only=True, body=body), capture_output=True,
                          text=True, timeout=300)
    out = (proc.stdout + proc.stderr).strip()
    gone = [line for line in out.splitlines() if line.startswith(("healthz", "server processes"))]
    log(f"serve: exit {proc.returncode} in {time.monotonic() - started:.1f} s; {gone}")
    return proc.returncode == 0 and "healthz 200" in out, out[-800:]


def check_image(image: Image, cache: Path, with_all: bool,
                keep: bool) -> list[tuple[str, bool, str]]:
    """Build one image's root filesystem and run its checks; (name, passed, output) each."""
    df = parse_dockerfile((REPO / image.dockerfile).read_text())
    base = resolve_base(df.base_image, df.apt_packages)
    if not base.python_version:
        raise ValueError(f"{image.dockerfile}: no Python version to target")
    dropped = () if with_all else image.heavy_extras
    log(f"{image.dockerfile}: FROM {df.base_image} -> {base.note}; USER {df.user}; "
        f"apt {list(df.apt_packages)}; pip {list(df.pip_specs)}"
        + (f"; without extras {list(dropped)}" if dropped else ""))
    specs = [without_extras(s, dropped) for s in df.pip_specs]
    tarball = base_rootfs(cache, base, df.apt_packages)
    house = wheelhouse(cache, specs, base.python_version, GLIBC_MINOR_BY_SUITE[base.suite])
    (cache / "work").mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="image-", dir=cache / "work"))
    in_memory = not keep and mem_available_bytes() >= TMPFS_MIN_AVAILABLE_BYTES
    if in_memory:  # unpacking and deleting ~1 GB of small files on disk took ~1 min per image
        subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={TMPFS_SIZE}", "tmpfs", str(work)],
                       check=True)
    log(f"root filesystem in {'a tmpfs' if in_memory else 'the disk cache'} at {work}")
    results: list[tuple[str, bool, str]] = []
    try:
        box = replay(df, base, tarball, house, work, dropped)
        got = subprocess.run(box.script(["python3", "-c", "import platform as p; "
                                         "print(p.python_version())"], read_only=True),
                             capture_output=True, text=True)
        full = got.stdout.strip()
        results.append((f"python3 is {base.python_version} ({full})",
                        full.startswith(f"{base.python_version}."), got.stdout + got.stderr))
        if not df.user:
            results.append(("USER set", False, "the image runs as root"))
        log("root filesystem built; running the checks")
        for check in image.checks:
            ok, out = run_check(box, df.entrypoint, check)
            results.append((check.name, ok, out))
        if image.serve_cmd:
            argv = [*df.entrypoint, *df.cmd]
            served = dataclasses.replace(box, env={**box.env, **dict(image.cmd_env)})
            ok, out = serve_check(served, argv, cmd_port(df.cmd))
            results.append((f"CMD {' '.join(argv)} answers /healthz", ok, out))
        if image.cpu_bench_from_cmd:
            argv = [*df.entrypoint, *cpu_bench_argv(df.cmd)]
            ok, out = run_check(box, (), Check("cpu bench", tuple(argv), entry=False))
            results.append((f"CMD on the CPU: {' '.join(argv)}", ok, out))
    finally:
        if keep:
            log(f"kept {work}")
        else:
            if in_memory:
                subprocess.run(["umount", str(work)], check=True)
            shutil.rmtree(work, ignore_errors=True)
    return results


def main(argv: Sequence[str] | None = None) -> int:
    """CLI: check every image (or those named), print a pass/fail line per check."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("dockerfiles", nargs="*", help="limit to these (default: all in IMAGES)")
    parser.add_argument("--cache", type=Path, default=Path(os.environ.get(
        "GPUPLAN_IMAGE_CACHE", Path.home() / ".cache" / "gpuplan" / "images")))
    parser.add_argument("--with-all", action="store_true",
                        help="also install heavy extras (torch: ~5 GB of CUDA wheels)")
    parser.add_argument("--keep", action="store_true",
                        help="keep the root filesystems (until the next run)")
    parser.add_argument("--list", action="store_true",
                        help="print what each Dockerfile says and exit (no root needed)")
    args = parser.parse_args(argv)
    images = [i for i in IMAGES if not args.dockerfiles or i.dockerfile in args.dockerfiles]
    if args.list:
        for image in images:
            df = parse_dockerfile((REPO / image.dockerfile).read_text())
            base = resolve_base(df.base_image, df.apt_packages)
            print(json.dumps({"dockerfile": image.dockerfile, "base": df.base_image,
                              "suite": base.suite, "python": base.python_version,
                              "apt": df.apt_packages, "pip": df.pip_specs, "user": df.user,
                              "entrypoint": df.entrypoint, "cmd": df.cmd}, indent=1))
        return 0
    if os.geteuid() != 0:
        print("image-check needs root (mmdebstrap --mode=root, chroot, mount namespaces)",
              file=sys.stderr)
        return 2
    for tool in ("mmdebstrap", "unshare", "chroot", "ip", "curl", "dpkg-deb"):
        if not shutil.which(tool):
            print(f"image-check needs {tool} (apt-get install mmdebstrap iproute2 curl)",
                  file=sys.stderr)
            return 2
    args.cache.mkdir(parents=True, exist_ok=True)
    lock = (args.cache / ".lock").open("w")
    fcntl.flock(lock, fcntl.LOCK_EX)  # one run per cache: a second waits, then cleans up below
    for stale in (args.cache / "work").glob("image-*"):  # left by a killed run
        if os.path.ismount(stale):
            subprocess.run(["umount", "--lazy", str(stale)], check=True)
        shutil.rmtree(stale, ignore_errors=True)
    failed = 0
    for image in images:
        started = time.monotonic()
        results = check_image(image, args.cache, args.with_all, args.keep)
        for name, ok, out in results:
            print(f"{'PASS' if ok else 'FAIL'}  {image.dockerfile}: {name}")
            if not ok:
                failed += 1
                print("      " + out.replace("\n", "\n      "))
        log(f"{image.dockerfile}: {time.monotonic() - started:.0f} s")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
