"""Pure decomposition of one training (or inference) step into work items per phase.

Forward items come from `opcost.kernel_dims` (the canonical dims of each forward layer); backward
items are derived from them as forward-shaped kernels (`backward`); the optimizer step is a fixed
list of elementwise passes over the parameters per optimizer (`OPTIMIZER_PASSES`).

Which layers get backward work follows autograd's rule: a tensor needs a gradient when it is a
trainable parameter or is computed (as a floating-point tensor) from one that does. Layers none
of whose inputs need a gradient (e.g. the stem's preprocessing, shape arithmetic) get none.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from types import MappingProxyType

from gpuplan_estimator.core import options, precisions
from gpuplan_estimator.core.errors import InvalidRequestError
from gpuplan_estimator.core.kernels import FREE_KERNEL, KERNEL_FAMILIES
from gpuplan_estimator.core.layers import (
    DTYPE_BYTES,
    FLOAT_DTYPES,
    Layer,
    ModelGraph,
    OpFamily,
    TensorInfo,
)
from gpuplan_estimator.core.workload import Phase, WorkItem, elementwise_dims
from gpuplan_estimator.step import (
    attention,
    autocast,
    backward,
    eager,
    frameworks,
    gradient_sums,
    layout_credits,
    training_ops,
    views,
)

CONSTANT_ROLE = "constant"
"""A free item that materialises a weight or buffer (`eager.materialised_constants`)."""
KernelDims = tuple[str, Mapping[str, int]]
KernelDimsFn = Callable[[Layer], KernelDims]

# Elementwise passes of one optimizer step over all parameters, as PyTorch 2.x runs them on CUDA
# by default (the `foreach` paths `_multi_tensor_*` in torch/optim/{sgd,adam,adamw,adagrad,
# rmsprop}.py; the `_single_tensor_*` paths do the same arithmetic one tensor at a time).
# Each pass: (op, tensors read, tensors written, flops per element). Reads+writes per parameter:
# sgd 3 (p += -lr*g), momentum 8 (buf*=m; buf+=g; p+=-lr*buf), adam 18 (exp_avg.lerp_(g);
# exp_avg_sq*=b2; exp_avg_sq.addcmul_(g,g); s=sqrt(exp_avg_sq); s/=bc2; s+=eps;
# p.addcdiv_(exp_avg,s)), adamw 20 (adam + p*=1-lr*wd), adagrad 11, rmsprop 13.
# zero_grad(set_to_none=True), PyTorch 2.x's default, launches no kernel.
OPTIMIZER_PASSES: Mapping[str, tuple[tuple[str, int, int, int], ...]] = MappingProxyType(
    {
        "sgd": (("add", 2, 1, 2),),
        "momentum": (("mul", 1, 1, 1), ("add", 2, 1, 1), ("add", 2, 1, 2)),
        "adam": (
            ("lerp", 2, 1, 3),
            ("mul", 1, 1, 1),
            ("addcmul", 2, 1, 3),
            ("sqrt", 1, 1, 1),
            ("div", 1, 1, 1),
            ("add", 1, 1, 1),
            ("addcdiv", 3, 1, 3),
        ),
        "adamw": (
            ("mul", 1, 1, 1),
            ("lerp", 2, 1, 3),
            ("mul", 1, 1, 1),
            ("addcmul", 2, 1, 3),
            ("sqrt", 1, 1, 1),
            ("div", 1, 1, 1),
            ("add", 1, 1, 1),
            ("addcdiv", 3, 1, 3),
        ),
        "adagrad": (
            ("addcmul", 2, 1, 2), ("sqrt", 1, 1, 1), ("add", 1, 1, 1), ("addcdiv", 3, 1, 3)
        ),
        "rmsprop": (
            ("mul", 1, 1, 1),
            ("addcmul", 2, 1, 3),
            ("sqrt", 1, 1, 1),
            ("add", 1, 1, 1),
            ("addcdiv", 3, 1, 3),
        ),
    }
)
# The fused implementations (`fused=True`, `_fused_*` ATen kernels) do a whole update in one
# pass: every tensor read once and written once. (op, read, written, flops per element): sgd
# reads p, g; momentum p, g, buf; adam/adamw p, g, exp_avg, exp_avg_sq; adagrad p, g,
# state_sum. Flops as the foreach passes'. They take GradScaler's scale and unscale inside.
FUSED_OPTIMIZER_PASS: Mapping[str, tuple[str, int, int, int]] = MappingProxyType(
    {
        "sgd": ("fused_sgd", 2, 1, 2),
        "momentum": ("fused_sgd", 3, 2, 4),
        "adam": ("fused_adam", 4, 3, 13),
        "adamw": ("fused_adamw", 4, 3, 14),
        "adagrad": ("fused_adagrad", 3, 2, 7),
    }
)
# Mixed precision (torch.amp): fp16 (not bf16) unscales the gradients with GradScaler (one
# read+write pass over them). The weights' casts to the half dtype are forward work
# (`autocast.cast_items`), as autocast runs them.
UNSCALE_PASS = ("unscale", 1, 1, 1)
# multi_tensor_apply walks parameters in chunks of 65536 elements (ATen's kChunkSize), so the
# optimizer passes are priced as [chunks, 65536] elementwise kernels.
OPTIMIZER_CHUNK_ELEMENTS = 65536
MASTER_DTYPE = precisions.PRECISION_TABLE["fp32"].master_dtype


@dataclass(frozen=True, kw_only=True)
class TrainingSettings:
    """What is being run; validated by `validate()`, never silently corrected."""

    batch_size: int
    """Global samples per step; the graph is expected to be bound at this batch."""
    mode: str = options.DEFAULT_MODE
    """"train" (forward, backward, optimizer) or "inference" (forward only)."""
    optimizer: str = options.DEFAULT_OPTIMIZER
    precision: str = options.DEFAULT_PRECISION
    """fp32, tf32 (float32 tensors, TF32 tensor-core math), fp16 or bf16 (mixed precision)."""
    framework: str = options.DEFAULT_FRAMEWORK
    """How fusion units run: "pytorch-eager" (one kernel per node, as the GPU data was
    measured), "onnxruntime" or "pytorch-compiled" (inference with that framework's fusions;
    see `framework`)."""
    attention: str = options.DEFAULT_ATTENTION
    """"eager" (the attention core's ops one by one, its score matrix stored) or "fused"
    (one SDPA/FlashAttention kernel; see `step.attention`)."""
    optimizer_impl: str = options.DEFAULT_OPTIMIZER_IMPL
    """How the optimizer's update runs (`options.OPTIMIZER_IMPLS`): its kernels and its host
    cost per parameter tensor."""

    def validate(self) -> tuple[str, ...]:
        """Every problem as "field: message"; empty when valid."""
        errors: list[str] = []
        if self.mode not in options.MODES:
            errors.append(f"mode: must be one of {', '.join(options.MODES)}, got {self.mode!r}")
        if self.optimizer not in options.OPTIMIZERS:
            errors.append(
                f"optimizer: must be one of {', '.join(options.OPTIMIZERS)}, got {self.optimizer!r}"
            )
        if self.precision not in options.PRECISIONS:
            errors.append(
                f"precision: must be one of {', '.join(options.PRECISIONS)}, got {self.precision!r}"
            )
        if self.framework not in options.FRAMEWORKS:
            errors.append(f"framework: must be one of {', '.join(options.FRAMEWORKS)}, "
                          f"got {self.framework!r}")
        elif self.framework in options.INFERENCE_ONLY_FRAMEWORKS and self.mode != "inference":
            errors.append(f"framework: {self.framework} is priced for inference only (its "
                          "folded kernels have no backward here), set mode to inference")
        if self.attention not in options.ATTENTIONS:
            errors.append(f"attention: must be one of {', '.join(options.ATTENTIONS)}, "
                          f"got {self.attention!r}")
        elif (self.attention == options.FUSED_ATTENTION
              and self.framework not in options.FUSED_ATTENTION_FRAMEWORKS):
            errors.append(f"attention: fused attention is priced for "
                          f"{' and '.join(sorted(options.FUSED_ATTENTION_FRAMEWORKS))}, not "
                          f"{self.framework}")
        errors.extend(self._optimizer_impl_errors())
        if isinstance(self.batch_size, bool) or not isinstance(self.batch_size, int):
            errors.append(f"batch_size: must be an integer, got {self.batch_size!r}")
        elif self.batch_size <= 0:
            errors.append(f"batch_size: must be positive, got {self.batch_size}")
        return tuple(errors)

    def _optimizer_impl_errors(self) -> list[str]:
        if self.optimizer_impl not in options.OPTIMIZER_IMPLS:
            return [f"optimizer_impl: must be one of {', '.join(options.OPTIMIZER_IMPLS)}, "
                    f"got {self.optimizer_impl!r}"]
        problem = options.optimizer_impl_problem(self.optimizer, self.optimizer_impl)
        return [f"optimizer_impl: {problem}"] if problem else []

    def check(self) -> None:
        """Raise `InvalidRequestError` naming the first bad field (all are in the message)."""
        errors = self.validate()
        if errors:
            field_name = errors[0].split(":", 1)[0]
            raise InvalidRequestError(field_name, "; ".join(e.split(": ", 1)[1] for e in errors))

    @property
    def training(self) -> bool:
        """Whether the step has a backward pass and an optimizer step."""
        return self.mode == "train"

    @property
    def mixed_precision(self) -> bool:
        """fp16/bf16: half-precision compute with fp32 master weights (torch.amp)."""
        return precisions.precision(self.precision).autocast

    @property
    def compute_dtype(self) -> str:
        """The ONNX dtype kernels compute in under this precision."""
        return precisions.precision(self.precision).compute_dtype

    @property
    def activation_bytes(self) -> int:
        """Bytes per activation element in the compute dtype."""
        return DTYPE_BYTES[self.compute_dtype]


@dataclass(frozen=True)
class StepWork:
    """The work items of one step, device independent."""

    forward: tuple[WorkItem, ...]
    backward: tuple[WorkItem, ...]
    optimizer: tuple[WorkItem, ...]
    shape_only: tuple[str, ...] = ()  # layers that cost nothing (kernel "none")
    fused: tuple[str, ...] = ()  # layers the framework folds into another layer's kernel
    no_grad: tuple[str, ...] = ()  # layers skipped in backward: no input needs a gradient
    parameter_count: int = 0
    attributes: Mapping[str, str] = field(default_factory=dict)
    layers: tuple[Layer, ...] = ()
    """The layers the items belong to: the graph's and, in training, the dropout and loss an
    eval graph leaves out (`training_ops`)."""

    @property
    def items(self) -> tuple[WorkItem, ...]:
        """Forward, backward and optimizer items, in that order."""
        return self.forward + self.backward + self.optimizer


def build_step(
    graph: ModelGraph, settings: TrainingSettings, *, kernel_dims: KernelDimsFn | None = None
) -> StepWork:
    """Work items of one step of `graph` under `settings` (forward, backward, optimizer).

    `kernel_dims` maps a forward layer to its canonical (kernel, dims); defaults to
    `opcost.kernel_dims`.
    """
    settings.check()
    training_only: frozenset[str] = frozenset()
    eval_graph = graph
    if settings.training:  # dropout and the loss: an eval graph has neither
        eval_layers = {la.name for la in graph.layers}
        graph = training_ops.with_training_ops(graph)
        training_only = frozenset(la.name for la in graph.layers) - eval_layers
    dims_of = kernel_dims if kernel_dims is not None else _default_kernel_dims()
    needs_grad = gradient_tensors(graph) if settings.training else frozenset()
    forward: list[WorkItem] = []
    backward_items: list[WorkItem] = []
    shape_only: list[str] = []
    no_grad: list[str] = []
    fused: list[str] = []
    overrides = frameworks.overrides(graph, settings.framework)
    credits = layout_credits.credits_for(graph, settings.framework, overrides)
    fused_attention = attention.fused_attention(graph, settings.attention)
    params = eager.parameter_sizes(graph)
    biases = eager.linear_biases(graph.layers, params)
    dtypes = autocast.tensor_dtypes(graph, settings.precision, biases)
    # TensorIterator's kernels run dtype conversions unrolled; a compiler's are its own
    eager_kernels = settings.framework == options.PYTORCH_EAGER
    casts_forward, casts_backward = autocast.cast_items(graph, settings.precision, dtypes,
                                                        needs_grad, fused_attention,
                                                        eager=eager_kernels)
    cast_before = _by_layer(casts_forward)
    cast_grads = _by_layer(casts_backward)
    # Counted on the eval graph: dropout and the loss hang off the tensors they read.
    grad_sums = gradient_sums.gradient_sum_items(
        eval_graph, needs_grad, settings.compute_dtype, dtypes, fused_attention.members)
    # PyTorch runs a permute as a view; onnxruntime runs every Transpose as a copy.
    in_eager = settings.framework != options.ONNXRUNTIME
    view_layers = views.view_layers(graph, fused_attention) if in_eager else frozenset()
    # Bias Adds inside their linear's GEMM and selects (views): no forward kernel of their
    # own in eager PyTorch, but their backward (the bias gradient's sum, select's scatter).
    no_forward_kernel = frozenset(
        {*biases, *(la.name for la in graph.layers if eager.is_select(la, params))}
        if in_eager else ())
    constants = eager.materialised_constants(graph)
    for layer in graph.layers:
        forward.extend(cast_before.get(layer.name, ()))
        backward_items.extend(cast_grads.get(layer.name, ()))
        backward_items.extend(grad_sums.get(layer.name, ()))
        if layer.name in fused_attention.folded:  # inside the fused kernel, both ways
            fused.append(layer.name)
            forward.append(forward_item(layer, (FREE_KERNEL, {}), settings, role="fused"))
            continue
        if layer.name in overrides:
            unit_kernel = overrides[layer.name]
            if unit_kernel is None:
                fused.append(layer.name)
                forward.append(forward_item(layer, (FREE_KERNEL, {}), settings, role="fused"))
            else:
                forward.append(unit_item(layer, unit_kernel, settings))
            continue  # overrides exist for inference only (checked by `settings.check`)
        kernel_and_dims = (FREE_KERNEL, {}) if layer.name in view_layers else dims_of(layer)
        item = forward_item(layer, kernel_and_dims, settings, dtypes=dtypes)
        if (eager_kernels and item.kernel == "elementwise"
                and autocast.mixed_operands(layer, dtypes)):
            item = autocast.unrolled(item)
        if not settings.training:
            item = eval_mode_item(layer, item)
        if in_eager and layer.op_type in eager.CLONE_OPS:
            item = copy_pass_item(layer, item)
        scores_shape = fused_attention.scores_shape.get(layer.name)
        if scores_shape is not None:
            item = attention.without_scores_traffic(item, *scores_shape)
        if layer.name in training_only:
            item = replace(item, role=training_ops.ROLE)
        if layer.name in credits:
            item = replace(item, attributes=MappingProxyType(
                {**item.attributes, layout_credits.LAYOUT_CREDIT: credits[layer.name]}))
        if item.kernel == FREE_KERNEL:
            if layer.name in constants:  # a weight or buffer: nothing issues it
                item = replace(item, role=CONSTANT_ROLE)
            forward.append(item)
            shape_only.append(layer.name)
            if (settings.training and layer.op_type == views.SPLIT_OP
                    and layer.inputs[0].name in needs_grad):
                backward_items.append(split_gradient_item(layer, settings, dtypes))
            continue
        if layer.name in no_forward_kernel:
            role = "fused" if layer.op_type == "Add" else "shape_only"
            forward.append(forward_item(layer, (FREE_KERNEL, {}), settings, role=role))
            (fused if role == "fused" else shape_only).append(layer.name)
        else:
            forward.append(item)
        if not settings.training:
            continue
        grads = tuple(t.name in needs_grad for t in layer.inputs)
        if not any(grads):
            no_grad.append(layer.name)
            continue
        derived = backward.backward_items(layer, item, grads, settings.precision, dtypes)
        if scores_shape is not None:
            derived = [attention.without_scores_traffic(b, *scores_shape) for b in derived]
        if layer.name in training_only:
            derived = [replace(b, role=training_ops.ROLE) for b in derived]
        backward_items.extend(derived)
        if layer.name in fused_attention.recomputed:
            backward_items.append(replace(item, phase=Phase.BACKWARD, role="recompute"))
    optimizer = optimizer_items(graph.parameter_count, settings) if settings.training else ()
    return StepWork(
        forward=tuple(forward),
        backward=tuple(backward_items),
        optimizer=optimizer,
        shape_only=tuple(shape_only),
        fused=tuple(fused),
        no_grad=tuple(no_grad),
        parameter_count=graph.parameter_count,
        layers=graph.layers,
    )


def gradient_tensors(graph: ModelGraph) -> frozenset[str]:
    """Names of tensors that need a gradient: parameters and float tensors computed from them."""
    needs: set[str] = set()
    for layer in graph.layers:
        needs.update(layer.parameter_inputs)
    for layer in graph.layers:
        if any(t.name in needs for t in layer.inputs):
            needs.update(t.name for t in layer.outputs if t.dtype in FLOAT_DTYPES)
    return frozenset(needs)


def _by_layer(items: Sequence[WorkItem]) -> dict[str, list[WorkItem]]:
    out: dict[str, list[WorkItem]] = {}
    for item in items:
        out.setdefault(item.layer, []).append(item)
    return out


def forward_item(
    layer: Layer, kernel_and_dims: KernelDims, settings: TrainingSettings,
    role: str = "shape_only", dtypes: Mapping[str, str] = MappingProxyType({}),
) -> WorkItem:
    """The forward item of `layer`; `role` labels a free ("none") item. `dtypes` holds the
    run-time dtype of tensors autocast keeps apart from the compute dtype
    (`autocast.tensor_dtypes`)."""
    kernel, dims = kernel_and_dims
    if layer.family is OpFamily.SHAPE_ONLY or kernel == FREE_KERNEL:
        return WorkItem(
            layer=layer.name, family=layer.family, kernel="none", phase=Phase.FORWARD,
            dims=MappingProxyType(dict(dims)), dtype=item_dtype(layer, settings), flops=0,
            bytes_moved=0, op=layer.op_type, role=role,
        )
    return WorkItem(
        layer=layer.name,
        family=layer.family,
        kernel=kernel,
        phase=Phase.FORWARD,
        dims=MappingProxyType(dict(dims)),
        dtype=item_dtype(layer, settings, dtypes),
        flops=layer.flops,
        bytes_moved=_scaled_bytes(layer, settings, dtypes),
        op=backward.op_name(layer),
        role="fwd",
        attributes=backward.math_attributes(kernel, settings.precision),
    )


def split_gradient_item(layer: Layer, settings: TrainingSettings,
                        dtypes: Mapping[str, str]) -> WorkItem:
    """A Split run as views still has a backward kernel: `cat` of its slices' gradients into
    its input's, a contiguous read and write of every element (a copy pass)."""
    source = layer.inputs[0]
    fwd = forward_item(layer, (FREE_KERNEL, {}), settings, dtypes=dtypes)
    return replace(_copy_pass(source, fwd, flops_per_element=0), phase=Phase.BACKWARD,
                   bytes_moved=2 * source.elements * DTYPE_BYTES[fwd.dtype], role=backward.DGRAD)


def eval_mode_item(layer: Layer, item: WorkItem) -> WorkItem:
    """`item` as `model.eval()` runs it. A batch norm then normalises with its running
    statistics: no reduction over the batch, one per-channel affine pass (cuDNN's inference
    kernel), where the training kernel reads its input twice (statistics, then normalise)."""
    if layer.op_type != "BatchNormalization" or item.kernel != "batchnorm":
        return item
    return _copy_pass(layer.outputs[0], item, flops_per_element=2)


def copy_pass_item(layer: Layer, item: WorkItem) -> WorkItem:
    """A clone as eager PyTorch runs it: one elementwise copy (TensorIterator reads any
    strides), not a transpose-shaped memcpy."""
    return _copy_pass(layer.outputs[0], item, flops_per_element=0)


def _copy_pass(tensor: TensorInfo, item: WorkItem, flops_per_element: int) -> WorkItem:
    """`item` as one elementwise pass reading and writing every element of `tensor`."""
    return replace(item, family=OpFamily.ELEMENTWISE, kernel="elementwise",
                   dims=MappingProxyType(elementwise_dims(tensor, 1)), op=eager.COPY_PASS_OP,
                   flops=flops_per_element * tensor.elements)


def unit_item(
    layer: Layer, unit_kernel: frameworks.UnitKernel, settings: TrainingSettings
) -> WorkItem:
    """The one kernel of a fused unit, attributed to `layer` (the unit's sink or main layer)."""
    family = KERNEL_FAMILIES[unit_kernel.kernel].op_family
    return WorkItem(
        layer=layer.name, family=family, kernel=unit_kernel.kernel, phase=Phase.FORWARD,
        dims=MappingProxyType(dict(unit_kernel.dims)), dtype=settings.compute_dtype,
        flops=unit_kernel.flops,
        bytes_moved=unit_kernel.elements_moved * settings.activation_bytes,
        op=unit_kernel.op, role="fused_unit",
        attributes=backward.math_attributes(unit_kernel.kernel, settings.precision),
    )


def item_dtype(layer: Layer, settings: TrainingSettings,
               dtypes: Mapping[str, str] = MappingProxyType({})) -> str:
    """Compute dtype: the tensor's own for integer work; for float work the run-time dtype of
    its first float output under autocast, else the precision's."""
    own = [t.dtype for t in layer.outputs] or [t.dtype for t in layer.inputs]
    if own and all(d not in FLOAT_DTYPES for d in own):
        return own[0]
    for t in layer.outputs:
        if t.name in dtypes:
            return dtypes[t.name]
    return settings.compute_dtype


def _scaled_bytes(layer: Layer, settings: TrainingSettings,
                  dtypes: Mapping[str, str] = MappingProxyType({})) -> int:
    """The layer's bytes with float tensors stored at their run-time width: the autocast dtype
    `dtypes` gives (a lowered op reads its operands' half casts), else the activation width."""
    tensors = layer.inputs + layer.outputs
    as_built = sum(t.size_bytes for t in tensors)
    if as_built == 0:
        return layer.bytes_moved
    lowered = layer.op_type in precisions.AUTOCAST_LOWER_OPS

    def width(t: TensorInfo) -> int:
        if lowered or t.name not in dtypes:
            return settings.activation_bytes
        return DTYPE_BYTES[dtypes[t.name]]

    as_run = sum(
        t.elements * width(t) if t.dtype in FLOAT_DTYPES else t.size_bytes
        for t in tensors
    )
    return round(layer.bytes_moved * as_run / as_built)


def optimizer_items(parameter_count: int, settings: TrainingSettings) -> tuple[WorkItem, ...]:
    """Elementwise passes of one optimizer step over `parameter_count` fp32 master weights."""
    if parameter_count <= 0:
        return ()
    passes = _optimizer_passes(settings)
    rows = math.ceil(parameter_count / OPTIMIZER_CHUNK_ELEMENTS)
    items = []
    for op, reads, writes, flops_per_element in passes:
        moved = parameter_count * DTYPE_BYTES[MASTER_DTYPE] * (reads + writes)
        items.append(
            WorkItem(
                layer="optimizer",
                family=OpFamily.ELEMENTWISE,
                kernel="elementwise",
                phase=Phase.OPTIMIZER,
                dims=MappingProxyType(
                    {"rows": rows, "cols": OPTIMIZER_CHUNK_ELEMENTS, "operands": reads}
                ),
                dtype=MASTER_DTYPE,
                flops=parameter_count * flops_per_element,
                bytes_moved=moved,
                op=op,
                role=f"{settings.optimizer}_{op}",
            )
        )
    return tuple(items)


def _optimizer_passes(settings: TrainingSettings) -> list[tuple[str, int, int, int]]:
    """The elementwise passes of the update as `settings.optimizer_impl` runs it (a for-loop
    runs the foreach passes' arithmetic one tensor at a time: the same bytes, more launches,
    which the host model prices per tensor)."""
    if settings.optimizer_impl == options.FUSED_OPTIMIZER:
        return [FUSED_OPTIMIZER_PASS[settings.optimizer]]
    passes = list(OPTIMIZER_PASSES[settings.optimizer])
    if precisions.precision(settings.precision).grad_scaler:
        passes.insert(0, UNSCALE_PASS)
    return passes


def _default_kernel_dims() -> KernelDimsFn:
    from gpuplan_estimator.graph import (
        opcost,  # the graph work owns it; imported late to stay optional
    )

    fn: KernelDimsFn = opcost.kernel_dims
    return fn
