"""Export the attention corpus: tiny Hugging Face BERT, GPT-2 and OPT (2 layers, hidden 64,
2 heads, vocabulary 128, random weights built from config: nothing is downloaded; batch 2,
sequence 128) with every
exporter this torch has, with and without an attention mask, in both of transformers'
attention implementations (its default "sdpa" and "eager"), as structure-only graphs.

    .venv/bin/python hack/attention_corpus.py [--out tests/fixtures/attention_corpus]
        [--models bert gpt2 opt] [--exporters dynamo dynamo-noopt torchscript]
    .venv/bin/python hack/attention_corpus.py --summary   # the table of docs/memory.md

Each graph lands in ``OUT/torch-<version>/<model>-<attn>-<exporter>-<mask>.onnx`` with its
weights replaced by `ConstantOfShape` (`graph.strip_weights`) and each node's metadata (stack
traces) and doc string dropped, and that folder's
``manifest.json`` gets one entry per export (versions, exporter, model, mask, attention
layers, this command, date, sha256); running it under another torch (a throwaway venv) adds
that version's folder. An export the exporter itself refuses is recorded
with its error and no file. `tests/unit/estimator/graph/test_attention_corpus.py` reads them.

Exporters, as users call `torch.onnx.export`:
- ``dynamo``: ``dynamo=True`` with its default ``optimize=True`` (onnxscript's optimizer);
- ``dynamo-noopt``: ``dynamo=True, optimize=False`` (what `gpuplan --hf-config` writes);
- ``torchscript``: ``dynamo=False``, opset 17, through a wrapper taking the mask by keyword
  (transformers 5's forward refuses the tracer's positional ``use_cache``).
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import io
import json
import shlex
import sys
import tempfile
import time
import warnings
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import onnx
import torch
import transformers

from gpuplan_estimator import graph

MODELS = ("bert", "gpt2", "opt")
EXPORTERS = ("dynamo", "dynamo-noopt", "torchscript")
ATTENTION_IMPLEMENTATIONS = ("sdpa", "eager")
MASKS = ("mask", "nomask")
LAYERS, HIDDEN, HEADS, VOCAB, SEQUENCE, BATCH = 2, 64, 2, 128, 128, 2
"""A sequence four times the head dim: the scores outweigh what a fused kernel keeps (Q, K, V,
output), as at any training length, so fused must come out smaller."""
POSITIONS = 256
MANIFEST = "manifest.json"


def build(model: str, attn: str) -> Any:
    """The tiny model with random weights (seed 0), in eval mode, no KV cache."""
    tf = transformers
    if model == "bert":
        config: Any = tf.BertConfig(vocab_size=VOCAB, hidden_size=HIDDEN,
                                    num_attention_heads=HEADS, num_hidden_layers=LAYERS,
                                    intermediate_size=2 * HIDDEN, max_position_embeddings=POSITIONS)
        cls: Any = tf.BertModel
    elif model == "gpt2":
        config = tf.GPT2Config(vocab_size=VOCAB, n_embd=HIDDEN, n_head=HEADS, n_layer=LAYERS,
                               n_positions=POSITIONS)
        cls = tf.GPT2LMHeadModel
    elif model == "opt":
        config = tf.OPTConfig(vocab_size=VOCAB, hidden_size=HIDDEN, num_attention_heads=HEADS,
                              num_hidden_layers=LAYERS, ffn_dim=2 * HIDDEN,
                              max_position_embeddings=POSITIONS, word_embed_proj_dim=HIDDEN)
        cls = tf.OPTForCausalLM
    else:
        raise ValueError(f"model: one of {MODELS}, got {model!r}")
    config.use_cache = False
    config._attn_implementation = attn
    torch.manual_seed(0)
    return cls(config).eval()


class _KeywordMask(torch.nn.Module):
    """`model(input_ids=..., attention_mask=...)`'s first output, for the TorchScript tracer."""

    def __init__(self, model: Any) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids: Any, attention_mask: Any = None) -> Any:
        return self.model(input_ids=input_ids, attention_mask=attention_mask)[0]


def inputs(mask: bool) -> tuple[Any, dict[str, Any]]:
    """Token ids [BATCH, SEQUENCE] and, with `mask`, a padding mask (the second sample's last
    four tokens padded)."""
    ids = torch.zeros((BATCH, SEQUENCE), dtype=torch.long)
    if not mask:
        return ids, {}
    attention_mask = torch.ones((BATCH, SEQUENCE), dtype=torch.long)
    attention_mask[1, -4:] = 0
    return ids, {"attention_mask": attention_mask}


def export(model: str, attn: str, exporter: str, mask: bool, dest: Path) -> None:
    """Write the stripped export to `dest`; the exporter's own exception propagates."""
    module = build(model, attn)
    ids, kwargs = inputs(mask)
    with tempfile.TemporaryDirectory(prefix="attention-corpus-") as tmp:
        raw = Path(tmp) / "model.onnx"
        with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()), \
                contextlib.redirect_stderr(io.StringIO()):
            warnings.simplefilter("ignore")
            if exporter == "torchscript":
                args = (ids, kwargs["attention_mask"]) if mask else (ids,)
                torch.onnx.export(_KeywordMask(module), args, str(raw), dynamo=False,
                                  opset_version=17)
            else:
                program = torch.onnx.export(module, (ids,), kwargs=kwargs, dynamo=True,
                                            optimize=exporter == "dynamo")
                program.save(str(raw))
        proto = onnx.load(str(raw))  # external data, if any, folded back in before stripping
        for node in proto.graph.node:  # dynamo's per-node stack traces: 90 % of the bytes
            del node.metadata_props[:]
            node.doc_string = ""
        whole = Path(tmp) / "whole.onnx"
        onnx.save(proto, str(whole))
        graph.strip_weights(whole, dest)


