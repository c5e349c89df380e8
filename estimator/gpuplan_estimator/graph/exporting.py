"""Models without ONNX: build a PyTorch module on the meta device and export it in-process.

`from_hf_config` builds any architecture `transformers` knows from its `config.json`;
`from_torch_factory` calls ``package.module:factory``. Both export with torch.onnx's dynamo
exporter at a static input shape, on the meta device (no weights are allocated, downloaded or
needed), and return a structure-only graph: each weight a `ConstantOfShape` of its shape, the
convention `graph.load_model` reads. torch and transformers are optional (`gpuplan[torch]`);
without them the error says what to install (exit 4, as every missing package). GPT-2, BERT
and OPT configs need neither (`graph.zoo` writes those graphs directly), nor do the Llama,
Mistral, Qwen2, Gemma, Mixtral and Qwen2-MoE families (`graph.hf_blocks` writes their block
once per layer, in well under a second where the full export takes a minute), nor T5
(`graph.hf_seq2seq`) and Whisper (`graph.hf_whisper`).

`check_hf_request` refuses, before anything is built, what cannot succeed: an architecture
known not to export, a text model without a sequence length, a size whose attention scores
alone exceed any GPU.
"""

from __future__ import annotations

import contextlib
import importlib
import io
import os
import re
import sys
import tempfile
import warnings
from collections.abc import Callable, Iterator, Mapping
from typing import Any, cast

import numpy as np
import onnx
from onnx import helper, numpy_helper

from gpuplan_estimator.core import errors, extras, limits
from gpuplan_estimator.graph import hf_blocks, hf_seq2seq, hf_whisper, loading, zoo

WRITTEN_MODEL_TYPES: tuple[str, ...] = (zoo.MODEL_TYPES + hf_blocks.MODEL_TYPES
                                         + hf_seq2seq.MODEL_TYPES + hf_whisper.MODEL_TYPES)
"""The HF `model_type`s written from the config without torch (docs/models.md lists them; a
test checks the list against this)."""

UNSUPPORTED_MODEL_TYPES: Mapping[str, str] = {
    "switch_transformers": "its top-1 router does not export with torch.onnx (data-dependent "
                           "expert dispatch)",
    "deepseek_v2": "multi-head latent attention is not modelled",
    "deepseek_v3": "multi-head latent attention is not modelled",
}
"""Architectures refused at once, by name, with the reason (rather than a minute of export
that fails)."""

_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


class MissingTorchError(errors.InvalidRequestError, extras.MissingExtraError):
    """torch or transformers is not installed: the request's field `model` for the service,
    and "unavailable" (exit 4) for the CLI, as every missing optional package."""


def _require(module: str, extra: str) -> Any:
    """`module`, or the request's error naming the extra to install (the service answers it
    with the field `model`)."""
    try:
        return extras.require(module, extra, needed_by="building a model in-process")
    except extras.MissingExtraError as exc:
        raise MissingTorchError("model", str(exc)) from exc


def require_export_packages() -> None:
    """Fail now, before any other work, when torch or transformers is missing."""
    _require("torch", "torch")
    _require("transformers", "torch")


def needs_export(config: Mapping[str, Any]) -> bool:
    """Whether a Hugging Face config is built by torch (seconds, `gpuplan[torch]`) rather
    than written from the config (`zoo`, `hf_blocks`)."""
    return config.get("model_type") not in WRITTEN_MODEL_TYPES


def needs_sequence(config: Mapping[str, Any]) -> bool:
    """Whether the model reads token ids (a sequence length to bind) rather than only pixels
    at the config's image_size or audio features at its max_source_positions. An audio
    encoder-decoder (Whisper, Speech2Text) reads both: its decoder's tokens are the sequence."""
    if config.get("model_type") in hf_whisper.MODEL_TYPES or (
            "num_mel_bins" in config and config.get("is_encoder_decoder")):
        return True
    return not any(key in config for key in ("image_size", "num_mel_bins", "vision_config"))


