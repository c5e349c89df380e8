"""Models without ONNX: build a PyTorch module on the meta device and export it in-process.

`from_hf_config` builds any architecture `transformers` knows from its `config.json`;
`from_torch_factory` calls ``package.module:factory``. Both export with torch.onnx's dynamo
exporter at a static input shape, on the meta device (no weights are allocated, downloaded or
needed), and return a structure-only graph: each weight a `ConstantOfShape` of its shape, the
convention `graph.load_model` reads. torch and transformers are optional (`gpuplan[torch]`);
without them the error says what to install. GPT-2, BERT and OPT configs need neither:
`graph.zoo` writes those graphs directly.
"""

from __future__ import annotations

import contextlib
import importlib
import io
import os
import sys
import tempfile
import warnings
from collections.abc import Callable, Iterator, Mapping
from typing import Any, cast

import numpy as np
import onnx
from onnx import helper, numpy_helper

from gpuplan_estimator.core import errors, extras
from gpuplan_estimator.graph import zoo


def _require(module: str, extra: str) -> Any:
    """`module`, or the request's error naming the extra to install (the service answers it
    with the field `model`)."""
    try:
        return extras.require(module, extra, needed_by="building a model in-process")
    except extras.MissingExtraError as exc:
        raise errors.InvalidRequestError("model", str(exc)) from exc


def needs_export(config: Mapping[str, Any]) -> bool:
    """Whether a Hugging Face config is built by torch (seconds, `gpuplan[torch]`) rather
    than written by `zoo` (GPT-2, BERT, OPT)."""
    return config.get("model_type") not in zoo.MODEL_TYPES


def hf_config_graph(config: Mapping[str, Any], *, batch: int, sequence: int | None,
                    label: str, name: str | None = None) -> bytes:
    """The ONNX graph of a Hugging Face config: `zoo` writes GPT-2, BERT and OPT directly
    (symbolic batch and sequence, no torch); any other architecture is exported by
    `from_hf_config` at `batch` and `sequence`."""
    if not needs_export(config):
        return zoo.build_transformer(config, name=name or label).SerializeToString()
    return from_hf_config(config, batch=batch, sequence=sequence, label=label)


def from_hf_config(config: Mapping[str, Any], *, batch: int, sequence: int | None,
                   label: str) -> bytes:
    """The structure-only ONNX of the model a Hugging Face `config.json` describes.

    The class is the config's first `architectures` entry (else the base model of its
    `model_type`); the input is the model's `main_input_name`: token ids [batch, sequence],
    pixels [batch, channels, image_size, image_size] or audio features [batch, mel bins,
    2·max_source_positions]. Encoder-decoders get decoder ids of the same length.
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
    if name == "input_features":
        frames = 2 * int(getattr(config, "max_source_positions", 1500))
        return (torch.zeros((batch, int(config.num_mel_bins), frames), device="meta"),)
    if sequence is None:
        raise errors.InvalidRequestError("dim_bindings.sequence",
                                         f"{label}: give the sequence length (--dim sequence=N)")
    ids = torch.zeros((batch, sequence), dtype=torch.long, device="meta")
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


def from_torch_factory(factory: Callable[[], Any], *, label: str = "--torch") -> bytes:
    """Export the module `factory` builds.

    The factory takes no arguments and returns ``(module, example_args)``: the example args
    fix the input shapes (on any device; they are moved to meta). The module is built under
    ``torch.device("meta")``, so no weights are allocated.
    """
    torch = _require("torch", "torch")
    with torch.device("meta"):
        built = factory()
    if not (isinstance(built, tuple) and len(built) == 2
            and isinstance(built[0], torch.nn.Module) and isinstance(built[1], tuple)):
        raise errors.InvalidRequestError(
            label, f"the factory must return (nn.Module, example_args tuple), got "
            f"{type(built).__name__}")
    module, args = built
    meta_args = tuple(a.to("meta") if isinstance(a, torch.Tensor) else a for a in args)
    return export_module(module.to("meta").eval(), meta_args, label=label)


def export_module(module: Any, args: tuple[Any, ...], *, label: str) -> bytes:
    """Dynamo-export `module` at `args` on the meta device; structure-only ONNX bytes."""
    torch = _require("torch", "torch")
    with tempfile.TemporaryDirectory(prefix="gpuplan-export-") as tmp:
        path = os.path.join(tmp, "model.onnx")
        try:
            with quiet_exporter():
                program = torch.onnx.export(module, args, dynamo=True, optimize=False)
                program.save(path, include_initializers=False,
                             keep_initializers_as_inputs=True)
        except Exception as exc:
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
            raise errors.InvalidModelError(
                f"{label}: torch.onnx.export failed: {type(exc).__name__}: {first}") from exc
        model = onnx.load(path, load_external_data=False)
    signature = program.exported_program.graph_signature
    buffers = frozenset(signature.inputs_to_buffers.values()) | frozenset(
        signature.inputs_to_lifted_tensor_constants.values())
    weights_to_constant_of_shape(model, data_inputs=len(program.model.graph.inputs),
                                 buffers=buffers)
    return model.SerializeToString()


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
