"""The real-model corpus: torchvision and Hugging Face models exported the ways users export them.

Each case builds an `nn.Module` from a config (small for the tests, full-size for `make corpus`),
exports it with every exporter this environment has, and writes a structure-only graph (weights
as `ConstantOfShape` of their shape, the convention of ONNX's light models). Nothing is
downloaded and no weights are needed: dynamo exports run on the meta device.

The reference FLOP count of each case is independent of ONNX: PyTorch's own `FlopCounterMode`
over a CPU forward where that is cheap, else the closed-form count for decoder transformers
(2 FLOPs per weight per token, plus the two attention GEMMs).

`python -m campaigns.corpus --size full` prints the corpus table for the closing note.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import onnx

from gpuplan_estimator.graph import exporting

SIZES = ("small", "full")


@dataclasses.dataclass(frozen=True)
class Case:
    """One model: how to build it at a size, its example input, and what it is."""

    name: str
    kind: str  # "vision" | "decoder" | "encoder" | "encoder-decoder"
    build: Callable[[str], Any]  # size → nn.Module
    example: Callable[[str], tuple[Any, ...]]  # size → example args (CPU tensors)
    batch: int


def _torch() -> Any:
    import torch

    return torch


def _transformers() -> Any:
    import transformers

    return transformers


def _vision(arch: str, small_kwargs: dict[str, Any]) -> Case:
    def build(size: str) -> Any:
        import torchvision

        if size == "full":
            return getattr(torchvision.models, arch)()
        if arch == "vit_b_16":  # the named builder fixes patch and width: build the class
            return torchvision.models.VisionTransformer(**small_kwargs)
        return getattr(torchvision.models, arch)(**small_kwargs)

    def example(size: str) -> tuple[Any, ...]:
        side = small_kwargs.get("image_size", 64) if size == "small" else 224
        return (_torch().zeros((2, 3, side, side)),)

    return Case(arch, "vision", build, example, batch=2)


SEQUENCE = {"small": 16, "full": 128}
TEXT_BATCH = 2


def _ids(size: str) -> tuple[Any, ...]:
    return (_torch().zeros((TEXT_BATCH, SEQUENCE[size]), dtype=_torch().long),)


def _hf(name: str, kind: str, model_class: str, config_class: str, small: dict[str, Any],
        full: dict[str, Any], example: Callable[[str], tuple[Any, ...]] = _ids) -> Case:
    def build(size: str) -> Any:
        tf = _transformers()
        config = getattr(tf, config_class)(**(small if size == "small" else full))
        config.use_cache = False
        return getattr(tf, model_class)(config)

    return Case(name, kind, build, example, batch=TEXT_BATCH)


def _pixels(size: str) -> tuple[Any, ...]:
    side = 32 if size == "small" else 224
    return (_torch().zeros((TEXT_BATCH, 3, side, side)),)


def _features(size: str) -> tuple[Any, ...]:
    frames = 64 if size == "small" else 3000
    mels = 16 if size == "small" else 80
    return (_torch().zeros((TEXT_BATCH, mels, frames)),)


def _t5_inputs(size: str) -> tuple[Any, ...]:
    ids = _ids(size)[0]
    return (ids, None, ids)  # input_ids, attention_mask, decoder_input_ids


_SMALL_LM = {"vocab_size": 128}
CASES: tuple[Case, ...] = (
    _vision("resnet50", {"num_classes": 10}),
    _vision("mobilenet_v3_large", {"num_classes": 10}),
    _vision("efficientnet_b0", {"num_classes": 10}),
    _vision("convnext_tiny", {"num_classes": 10}),
    _vision("vit_b_16", {"image_size": 32, "patch_size": 8, "num_layers": 2, "num_heads": 2,
                         "hidden_dim": 64, "mlp_dim": 128, "num_classes": 10}),
    _hf("gpt2", "decoder", "GPT2LMHeadModel", "GPT2Config",
        {**_SMALL_LM, "n_embd": 64, "n_head": 4, "n_layer": 2, "n_positions": 64},
        {"n_embd": 1280, "n_head": 20, "n_layer": 36}),  # GPT-2 large
    _hf("gpt-neo", "decoder", "GPTNeoForCausalLM", "GPTNeoConfig",
        {**_SMALL_LM, "hidden_size": 64, "num_heads": 4, "num_layers": 2,
         "attention_types": [[["global", "local"], 1]], "max_position_embeddings": 64},
        {"hidden_size": 2048, "num_heads": 16, "num_layers": 24,
         "attention_types": [[["global", "local"], 12]]}),  # GPT-Neo 1.3B
    _hf("opt", "decoder", "OPTForCausalLM", "OPTConfig",
        {**_SMALL_LM, "hidden_size": 64, "num_attention_heads": 4, "num_hidden_layers": 2,
         "ffn_dim": 256, "max_position_embeddings": 64, "word_embed_proj_dim": 64},
        {"hidden_size": 2048, "num_attention_heads": 32, "num_hidden_layers": 24,
         "ffn_dim": 8192, "word_embed_proj_dim": 2048}),  # OPT-1.3B
    _hf("llama", "decoder", "LlamaForCausalLM", "LlamaConfig",
        {**_SMALL_LM, "hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2,
         "num_hidden_layers": 2, "intermediate_size": 160, "max_position_embeddings": 64},
        {"hidden_size": 4096, "num_attention_heads": 32, "num_hidden_layers": 32,
         "intermediate_size": 11008, "vocab_size": 32000}),  # Llama-2 7B
    _hf("mistral", "decoder", "MistralForCausalLM", "MistralConfig",
        {**_SMALL_LM, "hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2,
         "num_hidden_layers": 2, "intermediate_size": 160, "max_position_embeddings": 64},
        {"hidden_size": 4096, "num_attention_heads": 32, "num_key_value_heads": 8,
         "num_hidden_layers": 32, "intermediate_size": 14336, "vocab_size": 32000}),
    _hf("mixtral", "decoder", "MixtralForCausalLM", "MixtralConfig",
        {**_SMALL_LM, "hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2,
         "num_hidden_layers": 2, "intermediate_size": 160, "max_position_embeddings": 64,
         "num_local_experts": 2, "num_experts_per_tok": 2},
        {"hidden_size": 4096, "num_attention_heads": 32, "num_key_value_heads": 8,
         "num_hidden_layers": 4, "intermediate_size": 14336, "vocab_size": 32000,
         "num_local_experts": 2, "num_experts_per_tok": 2}),
    _hf("bert", "encoder", "BertForMaskedLM", "BertConfig",
        {**_SMALL_LM, "hidden_size": 64, "num_attention_heads": 4, "num_hidden_layers": 2,
         "intermediate_size": 256, "max_position_embeddings": 64},
        {"hidden_size": 1024, "num_attention_heads": 16, "num_hidden_layers": 24,
         "intermediate_size": 4096}),  # BERT-large
    _hf("t5", "encoder-decoder", "T5ForConditionalGeneration", "T5Config",
        {**_SMALL_LM, "d_model": 64, "d_kv": 16, "num_heads": 4, "num_layers": 2, "d_ff": 256},
        {"d_model": 768, "d_kv": 64, "num_heads": 12, "num_layers": 12, "d_ff": 3072},  # T5-base
        example=_t5_inputs),
    _hf("vit", "encoder", "ViTForImageClassification", "ViTConfig",
        {"hidden_size": 64, "num_attention_heads": 4, "num_hidden_layers": 2,
         "intermediate_size": 128, "image_size": 32, "patch_size": 8},
        {}, example=_pixels),  # ViT-B/16
    _hf("whisper-encoder", "encoder", "WhisperForAudioClassification", "WhisperConfig",
        {"d_model": 64, "encoder_attention_heads": 4, "encoder_layers": 2,
         "encoder_ffn_dim": 128, "num_mel_bins": 16, "max_source_positions": 32},
        {"d_model": 768, "encoder_attention_heads": 12, "encoder_layers": 12,
         "encoder_ffn_dim": 3072}, example=_features),  # Whisper-small encoder
)
CASES_BY_NAME = {c.name: c for c in CASES}


# ---------------------------------------------------------------------------------------------
# Exporters


def _meta_module(case: Case, size: str) -> Any:
    torch = _torch()
    torch.manual_seed(0)
    with torch.device("meta"):
        return case.build(size).eval()


def _export_dynamo(case: Case, size: str, dest: Path, optimize: bool) -> None:
    """On the meta device, as `gpuplan estimate --hf-config` does. `optimize` runs the
    onnxscript optimizer that `torch.onnx.export(optimize=True)` runs, after the weights are
    stripped: its constant folding cannot run on meta tensors."""
    model = _meta_module(case, size)
    args = tuple(a.to("meta") if a is not None else None for a in case.example(size))
    proto = onnx.load_from_string(exporting.export_module(model, args, label=case.name))
    if optimize:
        import onnxscript

        with exporting.quiet_exporter():
            proto = onnxscript.optimizer.optimize(proto)
    onnx.save(proto, str(dest))


def _export_torchscript(case: Case, size: str, dest: Path) -> None:
    torch = _torch()
    torch.manual_seed(0)
    model = case.build(size).eval()
    raw = dest.with_suffix(".full.onnx")
    with exporting.quiet_exporter():
        torch.onnx.export(model, case.example(size), str(raw), dynamo=False, opset_version=17)
    from gpuplan_estimator import graph

    graph.strip_weights(raw, dest)
    raw.unlink()


def _export_ort_fused(case: Case, size: str, dest: Path) -> None:
    """The TorchScript export through onnxruntime's transformer optimizer, which is what
    Optimum's ORTOptimizer runs: Attention, SkipLayerNormalization, FastGelu, ... fused.
    opt_level 0: the fusions only, no onnxruntime session (whose constant folding would
    materialise every stripped weight)."""
    from onnxruntime.transformers import optimizer

    try:
        if parameter_count(case, size) > REAL_WEIGHTS_LIMIT:
            raise MemoryError("too large to trace with real weights here")
        _export_torchscript(case, size, dest)
    except Exception:
        _export_dynamo(case, size, dest, optimize=False)
    model_type = {"gpt2": "gpt2", "vit": "vit"}.get(case.name, "bert")
    with exporting.quiet_exporter():
        fused = optimizer.optimize_model(str(dest), model_type=model_type, opt_level=0,
                                         use_gpu=False, only_onnxruntime=False)
    fused.save_model_to_file(str(dest))


EXPORTERS: dict[str, Callable[[Case, str, Path], None]] = {
    "dynamo": lambda c, s, d: _export_dynamo(c, s, d, optimize=False),
    "dynamo-opt": lambda c, s, d: _export_dynamo(c, s, d, optimize=True),
    "torchscript": _export_torchscript,
    "ort-fused": _export_ort_fused,
}
FUSED_CASES = frozenset({"gpt2", "bert", "vit"})
"""Models onnxruntime's transformer optimizer has fusion patterns for."""


