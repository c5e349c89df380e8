"""The only ONNX reader: bytes or file → bound, shape-inferred `ModelGraph`; and `strip_weights`.

Weights are never needed: a model loads with `load_external_data=False`, and structure-only
graphs (weights as `ConstantOfShape`, the convention of `onnx.tools.replace_constants`) are
first-class. Symbolic input dims are bound before shape inference; one left unbound is an error.
"""

from __future__ import annotations

import ast
import gzip
import io
import lzma
import math
import os
import tempfile
from collections.abc import Mapping

import onnx
import zstandard
from google.protobuf.message import DecodeError
from onnx import ModelProto, TensorProto, helper, shape_inference

from gpuplan_estimator.core import errors
from gpuplan_estimator.core.layers import (
    DROPOUT_METADATA_KEY,
    DTYPE_BYTES,
    KV_CACHE_METADATA_KEY,
    ModelGraph,
    TensorInfo,
)
from gpuplan_estimator.core.vocabulary import MODEL_COMPRESSION_MAGIC, MODEL_COMPRESSIONS
from gpuplan_estimator.graph import contrib_schemas, export_checks, folding, fusion, records

DEFAULT_MAX_DECOMPRESSED_BYTES = 512 * 2**20
MIN_OPSET = 7
MAX_NODES = 200_000
"""Largest graph accepted: 40x a stripped GPT-3 XL; bigger ones are hostile or broken, and
would hold the estimator for minutes."""
MAX_TENSOR_ELEMENTS = 2**44
"""Largest tensor accepted (~1.8e13 elements, 70 TB in fp32: hundreds of the largest GPUs).
Beyond it a shape is corrupt or hostile, and its products would overflow int64 kernel dims."""
# Protobuf cannot serialise a message past 2 GiB; above this, infer via a file (infer_shapes_path).
_INFER_IN_MEMORY_LIMIT_BYTES = 2**31 - 2**24
_BATCH_DIM_NAMES = frozenset({"batch", "batch_size", "batchsize", "n", "bs"})
COMPRESSIONS = MODEL_COMPRESSIONS

Source = str | os.PathLike[str] | bytes

contrib_schemas.register()  # onnx's inference then carries shapes through com.microsoft ops


def source_label(source: Source) -> str:
    """How errors name `source`: its path, or ``<bytes>``."""
    return _label(source)


BYTES_LABEL = "<bytes>"
"""The label of a model given as bytes (no file to name in a message)."""


def _label(source: Source) -> str:
    return BYTES_LABEL if isinstance(source, bytes) else os.fspath(source)


def _raw_bytes(source: Source) -> bytes:
    if isinstance(source, bytes):
        return source
    try:
        with open(source, "rb") as f:
            return f.read()
    except OSError as exc:
        raise errors.InvalidModelError(f"{_label(source)}: cannot read: {exc}") from exc


def compression_of(data: bytes) -> str | None:
    """'gzip' | 'xz' | 'zstd' by magic bytes, None for anything else (plain ONNX)."""
    for kind, magic in MODEL_COMPRESSION_MAGIC.items():
        if data.startswith(magic):
            return kind
    return None


def read_model_bytes(
    source: Source, *, max_decompressed_bytes: int = DEFAULT_MAX_DECOMPRESSED_BYTES
) -> bytes:
    """Serialized ONNX of `source`, decompressing gzip/xz/zstd (at most the cap) by magic bytes."""
    data = _raw_bytes(source)
    kind = compression_of(data)
    if kind is None:
        return data
    try:
        out = _decompress(kind, data, max_decompressed_bytes + 1)
    except (OSError, EOFError, lzma.LZMAError, zstandard.ZstdError) as exc:
        raise errors.InvalidModelError(
            f"{_label(source)}: corrupt or truncated {kind} data: {exc}"
        ) from exc
    if len(out) > max_decompressed_bytes:
        raise errors.InvalidModelError(
            f"{_label(source)}: decompressed model exceeds the cap of "
            f"{max_decompressed_bytes} bytes (max_decompressed_bytes)"
        )
    return out


