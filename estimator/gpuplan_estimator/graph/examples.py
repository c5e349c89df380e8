"""Example models shipped with gpuplan (the demo's and the speed benchmark's).

- ResNet-50: the structure-only "light" model that ships inside the onnx wheel
  (`onnx/backend/test/data/light/light_resnet50.onnx`), re-batched from its fixed batch of 1.
- GPT-2 medium: built by `zoo` from the HuggingFace config in `data/model_configs/gpt2_med.json`.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

from gpuplan_estimator.core import paths
from gpuplan_estimator.core.errors import InvalidModelError
from gpuplan_estimator.core.layers import ModelGraph
from gpuplan_estimator.core.vocabulary import SEQUENCE_DIM
from gpuplan_estimator.graph import batching, loading, zoo

CONFIG_DIR = paths.PACKAGE_DATA_DIR / "model_configs"
GPT2_CONFIG = CONFIG_DIR / "gpt2_med.json"
GPT2_SEQUENCE = 1024


def light_resnet50_path() -> Path:
    """ONNX's structure-only ResNet-50 shipped in the onnx wheel (fixed batch 1)."""
    spec = importlib.util.find_spec("onnx")
    if spec is None or spec.origin is None:
        raise InvalidModelError("the onnx package is not installed")
    path = Path(spec.origin).parent / "backend" / "test" / "data" / "light" / "light_resnet50.onnx"
    if not path.is_file():
        raise InvalidModelError(f"{path}: the onnx wheel does not ship light_resnet50.onnx")
    return path


def resnet50(batch: int) -> ModelGraph:
    """ResNet-50 (ONNX's light model, re-batched) at `batch`."""
    data = batching.symbolic_batch(light_resnet50_path().read_bytes())
    return loading.load_model(data, batch=batch, name="resnet50")


def gpt2_medium(batch: int) -> ModelGraph:
    """GPT-2 medium built by `zoo` from its HuggingFace config, sequence 1024, at `batch`."""
    model = zoo.build_transformer(zoo.load_hf_config(GPT2_CONFIG), name="gpt2-medium")
    return loading.load_model(model.SerializeToString(), batch=batch,
                            dim_bindings={SEQUENCE_DIM: GPT2_SEQUENCE}, name="gpt2-medium")