def exporters_for(case: Case) -> tuple[str, ...]:
    """Every exporter that applies to `case` (ORT fusion only where it has patterns)."""
    return tuple(e for e in EXPORTERS if e != "ort-fused" or case.name in FUSED_CASES)


def export(case: Case, exporter: str, size: str, dest: Path) -> float:
    """Write `case` exported by `exporter` at `size` to `dest`; return seconds taken."""
    start = time.perf_counter()
    EXPORTERS[exporter](case, size, dest)
    return time.perf_counter() - start


# ---------------------------------------------------------------------------------------------
# Reference FLOPs


REAL_WEIGHTS_LIMIT = 400_000_000
"""Parameters above which nothing runs the model with real weights on this 24 GiB machine:
no TorchScript export (it traces real tensors) and no FlopCounterMode run."""
REAL_WEIGHT_EXPORTERS = frozenset({"torchscript"})


def parameter_count(case: Case, size: str) -> int:
    """Parameters of the model at `size`, counted on the meta device."""
    return sum(p.numel() for p in _meta_module(case, size).parameters())


def reference_flops(case: Case, size: str) -> tuple[int, str]:
    """(forward FLOPs, how they were counted): FlopCounterMode where the model fits in
    memory, else the closed form for decoder transformers."""
    if parameter_count(case, size) <= REAL_WEIGHTS_LIMIT:
        return counted_flops(case, size), "FlopCounterMode"
    return analytic_decoder_flops(case, size), "2·linear weights·tokens + attention"