def _decompress(kind: str, data: bytes, limit: int) -> bytes:
    """At most `limit` decompressed bytes, so a compression bomb stops at the cap."""
    buffer = io.BytesIO(data)
    if kind == "gzip":
        with gzip.GzipFile(fileobj=buffer) as gz:
            return gz.read(limit)
    if kind == "xz":
        with lzma.LZMAFile(buffer) as xz:
            return xz.read(limit)
    with zstandard.ZstdDecompressor().stream_reader(buffer) as zst:
        return zst.read(limit)


def parse_model(data: bytes, label: str) -> ModelProto:
    """Parse serialized ONNX bytes; InvalidModelError naming `label` if not a model."""
    try:
        model = onnx.load_from_string(data)
    except (DecodeError, RuntimeError, ValueError) as exc:
        raise errors.InvalidModelError(f"{label}: not a valid ONNX model: {exc}") from exc
    if model.ir_version <= 0 or not model.graph.node:
        raise errors.InvalidModelError(f"{label}: not a valid ONNX model (no IR version or nodes)")
    if len(model.graph.node) > MAX_NODES:
        raise errors.InvalidModelError(
            f"{label}: {len(model.graph.node)} nodes, more than the {MAX_NODES} any exported "
            "training model has (a structure-only GPT-3 XL has ~5k)")
    return model


def model_opset(model: ModelProto, label: str) -> int:
    """The model's default-domain opset; UnsupportedOpsetError when out of range."""
    versions = [o.version for o in model.opset_import if o.domain in ("", "ai.onnx")]
    if not versions:
        raise errors.UnsupportedOpsetError(f"{label}: no default-domain opset import")
    opset, newest = versions[0], onnx.defs.onnx_opset_version()
    if not MIN_OPSET <= opset <= newest:
        raise errors.UnsupportedOpsetError(
            f"{label}: opset {opset} outside the supported range {MIN_OPSET}..{newest}"
        )
    return opset


def bind_input_dims(
    model: ModelProto, batch: int | None, dim_bindings: Mapping[str, int], label: str
) -> dict[str, int]:
    """Rewrite symbolic graph-input dims in place; return the bindings used."""
    initializers = {t.name for t in model.graph.initializer}
    used: dict[str, int] = {}
    unbound: list[str] = []
    seen: list[str] = []  # every symbolic dim of the inputs, bound or not, in order
    for value in model.graph.input:
        if value.name in initializers or not value.type.HasField("tensor_type"):
            continue
        for pos, dim in enumerate(value.type.tensor_type.shape.dim):
            if dim.HasField("dim_value"):
                continue
            param = dim.dim_param  # bytes when a hostile file holds invalid UTF-8
            key = (param if isinstance(param, str) else repr(param)) or f"{value.name}[{pos}]"
            seen.append(key)
            bound = _binding_for(key, pos, batch, dim_bindings)
            if bound is None:
                unbound.append(key)
                continue
            if bound <= 0:
                raise errors.InvalidRequestError(f"dim_bindings.{key}", f"must be > 0, got {bound}")
            dim.dim_value = bound  # assigning the oneof clears dim_param
            used[key] = bound
    if unbound:
        # A dim the request names that the graph lacks is most likely the unbound one misspelt.
        raise errors.UnboundDimError(
            sorted(set(unbound)), where="" if label == BYTES_LABEL else label,
            unknown=sorted(set(dim_bindings) - set(seen)), graph_dims=list(dict.fromkeys(seen)))
    # Declared intermediate/output shapes use the same names: bind them too, so a shape only
    # declared (e.g. the output of a custom op) stays usable and consistent.
    for value in (*model.graph.value_info, *model.graph.output):
        if value.type.HasField("tensor_type"):
            for dim in value.type.tensor_type.shape.dim:
                if dim.dim_param and dim.dim_param in used:
                    dim.dim_value = used[dim.dim_param]
    return used


def _binding_for(
    key: str, pos: int, batch: int | None, dim_bindings: Mapping[str, int]
) -> int | None:
    if key in dim_bindings:
        return int(dim_bindings[key])
    if batch is not None and (pos == 0 or key.lower() in _BATCH_DIM_NAMES):
        return batch
    return None


_DATA_FIELDS = ("raw_data", "float_data", "double_data", "int32_data", "int64_data",
                "uint64_data", "string_data", "external_data")


