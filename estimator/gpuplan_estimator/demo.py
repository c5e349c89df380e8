"""`gpuplan demo` (what `make demo` runs): two shipped models estimated on every catalog GPU.

- ResNet-50: the structure-only "light" model that ships inside the onnx wheel
  (`onnx/backend/test/data/light/light_resnet50.onnx`), re-batched from its fixed batch of 1.
- GPT-2 medium: built by `zoo` from the HuggingFace config in `data/model_configs/gpt2_med.json`.
"""

from __future__ import annotations

import argparse
import importlib.util
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpuplan_estimator import cli, devices, estimate, graph, render
from gpuplan_estimator.errors import InvalidModelError
from gpuplan_estimator.layers import ModelGraph
from gpuplan_estimator.training_step import TrainingSettings

CONFIG_DIR = Path(__file__).resolve().parent / "data" / "model_configs"
GPT2_CONFIG = CONFIG_DIR / "gpt2_med.json"


@dataclass(frozen=True)
class DemoCase:
    title: str
    settings: TrainingSettings
    epochs: int
    dataset_size: int


# ImageNet-1k has 1,281,167 training images; 90 epochs is the classic ResNet-50 schedule.
RESNET = DemoCase("ResNet-50 (ImageNet, 90 epochs)",
                  TrainingSettings(batch_size=32, optimizer="momentum", precision="fp32"),
                  epochs=90, dataset_size=1_281_167)
# OpenWebText is ~9 B tokens ≈ 8.8 M sequences of 1024; one epoch.
GPT2 = DemoCase("GPT-2 medium (seq 1024, 1 epoch of OpenWebText-sized data)",
                TrainingSettings(batch_size=8, optimizer="adamw", precision="bf16"),
                epochs=1, dataset_size=8_800_000)
GPT2_SEQUENCE = 1024


def light_resnet50_path() -> Path:
    spec = importlib.util.find_spec("onnx")
    if spec is None or spec.origin is None:
        raise InvalidModelError("the onnx package is not installed")
    path = Path(spec.origin).parent / "backend" / "test" / "data" / "light" / "light_resnet50.onnx"
    if not path.is_file():
        raise InvalidModelError(f"{path}: the onnx wheel does not ship light_resnet50.onnx")
    return path


def resnet50(batch: int) -> ModelGraph:
    data = graph.symbolic_batch(light_resnet50_path().read_bytes())
    return graph.load_model(data, batch=batch, name="resnet50")


def gpt2_medium(batch: int) -> ModelGraph:
    from gpuplan_estimator import zoo

    model = zoo.build_transformer(zoo.load_hf_config(GPT2_CONFIG), name="gpt2-medium")
    return graph.load_model(model.SerializeToString(), batch=batch,
                            dim_bindings={"sequence": GPT2_SEQUENCE}, name="gpt2-medium")


def register(sub: Any) -> None:
    p = sub.add_parser("demo", help="estimate ResNet-50 and GPT-2 medium on every catalog GPU")
    p.add_argument("--device", action="append", default=[], metavar="D",
                   help="limit to these devices (default: every catalog GPU)")
    p.set_defaults(func=run_demo)


def run_demo(args: argparse.Namespace) -> int:
    specs = cli.resolve_devices(args.device)
    predictor, source = cli.select_predictor(None)
    for case, build in ((RESNET, resnet50), (GPT2, gpt2_medium)):
        g = build(case.settings.batch_size)
        results = estimate.estimate(g, specs, case.settings, predictor=predictor,
                                    epochs=case.epochs, dataset_size=case.dataset_size)
        print(f"== {case.title}")
        print(render.header(g, case.settings, source))
        print(render.table(results))
        fastest = min((r for r in results if r.fits), key=lambda r: r.step_time_ms,
                      default=None)
        if fastest is not None:
            print()
            print(render.device_detail(fastest))
        print()
    print(f"{len(specs)} devices from {devices.DEFAULT_CATALOG_PATH.name}; times are for one GPU."
          " Try: gpuplan estimate MODEL.onnx --batch N --device h100-sxm-80gb")
    return 0
