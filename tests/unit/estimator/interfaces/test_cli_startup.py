"""What `gpuplan` imports before it knows the command (#34): none of the heavy packages that
only some commands need. Each is imported where it is used: LightGBM (with pandas and
scipy.sparse behind it) when a bundle model is first read, scipy.optimize by the fits, pydantic
when a price book or user catalog is read, the service's wire models by a named layout or plan.
"""

from __future__ import annotations

import subprocess
import sys

DEFERRED = ("lightgbm", "pandas", "scipy.optimize", "scipy.sparse", "pydantic",
            "gpuplan_estimator.interfaces.http.wire", "sqlalchemy", "onnxruntime", "torch")


def test_the_cli_start_up_imports_none_of_the_deferred_packages() -> None:
    probe = ("import sys; import gpuplan_estimator.interfaces.cli.main; "
             f"print(sorted(m for m in {DEFERRED!r} if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                         check=True, timeout=60)
    assert out.stdout.strip() == "[]"


def test_the_probe_sees_an_imported_package() -> None:
    """The check above can fail: a module the CLI imports is listed."""
    probe = ("import sys; import gpuplan_estimator.interfaces.cli.main; "
             "print(sorted(m for m in ('onnx', 'numpy') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                         check=True, timeout=60)
    assert out.stdout.strip() == "['numpy', 'onnx']"


def test_reading_a_bundle_model_leaves_pandas_out_and_importable() -> None:
    """LightGBM comes in without its pandas support (`regressors.lightgbm_module`): reading
    and running a shipped model imports no pandas, and pandas still imports afterwards. With
    pandas loaded first, LightGBM keeps its pandas support."""
    probe = (
        "import sys, numpy as np; from gpuplan_estimator.latency import bundles; "
        "b = bundles.load_bundle(bundles.SHIPPED_BUNDLE); kernel = next(iter(b.models)); "
        "m = b.models[kernel]; m.predict(np.zeros((2, m.n_features_in_))); "
        "print('pandas' in sys.modules, 'lightgbm' in sys.modules); import pandas; "
        "import lightgbm.compat as c; print(c.PANDAS_INSTALLED, sys.modules['pandas'] is pandas)")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                         check=True, timeout=60)
    assert out.stdout.split() == ["False", "True", "False", "True"]
    first = ("import sys, pandas; from gpuplan_estimator.latency import regressors; "
             "print(regressors.lightgbm_module().compat.PANDAS_INSTALLED)")
    out = subprocess.run([sys.executable, "-c", first], capture_output=True, text=True,
                         check=True, timeout=60)
    assert out.stdout.strip() == "True"