def drop_weight_data(model: ModelProto) -> None:
    """Keep only the dims and type of every initializer that is not a shape value, in place.

    Nothing here reads a weight's values, and shape inference needs only its dims: a model
    exported with its weights (or with them in an external-data file, which is never opened)
    costs what a structure-only one does in every inference round.
    """
    for tensor in model.graph.initializer:
        if folding.small_array_candidate(tensor):
            continue
        for data_field in _DATA_FIELDS:
            tensor.ClearField(data_field)
        tensor.data_location = TensorProto.DEFAULT


POSITIVE_INT_ATTRIBUTES = frozenset({"strides", "dilations", "kernel_shape", "blocksize",
                                     "group", "num_outputs", "size"})
"""Attributes onnx's C++ shape inference divides by: zero there kills the process (SIGFPE)."""
NON_NEGATIVE_INT_ATTRIBUTES = frozenset({"pads", "output_padding"})


WINDOW_OPS = frozenset({"Conv", "ConvTranspose", "ConvInteger", "QLinearConv", "MaxPool",
                        "AveragePool", "LpPool"})
WINDOW_ATTRIBUTES = {"kernel_shape": 1, "strides": 1, "dilations": 1, "pads": 2,
                     "output_padding": 1}
"""Window attributes and their length per spatial dim."""


def check_attributes(model: ModelProto, label: str) -> None:
    """Refuse attribute values that crash shape inference itself, naming the node."""
    ranks = {v.name: len(v.type.tensor_type.shape.dim)
             for v in (*model.graph.input, *model.graph.value_info)
             if v.type.HasField("tensor_type") and v.type.tensor_type.HasField("shape")}
    ranks.update({t.name: len(t.dims) for t in model.graph.initializer})
    for index, node in enumerate(model.graph.node):
        name = node.name or f"{node.op_type}_{index}"
        if node.op_type in WINDOW_OPS:
            _check_window_lengths(node, name, ranks.get(node.input[0]) if node.input else None,
                                  label)
        for attr in node.attribute:
            minimum = (1 if attr.name in POSITIVE_INT_ATTRIBUTES
                       else 0 if attr.name in NON_NEGATIVE_INT_ATTRIBUTES else None)
            if minimum is None:
                continue
            values = ([attr.i] if attr.type == onnx.AttributeProto.INT
                      else list(attr.ints) if attr.type == onnx.AttributeProto.INTS else [])
            if any(v < minimum for v in values):
                raise errors.InvalidModelError(
                    f"{label}: node {name!r} ({node.op_type}) attribute {attr.name} = "
                    f"{values}: must be >= {minimum}")


def _check_window_lengths(node: onnx.NodeProto, name: str, rank: int | None,
                          label: str) -> None:
    """One window entry per spatial dim (two for pads): onnx's C++ inference reads past the
    end of a shorter list (SIGSEGV)."""
    spatial = {len(a.ints) // WINDOW_ATTRIBUTES[a.name] for a in node.attribute
               if a.name in WINDOW_ATTRIBUTES and a.type == onnx.AttributeProto.INTS}
    if rank is not None:
        spatial.add(rank - 2)
    pads = [len(a.ints) for a in node.attribute if a.name == "pads"]
    if len(spatial) > 1 or min(spatial, default=1) < 1 or any(p % 2 for p in pads):
        raise errors.InvalidModelError(
            f"{label}: node {name!r} ({node.op_type}): window attributes and input rank "
            f"disagree on the number of spatial dims ({sorted(spatial)})")


def _infer(model: ModelProto, label: str) -> ModelProto:
    try:
        if model.ByteSize() < _INFER_IN_MEMORY_LIMIT_BYTES:
            return shape_inference.infer_shapes(model, strict_mode=False, data_prop=True)
        with tempfile.TemporaryDirectory(prefix="gpuplan-infer-") as tmp:
            src, dst = os.path.join(tmp, "in.onnx"), os.path.join(tmp, "out.onnx")
            onnx.save(model, src, save_as_external_data=True, location="in.data")
            shape_inference.infer_shapes_path(src, dst, strict_mode=False, data_prop=True)
            return onnx.load(dst, load_external_data=False)
    except (shape_inference.InferenceError, onnx.checker.ValidationError, ValueError,
            RuntimeError, OverflowError, MemoryError) as exc:
        # onnx's C++ inference turns a hostile graph's failures into any of these
        raise errors.InvalidModelError(f"{label}: shape inference failed: {exc}") from exc