def versions() -> dict[str, str]:
    """The packages that shaped the graphs."""
    import onnxscript

    return {"torch": torch.__version__, "transformers": transformers.__version__,
            "onnx": onnx.__version__, "onnxscript": onnxscript.__version__,
            "python": sys.version.split()[0]}


def summary(out: Path) -> str:
    """The docs/memory.md table: per torch version and exporter, the graphs, the cores found
    against the attention layers, and fused against eager training on an H100 (roofline)."""
    from gpuplan_estimator import RooflinePredictor, TrainingSettings, estimate, load_catalog
    from gpuplan_estimator.step import attention

    device = load_catalog().resolve("h100-sxm-80gb")
    rows = ["| torch | exporter | graphs (refused) | cores found / attention layers | "
            "fused / eager step time | fused / eager activations |", "|---|---|--:|--:|--:|--:|"]
    def version(path: Path) -> tuple[int, ...]:
        return tuple(int(part) for part in path.parent.name.removeprefix("torch-").split("."))

    for path in sorted(out.glob("torch-*/manifest.json"), key=version):
        entries = json.loads(path.read_text())["entries"]
        for exporter in EXPORTERS:
            mine = [e for e in entries if e["exporter"] == exporter]
            made = [e for e in mine if e["file"]]
            found = layers = 0
            time_ratio, memory_ratio = [], []
            for e in made:
                g = graph.load_model(out / e["file"])
                found += attention.attention_report(g, "fused").cores
                layers += e["attention_layers"]
                eager, fused = (estimate(g, [device], TrainingSettings(
                    batch_size=e["batch"], mode="train", attention=a),
                    predictor=RooflinePredictor())[0] for a in ("eager", "fused"))
                time_ratio.append(fused.step_time_ms / eager.step_time_ms)
                memory_ratio.append(fused.memory.activations_bytes
                                    / eager.memory.activations_bytes)
            rows.append(
                f"| {mine[0]['torch']} | {exporter} | {len(made)} ({len(mine) - len(made)}) | "
                f"{found} / {layers} | {min(time_ratio):.2f}-{max(time_ratio):.2f} | "
                f"{min(memory_ratio):.2f}-{max(memory_ratio):.2f} |")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="hack/attention_corpus.py")
    parser.add_argument("--summary", action="store_true",
                        help="print the docs/memory.md table of the corpus in --out; export "
                             "nothing")
    parser.add_argument("--out", type=Path, default=Path("tests/fixtures/attention_corpus"))
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=MODELS)
    parser.add_argument("--exporters", nargs="+", default=list(EXPORTERS), choices=EXPORTERS)
    parser.add_argument("--attn", nargs="+", default=list(ATTENTION_IMPLEMENTATIONS),
                        choices=ATTENTION_IMPLEMENTATIONS)
    args = parser.parse_args(argv)
    if args.summary:
        print(summary(args.out))
        return 0
    found = versions()
    folder = f"torch-{found['torch'].split('+')[0]}"
    (args.out / folder).mkdir(parents=True, exist_ok=True)
    manifest_path = args.out / folder / MANIFEST
    manifest = (json.loads(manifest_path.read_text()) if manifest_path.exists()
                else {"entries": []})
    command = shlex.join([Path(sys.executable).name, *sys.argv])
    made: list[dict[str, Any]] = []
    for model in args.models:
        for attn in args.attn:
            for exporter in args.exporters:
                for mask in MASKS:
                    name = f"{model}-{attn}-{exporter}-{mask}.onnx"
                    dest = args.out / folder / name
                    start = time.perf_counter()
                    entry: dict[str, Any] = {
                        "file": f"{folder}/{name}", **found, "exporter": exporter,
                        "model": model, "attn_implementation": attn, "mask": mask == "mask",
                        "attention_layers": LAYERS, "sequence": SEQUENCE, "batch": BATCH,
                        "command": command,
                        "date": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
                    }
                    try:
                        export(model, attn, exporter, mask == "mask", dest)
                    except Exception as exc:  # the exporter's refusal is a corpus fact too
                        first = (str(exc).strip().splitlines() or [""])[0][:200]
                        entry.update(file=None, error=f"{type(exc).__name__}: {first}")
                    else:
                        data = dest.read_bytes()
                        entry.update(bytes=len(data),
                                     sha256=hashlib.sha256(data).hexdigest())
                    entry["export_s"] = round(time.perf_counter() - start, 1)
                    made.append(entry)
                    print(json.dumps({k: entry.get(k) for k in
                                      ("file", "error", "bytes", "export_s")}), flush=True)
    keys = {(e["model"], e["attn_implementation"], e["exporter"], e["mask"]) for e in made}
    kept = [e for e in manifest["entries"]
            if (e["model"], e["attn_implementation"], e["exporter"], e["mask"]) not in keys]
    manifest["entries"] = sorted([*kept, *made], key=lambda e: (
        e["model"], e["attn_implementation"], e["exporter"], e["mask"]))
    manifest_path.write_text(json.dumps(manifest, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