def analytic_decoder_flops(case: Case, size: str) -> int:
    """2 FLOPs per linear weight per token (every projection, MLP and the LM head; all
    experts when every expert is routed), plus Q·Kᵀ and probs·V over the full sequence."""
    model = _meta_module(case, size)
    linear = sum(m.weight.numel() for m in model.modules()
                 if type(m).__name__ in ("Linear", "Conv1D"))
    config = model.config
    tokens, sequence = TEXT_BATCH, SEQUENCE[size]
    tokens *= sequence
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    attention = 4 * sequence * config.num_attention_heads * head_dim * config.num_hidden_layers
    return tokens * (2 * linear + attention)


def counted_flops(case: Case, size: str) -> int:
    """Forward FLOPs of matmuls, convolutions and attention by PyTorch's `FlopCounterMode`."""
    torch = _torch()
    from torch.utils.flop_counter import FlopCounterMode

    torch.manual_seed(0)
    model = case.build(size).eval()
    # Grad enabled: under no_grad, nn.MultiheadAttention takes a fused fast path that
    # FlopCounterMode does not count.
    with FlopCounterMode(display=False) as counter:
        model(*case.example(size))
    return int(counter.get_total_flops())


# ---------------------------------------------------------------------------------------------
# The table


@dataclasses.dataclass(frozen=True)
class Row:
    """One (case, exporter) of the corpus table."""

    case: str
    exporter: str
    layers: int | None
    uncovered: tuple[str, ...]
    flops_ratio: float | None
    export_s: float
    estimate_s: float | None
    error: str | None