def check_hf_request(config: Mapping[str, Any], *, batch: int | None, sequence: int | None,
                     label: str) -> None:
    """Refuse, before building anything, a config that cannot be estimated at this size:
    a known-unsupported architecture (by name), a missing sequence length, or a size whose
    largest tensor (the eager attention scores, batch·heads·sequence²) is beyond the cap on
    any tensor (`loading.MAX_TENSOR_ELEMENTS`). Fields are the request's
    (`dim_bindings.sequence`, `batch`); the CLI names its flags."""
    kind = config.get("model_type")
    if not isinstance(kind, str):
        raise errors.InvalidRequestError(f"{label}.model_type", "missing: not a transformers "
                                         "config.json")
    if kind in UNSUPPORTED_MODEL_TYPES:
        raise errors.InvalidRequestError(f"{label}.model_type", f"{kind!r} is not supported: "
                                         f"{UNSUPPORTED_MODEL_TYPES[kind]}")
    if needs_export(config) and batch is None:
        raise errors.InvalidRequestError("batch", f"{label}: needed to export {kind}")
    if kind in hf_whisper.MODEL_TYPES:
        hf_whisper.check_request(config, batch=batch, sequence=sequence, label=label)
        return
    if not needs_sequence(config):
        return
    if sequence is None:
        raise errors.InvalidRequestError("dim_bindings.sequence",
                                         f"{label}: give the sequence length (--dim sequence=N)")
    heads = config.get("num_attention_heads", config.get("n_head", 1))
    scores = (batch or 1) * (heads if isinstance(heads, int) and heads > 0 else 1) * sequence ** 2
    if scores > loading.MAX_TENSOR_ELEMENTS:
        raise errors.InvalidRequestError(
            "dim_bindings.sequence", f"{label}: sequence {sequence:,} at batch {batch or 1}: "
            f"one layer's attention scores alone are {scores:.2e} elements "
            f"({scores * 4 / 2**40:,.0f} TiB in fp32), beyond the {loading.MAX_TENSOR_ELEMENTS:.2e}"
            "-element cap on any tensor; use a shorter sequence")


def hf_config_graph(config: Mapping[str, Any], *, batch: int, sequence: int | None,
                    label: str, name: str | None = None) -> bytes:
    """The ONNX graph of a Hugging Face config: `zoo` writes GPT-2, BERT and OPT, `hf_blocks`
    the Llama-shaped and mixture-of-experts decoders, `hf_seq2seq` T5, `hf_whisper` Whisper,
    directly (symbolic batch and sequence, no torch); any other architecture is exported by
    `from_hf_config` at `batch` and `sequence`. `check_hf_request` runs first."""
    check_hf_request(config, batch=batch, sequence=sequence, label=label)
    kind = config.get("model_type")
    if kind in zoo.MODEL_TYPES:
        return zoo.build_transformer(config, name=name or label).SerializeToString()
    if kind in hf_blocks.MODEL_TYPES:
        return hf_blocks.build_decoder(config, name=name or label).SerializeToString()
    if kind in hf_seq2seq.MODEL_TYPES:
        return hf_seq2seq.build_t5(config, name=name or label).SerializeToString()
    if kind in hf_whisper.MODEL_TYPES:
        return hf_whisper.build_whisper(config, name=name or label).SerializeToString()
    return from_hf_config(config, batch=batch, sequence=sequence, label=label)


def from_hf_config(config: Mapping[str, Any], *, batch: int, sequence: int | None,
                   label: str) -> bytes:
    """The structure-only ONNX of the model a Hugging Face `config.json` describes.

    The class is the config's first `architectures` entry (else the base model of its
    `model_type`); the input is the model's `main_input_name`: token ids [batch, sequence],
    pixels [batch, channels, image_size, image_size] or audio features [batch, mel bins,
    2·max_source_positions]. Encoder-decoders get decoder ids of `sequence` tokens (of the
    same length as text input ids).
    """
    torch = _require("torch", "torch")
    transformers = _require("transformers", "torch")
    model_type = config.get("model_type")
    if not isinstance(model_type, str):
        raise errors.InvalidRequestError(f"{label}.model_type", "missing: not a transformers "
                                         "config.json")
    try:
        hf_config = transformers.AutoConfig.for_model(model_type, **{
            k: v for k, v in config.items() if k != "model_type"})
    except (ValueError, KeyError, TypeError) as exc:
        raise errors.InvalidRequestError(f"{label}.model_type", str(exc)) from exc
    hf_config.use_cache = False
    architecture = next(iter(config.get("architectures") or []), None)
    model_class = getattr(transformers, str(architecture), None) if architecture else None
    with torch.device("meta"):
        try:
            model = (model_class(hf_config) if model_class is not None
                     else transformers.AutoModel.from_config(hf_config))
        except (ValueError, TypeError, AttributeError) as exc:
            raise errors.InvalidRequestError(label, f"cannot build {architecture or model_type}:"
                                             f" {exc}") from exc
    args = _hf_inputs(torch, model, hf_config, batch, sequence, label)
    return export_module(model.eval(), args, label=label)


