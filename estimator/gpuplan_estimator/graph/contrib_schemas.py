"""onnx schemas for the com.microsoft ops `contrib` knows, so onnx's own shape inference
carries shapes through them (in one pass, like any standard op).

onnx ships no schema for onnxruntime's contrib ops; without one, inference stops at the first
fused attention and every later tensor is unknown. `register()` adds a permissive schema per
op (any inputs and outputs) whose inference function is `contrib.output_shapes`. Registration
is process-wide and idempotent, undone at exit; an op another library already registered is
left alone.
"""

from __future__ import annotations

import atexit
from collections.abc import Callable

import onnx
from onnx import defs, helper

from gpuplan_estimator.core.errors import GpuplanError
from gpuplan_estimator.graph import contrib

DOMAIN = "com.microsoft"
_TYPES = ["tensor(float)", "tensor(float16)", "tensor(bfloat16)", "tensor(double)",
          "tensor(int64)", "tensor(int32)", "tensor(int8)", "tensor(uint8)", "tensor(bool)"]
_ATTRIBUTES = ("num_heads", "kv_num_heads", "qkv_hidden_sizes")


def register() -> None:
    """Register a schema for each op in `contrib.KNOWN_OPS` that has none yet."""
    variadic = defs.OpSchema.FormalParameterOption.Variadic
    for op_type in sorted(contrib.KNOWN_OPS):
        if defs.has(op_type, DOMAIN):
            continue
        schema = defs.OpSchema(
            op_type, DOMAIN, 1, f"gpuplan's shape rules for {DOMAIN}.{op_type}",
            inputs=[defs.OpSchema.FormalParameter("inputs", "T", "", param_option=variadic,
                                                  is_homogeneous=False, min_arity=0)],
            outputs=[defs.OpSchema.FormalParameter("outputs", "T", "", param_option=variadic,
                                                   is_homogeneous=False, min_arity=1)],
            type_constraints=[("T", _TYPES, "")])
        schema.set_type_and_shape_inference_function(_inference_for(op_type))
        defs.register_schema(schema)
        # The registry outlives the interpreter: a Python inference function left in it is
        # destroyed after Python has shut down (a crash at exit). Take it out first.
        atexit.register(defs.deregister_schema, op_type, 1, DOMAIN)


def _inference_for(op_type: str) -> Callable[[onnx.shape_inference.InferenceContext], None]:
    def infer(ctx: onnx.shape_inference.InferenceContext) -> None:
        inputs = [_shape(ctx.get_input_type(i)) if ctx.has_input(i) else None
                  for i in range(ctx.get_num_inputs())]
        attributes = {}
        for name in _ATTRIBUTES:
            attr = ctx.get_attribute(name)
            if attr is not None:
                attributes[name] = helper.get_attribute_value(attr)
        try:
            shapes = contrib.output_shapes(op_type, inputs, attributes, ctx.get_num_outputs(),
                                           op_type)
        except GpuplanError:
            return  # `records` names the node and the layout it cannot price
        first = ctx.get_input_type(0) if ctx.get_num_inputs() else None
        if first is None or not first.HasField("tensor_type"):
            return
        for index, shape in enumerate(shapes):
            if shape is not None and ctx.has_output(index):
                ctx.set_output_type(index, helper.make_tensor_type_proto(
                    first.tensor_type.elem_type, list(shape)))

    return infer


def _shape(value: onnx.TypeProto | None) -> tuple[int, ...] | None:
    if value is None or not value.HasField("tensor_type"):
        return None
    tensor = value.tensor_type
    if not tensor.HasField("shape") or not all(d.HasField("dim_value")
                                               for d in tensor.shape.dim):
        return None
    return tuple(d.dim_value for d in tensor.shape.dim)