def drop_inferable_annotations(model: ModelProto) -> None:
    """Drop the exporter's shape annotations (value_info) of initializers and of tensors an
    op with a schema produces, in place: inference derives those from the graph, and a stale
    annotation (an optimizer pass that did not update it) would otherwise win or contradict.
    Annotations of custom ops' outputs stay: they are the only source of those shapes."""
    known: dict[tuple[str, str], bool] = {}
    inferable = {t.name for t in model.graph.initializer}  # their dims say it already
    for node in model.graph.node:
        key = (node.op_type, node.domain)
        if key not in known:
            known[key] = _has_schema(*key)
        if known[key]:
            inferable.update(node.output)
    kept = [v for v in model.graph.value_info if v.name not in inferable]
    del model.graph.value_info[:]
    model.graph.value_info.extend(kept)


def _has_schema(op_type: str, domain: str) -> bool:
    try:
        return bool(onnx.defs.has(op_type, domain if domain != "ai.onnx" else ""))
    except (TypeError, UnicodeDecodeError):  # names a hostile file wrote as invalid text
        return False


def load_model(
    source: Source,
    *,
    batch: int | None = None,
    dim_bindings: Mapping[str, int] | None = None,
    name: str | None = None,
    max_decompressed_bytes: int = DEFAULT_MAX_DECOMPRESSED_BYTES,
    label: str | None = None,
) -> ModelGraph:
    """Parse an ONNX model (plain or gzip/xz/zstd) into layers with concrete shapes.

    `batch` binds the first dim of every graph input whose first dim is symbolic (and dims
    named batch/batch_size/N); `dim_bindings` binds dims by name. Raises `UnboundDimError`
    naming every dim left symbolic, `InvalidModelError` naming the file (or `label`, for a
    rewritten copy of one) for bad input.
    """
    label = label or _label(source)
    model = parse_model(
        read_model_bytes(source, max_decompressed_bytes=max_decompressed_bytes), label
    )
    opset = model_opset(model, label)
    folded_batchnorm = export_checks.folded_batchnorm(model)
    cache = named_tensors(model, KV_CACHE_METADATA_KEY)
    dropout = named_tensors(model, DROPOUT_METADATA_KEY)
    drop_weight_data(model)
    drop_inferable_annotations(model)
    check_attributes(model, label)
    symbolic = symbolic_inputs(model)
    used = bind_input_dims(model, batch, dict(dim_bindings or {}), label)
    folding.check_ranges(model, label)
    inferred, folded = folding.fold_shape_values(model, lambda m: _infer(m, label))
    model_name = name or inferred.graph.name or os.path.basename(label)
    record = extract_graph(inferred, symbolic, folded)
    layers, unknown = records.build_layers(record, opset=opset, label=label)
    fused, units = fusion.fuse(layers, frozenset(o.name for o in inferred.graph.output))
    return ModelGraph(name=model_name, layers=fused, units=units, dim_bindings=used,
                      opset=opset, unknown_op_types=unknown, folded_batchnorm=folded_batchnorm,
                      cache_tensors=cache, dropout_tensors=dropout)


def named_tensors(model: ModelProto, key: str) -> tuple[str, ...]:
    """The tensors the model's metadata entry `key` names, comma-separated (none without
    it): `KV_CACHE_METADATA_KEY`, `DROPOUT_METADATA_KEY`."""
    text = next((p.value for p in model.metadata_props if p.key == key), "")
    return tuple(name for name in text.split(",") if name)


_DTYPES: Mapping[int, str] = {
    TensorProto.FLOAT: "float32", TensorProto.DOUBLE: "float64", TensorProto.FLOAT16: "float16",
    TensorProto.BFLOAT16: "bfloat16", TensorProto.INT64: "int64", TensorProto.INT32: "int32",
    TensorProto.INT16: "int16", TensorProto.INT8: "int8", TensorProto.UINT8: "uint8",
    TensorProto.BOOL: "bool",
    # Unsigned and 8-bit float types only matter here through their width.
    TensorProto.UINT16: "int16", TensorProto.UINT32: "int32", TensorProto.UINT64: "int64",
    TensorProto.FLOAT8E4M3FN: "float8", TensorProto.FLOAT8E4M3FNUZ: "float8",
    TensorProto.FLOAT8E5M2: "float8", TensorProto.FLOAT8E5M2FNUZ: "float8",
}
assert set(_DTYPES.values()) <= set(DTYPE_BYTES)