def _hf_inputs(torch: Any, model: Any, config: Any, batch: int, sequence: int | None,
               label: str) -> tuple[Any, ...]:
    name = getattr(model, "main_input_name", "input_ids")
    if name == "pixel_values":
        side = int(getattr(config, "image_size", 224))
        return (torch.zeros((batch, int(getattr(config, "num_channels", 3)), side, side),
                            device="meta"),)
    audio = None
    if name == "input_features":
        frames = 2 * int(getattr(config, "max_source_positions", 1500))
        audio = torch.zeros((batch, int(config.num_mel_bins), frames), device="meta")
        if not getattr(config, "is_encoder_decoder", False):
            return (audio,)
    if sequence is None:
        raise errors.InvalidRequestError("dim_bindings.sequence",
                                         f"{label}: give the sequence length (--dim sequence=N)")
    ids = torch.zeros((batch, sequence), dtype=torch.long, device="meta")
    if audio is not None:  # speech encoder-decoders (Whisper): audio in, decoder ids
        return (audio, None, ids)  # input_features, attention_mask, decoder_input_ids
    if getattr(config, "is_encoder_decoder", False):
        return (ids, None, ids)  # input_ids, attention_mask, decoder_input_ids
    return (ids,)


def resolve_factory(spec: str, *, label: str = "--torch") -> Callable[[], Any]:
    """The function ``package.module:factory`` names (the working directory importable)."""
    _require("torch", "torch")
    module_name, _, attribute = spec.partition(":")
    if not module_name or not attribute:
        raise errors.InvalidRequestError(label, f"{spec!r}: expected package.module:factory")
    sys.path.insert(0, os.getcwd())  # a factory next to the user, as `python -m` finds it
    try:
        factory = getattr(importlib.import_module(module_name), attribute)
    except (ImportError, AttributeError) as exc:
        raise errors.InvalidRequestError(label, f"{spec!r}: {exc}") from exc
    finally:
        sys.path.remove(os.getcwd())
    if not callable(factory):
        raise errors.InvalidRequestError(label, f"{spec!r} is not callable")
    return cast(Callable[[], Any], factory)


def from_torch_factory(factory: Callable[[], Any], *, label: str = "--torch",
                       batch: int | None = None) -> bytes:
    """Export the module `factory` builds, at `batch` when one is asked.

    The factory takes no arguments and returns ``(module, example_args)``: the example args
    fix the input shapes (on any device; they are moved to meta). The module is built under
    ``torch.device("meta")``, so no weights are allocated. The example's batch is the leading
    dim of its first tensor argument, shared by every tensor argument that starts with it.

    At another `batch`, the example is resized and exported at that batch: the graph an ONNX
    export at that batch would be. Where that fails, the batch is exported as the symbolic dim
    ``batch``, which re-batches by binding it (a fixed-batch export keeps its batch in Reshape
    targets that cannot always be told from other sizes: issue #35, a TransformerEncoderLayer
    with 4 heads exported at batch 4). A module whose code fixes its batch is last exported as
    the example gives it, and re-batched or refused as any fixed export.
    """
    torch = _require("torch", "torch")
    with torch.device("meta"):
        built = factory()
    if not (isinstance(built, tuple) and len(built) == 2
            and isinstance(built[0], torch.nn.Module) and isinstance(built[1], tuple)):
        raise errors.InvalidRequestError(
            label, f"the factory must return (nn.Module, example_args tuple), got "
            f"{type(built).__name__}")
    module = built[0].to("meta").eval()
    args = tuple(a.to("meta") if isinstance(a, torch.Tensor) else a for a in built[1])
    attempts: list[Callable[[], bytes]] = []
    if batch is not None and batch != _example_batch(args):
        attempts.append(lambda: export_module(module, _at_batch(args, batch), label=label))
        attempts.append(lambda: export_module(module, args, label=label, dynamic_batch=True))
    attempts.append(lambda: export_module(module, args, label=label))
    failures: list[errors.InvalidModelError] = []
    for attempt in attempts:
        try:
            return attempt()
        except errors.InvalidModelError as exc:
            failures.append(exc)
    raise failures[0]


def _example_batch(args: tuple[Any, ...]) -> int | None:
    torch = _require("torch", "torch")
    return next((int(a.shape[0]) for a in args if isinstance(a, torch.Tensor) and a.dim() > 0),
                None)