def measure(case: Case, exporter: str, size: str, workdir: Path,
            reference_flops: int | None) -> Row:
    """Export, load and estimate one case in train and inference mode."""
    from gpuplan_estimator import RooflinePredictor, TrainingSettings, estimate, graph, load_catalog
    from gpuplan_estimator.core.layers import OpFamily

    dest = workdir / f"{case.name}-{exporter}-{size}.onnx"
    if exporter in REAL_WEIGHT_EXPORTERS and parameter_count(case, size) > REAL_WEIGHTS_LIMIT:
        return Row(case.name, exporter, None, (), None, 0.0, None,
                   "export skipped: TorchScript traces real weights, too large for this machine")
    try:
        export_s = export(case, exporter, size, dest)
    except Exception as exc:  # an exporter's own failure: reported, not ours to fix
        return Row(case.name, exporter, None, (), None, 0.0, None,
                   f"export failed: {type(exc).__name__}: {str(exc).splitlines()[0][:120]}")
    start = time.perf_counter()
    try:
        g = graph.load_model(dest)
        device = load_catalog().resolve("a100-sxm4-80gb")
        for mode in ("train", "inference"):
            estimate(g, [device], TrainingSettings(batch_size=case.batch, mode=mode),
                     predictor=RooflinePredictor())
    except Exception as exc:
        return Row(case.name, exporter, None, (), None, export_s, None,
                   f"{type(exc).__name__}: {str(exc)[:200]}")
    estimate_s = time.perf_counter() - start
    flops = sum(layer.flops for layer in g.layers
                if layer.family in (OpFamily.MATMUL, OpFamily.CONV))
    ratio = flops / reference_flops if reference_flops else None
    return Row(case.name, exporter, len(g.layers), g.unknown_op_types, ratio, export_s,
               estimate_s, None)


def run(names: Sequence[str], size: str, workdir: Path) -> list[Row]:
    """The corpus table for `names` at `size`."""
    rows = []
    for name in names:
        case = CASES_BY_NAME[name]
        reference, _ = reference_flops(case, size)
        for exporter in exporters_for(case):
            rows.append(measure(case, exporter, size, workdir, reference))
            print(_format(rows[-1]), flush=True)
    return rows


def _format(row: Row) -> str:
    if row.error:
        return f"| {row.case} | {row.exporter} | – | – | – | {row.export_s:.1f} | – | {row.error} |"
    ratio = f"{row.flops_ratio:.4f}" if row.flops_ratio is not None else "n/a"
    uncovered = ", ".join(row.uncovered) or "none"
    return (f"| {row.case} | {row.exporter} | {row.layers} | {uncovered} | {ratio} | "
            f"{row.export_s:.1f} | {row.estimate_s:.2f} | ok |")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m campaigns.corpus")
    parser.add_argument("--size", choices=SIZES, default="small")
    parser.add_argument("--models", nargs="*", default=[c.name for c in CASES],
                        choices=[c.name for c in CASES])
    parser.add_argument("--workdir", type=Path, default=Path("corpus-exports"))
    args = parser.parse_args(argv)
    args.workdir.mkdir(parents=True, exist_ok=True)
    print("| model | exporter | layers | uncovered ops | FLOPs / reference | export s | "
          "load+estimate s | result |")
    print("|---|---|---|---|---|---|---|---|")
    rows = run(args.models, args.size, args.workdir)
    failed = [r for r in rows if r.error and not r.error.startswith("export ")]
    print(f"{len(rows)} rows, {len(failed)} estimator failures", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