def _value_info(value: onnx.ValueInfoProto) -> TensorInfo | None:
    """Concrete TensorInfo, or None while any dim is unknown (never read as 0)."""
    if not value.type.HasField("tensor_type"):
        return None
    tt = value.type.tensor_type
    dtype = _DTYPES.get(tt.elem_type)
    if dtype is None or not tt.HasField("shape"):
        return None
    dims = tuple(d.dim_value if d.HasField("dim_value") else -1 for d in tt.shape.dim)
    if any(d < 0 for d in dims):
        return None
    return _checked(TensorInfo(value.name, dims, dtype))


def _checked(info: TensorInfo) -> TensorInfo:
    """`info`, unless its shape is negative or holds more elements than any real model."""
    if any(d < 0 for d in info.shape) or math.prod(info.shape) > MAX_TENSOR_ELEMENTS:
        raise errors.InvalidModelError(
            f"tensor {info.name!r} has shape {list(info.shape)}: negative or more than "
            f"{MAX_TENSOR_ELEMENTS:.1e} elements, beyond any real model (a corrupt or "
            "hostile graph)")
    return info


def _attributes(node: onnx.NodeProto) -> dict[str, object]:
    out: dict[str, object] = {}
    for attr in node.attribute:
        if attr.type in (onnx.AttributeProto.TENSOR, onnx.AttributeProto.GRAPH,
                         onnx.AttributeProto.GRAPHS, onnx.AttributeProto.TENSORS,
                         onnx.AttributeProto.SPARSE_TENSOR, onnx.AttributeProto.TYPE_PROTO):
            continue
        value = helper.get_attribute_value(attr)
        if isinstance(value, bytes):
            value = value.decode("utf-8", "replace")
        elif isinstance(value, list):
            value = [v.decode("utf-8", "replace") if isinstance(v, bytes) else v for v in value]
        if value is not None:  # an attribute without a value reads as absent (its default)
            out[attr.name] = value
    return out


def symbolic_inputs(model: ModelProto) -> frozenset[str]:
    """Graph inputs declared with at least one symbolic or missing dim (data, not weights)."""
    return frozenset(
        v.name for v in model.graph.input
        if v.type.HasField("tensor_type")
        and any(not d.HasField("dim_value") for d in v.type.tensor_type.shape.dim)
    )


def extract_graph(
    model: ModelProto, symbolic: frozenset[str] = frozenset(),
    folded: frozenset[str] = frozenset(),
) -> records.GraphRecord:
    """Plain-data view of a shape-inferred graph (no onnx types leave this module)."""
    g = model.graph
    tensors: dict[str, TensorInfo] = {}
    for value in (*g.input, *g.value_info, *g.output):
        info = _value_info(value)
        if info is not None:
            tensors[value.name] = info
    for tensor in g.initializer:
        dtype = _DTYPES.get(tensor.data_type)
        if dtype is not None:
            tensors[tensor.name] = _checked(TensorInfo(tensor.name, tuple(tensor.dims), dtype))
    initializers = frozenset(t.name for t in g.initializer)
    nodes = tuple(
        records.NodeRecord(name=scoped_name(n), op_type=n.op_type, inputs=tuple(n.input),
                                outputs=tuple(n.output), attributes=_attributes(n),
                                has_subgraph=any(a.type in (onnx.AttributeProto.GRAPH,
                                                            onnx.AttributeProto.GRAPHS)
                                                 for a in n.attribute))
        for n in g.node
    )
    data_inputs = frozenset(v.name for v in g.input if v.name not in initializers)
    return records.GraphRecord(nodes=nodes, tensors=tensors, initializers=initializers,
                               data_inputs=data_inputs,
                               graph_outputs=frozenset(v.name for v in g.output),
                               symbolic_inputs=symbolic, int_constants=_int_constants(g),
                               folded=folded)


NAME_SCOPES_KEY = "pkg.torch.onnx.name_scopes"
"""Node metadata of torch.onnx's dynamo exporter: the module path the node came from, as a
Python list literal (['', 'transformer', 'transformer.h.0', 'attn', 'matmul'])."""
MAX_NAME_SCOPES_CHARS = 4096