def _at_batch(args: tuple[Any, ...], batch: int) -> tuple[Any, ...]:
    """Example args with the example's batch (`_example_batch`) set to `batch`."""
    torch = _require("torch", "torch")
    own = _example_batch(args)
    return tuple(torch.empty((batch, *a.shape[1:]), dtype=a.dtype, device="meta")
                 if isinstance(a, torch.Tensor) and a.dim() > 0 and a.shape[0] == own else a
                 for a in args)


def _batch_dims(args: tuple[Any, ...]) -> tuple[dict[int, Any] | None, ...]:
    """torch.export's `dynamic_shapes`: the example's batch (`_example_batch`) as one shared
    symbolic ``batch``."""
    torch = _require("torch", "torch")
    own = _example_batch(args)
    batch = torch.export.Dim(BATCH_DIM, min=1, max=limits.MAX_BATCH_SIZE)
    return tuple({0: batch} if isinstance(a, torch.Tensor) and a.dim() > 0
                 and a.shape[0] == own else None for a in args)


BATCH_DIM = "batch"


def export_module(module: Any, args: tuple[Any, ...], *, label: str,
                  dynamic_batch: bool = False) -> bytes:
    """Dynamo-export `module` at `args` on the meta device; structure-only ONNX bytes. With
    `dynamic_batch`, dim 0 of the tensor args is the symbolic dim ``batch``."""
    torch = _require("torch", "torch")
    dynamic = {"dynamic_shapes": _batch_dims(args)} if dynamic_batch else {}
    with tempfile.TemporaryDirectory(prefix="gpuplan-export-") as tmp:
        path = os.path.join(tmp, "model.onnx")
        try:
            with quiet_exporter():
                program = torch.onnx.export(module, args, dynamo=True, optimize=False, **dynamic)
                program.save(path, include_initializers=False,
                             keep_initializers_as_inputs=True)
        except Exception as exc:
            raise errors.InvalidModelError(
                f"{label}: torch.onnx.export failed: {first_line(exc)} (--debug: the whole "
                "traceback)") from exc
        model = onnx.load(path, load_external_data=False)
    signature = program.exported_program.graph_signature
    buffers = frozenset(signature.inputs_to_buffers.values()) | frozenset(
        signature.inputs_to_lifted_tensor_constants.values())
    weights_to_constant_of_shape(model, data_inputs=len(program.model.graph.inputs),
                                 buffers=buffers)
    return model.SerializeToString()


def first_line(exc: BaseException) -> str:
    """An exporter failure in one line: its type and first non-empty line, terminal colour
    codes removed (torch's messages carry them)."""
    lines = [line.strip() for line in _ANSI.sub("", str(exc)).splitlines() if line.strip()]
    return f"{type(exc).__name__}: {lines[0]}" if lines else type(exc).__name__


@contextlib.contextmanager
def quiet_exporter() -> Iterator[None]:
    """torch.onnx prints progress and warnings on every export; our own messages suffice."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            yield


def weights_to_constant_of_shape(model: onnx.ModelProto, data_inputs: int,
                                 buffers: frozenset[str] = frozenset()) -> None:
    """Graph inputs after the first `data_inputs` are weights: replace each by a
    `ConstantOfShape` of its declared shape, in place (a structure-only graph). Inputs named
    in `buffers` (rotary frequencies, batch-norm statistics) become `Expand` of a scalar,
    which holds their shape but does not read as a trainable weight.

    Each weight gets its own fill value, so that an optimizer's common-subexpression pass
    cannot merge two projections of the same shape.
    """
    graph = model.graph
    weights = list(graph.input)[data_inputs:]
    nodes, shapes = [], []
    for index, value in enumerate(weights):
        tt = value.type.tensor_type
        dims = [d.dim_value for d in tt.shape.dim]
        shape_name = f"{value.name}__SHAPE"
        shapes.append(numpy_helper.from_array(np.array(dims, np.int64), shape_name))
        fill = helper.make_tensor("value", tt.elem_type, [1], [index + 1])
        if value.name in buffers:
            scalar = f"{value.name}__FILL"
            nodes.append(helper.make_node("Constant", [], [scalar], value=fill))
            nodes.append(helper.make_node("Expand", [scalar, shape_name], [value.name],
                                          name=f"{value.name}__BUFFER"))
            continue
        nodes.append(helper.make_node(
            "ConstantOfShape", [shape_name], [value.name], name=f"{value.name}__CONST",
            value=fill))
    del graph.input[data_inputs:]
    graph.initializer.extend(shapes)
    body = list(graph.node)
    del graph.node[:]
    graph.node.extend([*nodes, *body])
