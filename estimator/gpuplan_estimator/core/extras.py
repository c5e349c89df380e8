"""Optional dependencies: which `pip install 'gpuplan[EXTRA]'` brings each importable module.

`EXTRAS` is the one source of the map; `tests/unit/test_packaging.py` checks it against
pyproject.toml's `[project.optional-dependencies]`. The core install runs `gpuplan estimate`,
`plan`, `strip`, `devices` and `demo`; anything else imports its packages through `require` (or
turns a failed import into `missing`) so a user without them reads which extra to install (#20).
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from types import MappingProxyType, ModuleType

from gpuplan_estimator.core.errors import GpuplanError

# extra -> {distribution on PyPI: top-level module it installs}. The distributions are spelled
# as in pyproject.toml, which the packaging test compares (case-insensitively).
EXTRAS: Mapping[str, Mapping[str, str]] = MappingProxyType({
    # `gpuplan bench`, `import`, `train`, `models-report`, `eval`: the performance database
    # (SQLAlchemy + Alembic, frames in pandas, Parquet import), onnxruntime timing, NVML clocks.
    "bench": MappingProxyType({
        "onnxruntime": "onnxruntime", "pandas": "pandas", "pyarrow": "pyarrow",
        "SQLAlchemy": "sqlalchemy", "alembic": "alembic", "nvidia-ml-py": "pynvml",
    }),
    # `gpuplan serve`: the HTTP service, its worker processes and metrics; job outcomes go to
    # the performance database (pandas frames).
    "serve": MappingProxyType({
        "aiohttp": "aiohttp", "pebble": "pebble", "prometheus-client": "prometheus_client",
        "SQLAlchemy": "sqlalchemy", "alembic": "alembic", "pandas": "pandas",
    }),
    # `gpuplan-operator` and `gpuplan-extender`.
    "operator": MappingProxyType({
        "kopf": "kopf", "kubernetes": "kubernetes", "aiohttp": "aiohttp",
        "prometheus-client": "prometheus_client",
    }),
    # `--backend torch`, the eval's CPU training step, models built in-process (`--torch`,
    # `--hf-config` for architectures `zoo` lacks).
    "torch": MappingProxyType({
        "torch": "torch", "onnx2torch": "onnx2torch", "transformers": "transformers",
        "onnxscript": "onnxscript",
    }),
    # A PostgreSQL performance database (`postgresql+psycopg://` URLs).
    "postgres": MappingProxyType({"psycopg": "psycopg"}),
    # Pictures: `gpuplan eval`'s accuracy plot, `--plot`.
    "plot": MappingProxyType({"matplotlib": "matplotlib"}),
})


class MissingExtraError(GpuplanError, ImportError):
    """An optional package is not installed; the message names the extra that brings it.

    An ImportError too, so callers that map import failures (exit code "unavailable") see it.
    """


def extra_modules(extra: str) -> frozenset[str]:
    """The top-level modules `extra` installs; an unknown extra is a programming error."""
    if extra not in EXTRAS:
        raise KeyError(f"no extra {extra!r} in core.extras.EXTRAS: {', '.join(EXTRAS)}")
    return frozenset(EXTRAS[extra].values())


def hint(extra: str) -> str:
    """The install command for `extra`, as the error messages print it."""
    extra_modules(extra)  # validates the name
    return f"pip install 'gpuplan[{extra}]'"


def missing(exc: ImportError, extra: str, *, needed_by: str) -> ImportError:
    """`exc` as a `MissingExtraError` when the module it failed on belongs to `extra`;
    otherwise `exc` itself (a module of ours that fails to import is a bug, not an extra).

    Use as ``except ImportError as exc: raise extras.missing(exc, "bench", needed_by=...)``.
    """
    top = (exc.name or "").partition(".")[0]
    if top not in extra_modules(extra):
        return exc
    error = MissingExtraError(f"{needed_by} needs the {top!r} package, which is not installed: "
                              f"{hint(extra)}")
    error.name = exc.name
    return error


def require(module: str, extra: str, *, needed_by: str) -> ModuleType:
    """Import `module` (one that `extra` installs, or a submodule of one), or raise
    `MissingExtraError` naming the extra."""
    if module.partition(".")[0] not in extra_modules(extra):
        raise KeyError(f"{module!r} is not installed by the {extra!r} extra")
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise missing(exc, extra, needed_by=needed_by) from exc