def scoped_name(node: onnx.NodeProto) -> str:
    """The node's name, prefixed by its module path when a dynamo export recorded one.

    TorchScript names nodes by module path (`/transformer/h.0/attn/MatMul`); dynamo names them
    `node_MatMul_12` and keeps the path in metadata. Prefixed the same way, both exports' layers
    roll up into blocks (`--explain`); the node's own name stays last, so names stay unique.
    """
    scopes = next((p.value for p in node.metadata_props if p.key == NAME_SCOPES_KEY), "")
    if not scopes or "/" in node.name or len(scopes) > MAX_NAME_SCOPES_CHARS:
        return node.name
    try:
        path = ast.literal_eval(scopes)
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        return node.name
    if not isinstance(path, list) or not all(isinstance(p, str) for p in path):
        return node.name
    modules = [p for p in path[:-1] if p]  # the last scope is the op itself
    return "/" + "/".join([*modules, node.name]) if modules else node.name


MAX_CONSTANT_ELEMENTS = 64
"""Integer constants kept as values: split sizes, positions, axes (not index tables)."""


def _int_constants(g: onnx.GraphProto) -> dict[str, tuple[int, ...]]:
    """Values of the graph's small integer initializers and Constant node outputs."""
    values = [(t.name, folding.small_array(t)) for t in g.initializer
              if t.data_type in (TensorProto.INT64, TensorProto.INT32)]
    values += [(n.output[0], folding.constant_value(n)) for n in g.node
               if n.op_type == "Constant" and n.output]
    return {name: tuple(int(v) for v in value.reshape(-1)) for name, value in values
            if value is not None and value.dtype.kind in "iu"
            and value.size <= MAX_CONSTANT_ELEMENTS}


def strip_weights(
    source: Source,
    dest: str | os.PathLike[str],
    *,
    compress: str | None = None,
    threshold_elements: int = 128,
) -> tuple[int, int]:
    """Write a structure-only copy of `source` to `dest`; return (in_bytes, out_bytes).

    Tensors above `threshold_elements` become `ConstantOfShape` of their shape and dtype, as
    `onnx.tools.replace_constants` does; int32/int64 tensors are kept up to 64 Ki elements since
    they carry shapes Reshape needs. `compress` is None, 'gzip', 'xz' or 'zstd'.
    """
    if compress not in (None, *COMPRESSIONS):
        raise errors.InvalidRequestError("compress", f"expected one of {COMPRESSIONS}")
    raw = _raw_bytes(source)
    model = parse_model(read_model_bytes(raw), _label(source))
    _replace_initializers(model.graph, threshold_elements)
    data = model.SerializeToString()
    if compress == "gzip":
        data = gzip.compress(data, compresslevel=9, mtime=0)
    elif compress == "xz":
        data = lzma.compress(data, preset=6)
    elif compress == "zstd":
        data = zstandard.ZstdCompressor(level=19).compress(data)
    with open(dest, "wb") as f:
        f.write(data)
    return len(raw), len(data)


def _keep_as_data(tensor: TensorProto, threshold_elements: int) -> bool:
    elements = 1
    for d in tensor.dims:
        elements *= d
    if tensor.data_type in (TensorProto.INT64, TensorProto.INT32):
        return elements <= 65536
    return elements <= threshold_elements


def _replace_initializers(graph: onnx.GraphProto, threshold_elements: int) -> None:
    kept: list[TensorProto] = []
    replaced: list[onnx.NodeProto] = []
    for tensor in graph.initializer:
        if _keep_as_data(tensor, threshold_elements):
            kept.append(tensor)
            continue
        shape_name = f"{tensor.name}__SHAPE"
        kept.append(helper.make_tensor(shape_name, TensorProto.INT64, [len(tensor.dims)],
                                       list(tensor.dims)))
        value = helper.make_tensor("value", tensor.data_type, [1], [0])
        replaced.append(helper.make_node("ConstantOfShape", [shape_name], [tensor.name],
                                         name=f"{tensor.name}__CONST", value=value))
    names = {n.output[0] for n in replaced}
    inputs = [v for v in graph.input if v.name not in names]
    del graph.initializer[:]
    graph.initializer.extend(kept)
    del graph.input[:]
    graph.input.extend(inputs)
    nodes = replaced + list(graph.node)
    del graph.node[:]
    graph.node.extend(nodes)
