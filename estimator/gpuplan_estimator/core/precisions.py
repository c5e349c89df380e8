"""What each training precision means: the one registry (issue #30 part 2).

Element sizes, the math a GEMM and a convolution run in, whether torch.autocast is on (fp32
master weights, per-step casts, ops it keeps in fp32) and which catalog peak a precision needs.
`options.PRECISIONS`, the step decomposition, the memory model, the roofline, the device
catalog's support check and the parallelism inputs read these facts from here, and
tests/unit/estimator/test_precisions.py checks that each agrees.

"fp32" is what PyTorch does by default on NVIDIA GPUs: matmuls in true fp32
(`torch.backends.cuda.matmul.allow_tf32 = False`) but cuDNN convolutions in TF32
(`torch.backends.cudnn.allow_tf32 = True`) on GPUs that have TF32 (Ampere and later). "tf32"
turns matmul TF32 on too; "fp32-ieee" turns cuDNN's off too (IEEE float32 everywhere, what
`torch.backends.cudnn.allow_tf32 = False` asks for reproducibility). "bf16"/"fp16" are
`torch.autocast` over fp32 weights, with PyTorch's default TF32 switches for what autocast
leaves in fp32.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

TF32_MATH = "tf32"
"""The `math` attribute of a float32 GEMM or convolution run on TF32 tensor cores."""
TF32_DIM = "math_tf32"
"""The dim a measurement row sets to 1 when it ran with `TF32_MATH` (dims are the only
free-form part of a row's key, so a shape's fp32 and tf32 rows stay apart)."""


@dataclass(frozen=True)
class Precision:
    """One training precision, as PyTorch runs it."""

    name: str
    compute_dtype: str
    """ONNX dtype of activations and of the kernels autocast lowers (GEMMs, convolutions)."""
    activation_bytes: int
    """Bytes per element in `compute_dtype`."""
    autocast: bool
    """torch.autocast mixed precision: fp32 master weights cast every step, some ops kept in
    fp32 (`AUTOCAST_FP32_OPS`)."""
    gemm_math: str
    """"tf32" when float32 matmuls run on TF32 tensor cores, else "" (true fp32 or the
    compute dtype's own tensor cores)."""
    conv_math: str
    """The same for float32 convolutions (cuDNN's TF32 switch, on by default)."""
    needs_peak: str | None
    """The catalog peak (`DeviceSpec.peak_tflops` key) a device needs to run this precision;
    None when every device runs it."""
    grad_scaler: bool
    """Loss scaling: fp16 unscales its gradients every step (bf16's range needs none)."""
    master_dtype: str = "float32"
    """Weights, gradients and optimizer state: fp32 in every precision here."""

    def math_of(self, kernel: str) -> str:
        """The `math` attribute a float32 `kernel` runs with ("" for none)."""
        if kernel == "gemm":
            return self.gemm_math
        if kernel == "conv2d":
            return self.conv_math
        return ""


PRECISION_TABLE: Mapping[str, Precision] = MappingProxyType({
    "fp32": Precision("fp32", "float32", 4, autocast=False, gemm_math="", conv_math=TF32_MATH,
                      needs_peak=None, grad_scaler=False),
    "fp32-ieee": Precision("fp32-ieee", "float32", 4, autocast=False, gemm_math="",
                           conv_math="", needs_peak=None, grad_scaler=False),
    "tf32": Precision("tf32", "float32", 4, autocast=False, gemm_math=TF32_MATH,
                      conv_math=TF32_MATH, needs_peak="tf32", grad_scaler=False),
    "fp16": Precision("fp16", "float16", 2, autocast=True, gemm_math="", conv_math=TF32_MATH,
                      needs_peak=None, grad_scaler=True),
    "bf16": Precision("bf16", "bfloat16", 2, autocast=True, gemm_math="", conv_math=TF32_MATH,
                      needs_peak="bf16", grad_scaler=False),
})
"""Every precision a request may name, in `options.PRECISIONS` order."""

AUTOCAST_LOWER_OPS = frozenset({
    "MatMul", "Gemm", "Conv", "ConvTranspose", "FusedMatMul", "Attention",
    "MultiHeadAttention", "Einsum"})
"""ONNX op types autocast runs in the half dtype (PyTorch's lower-precision list: mm, bmm,
addmm, baddbmm, linear, conv*, scaled_dot_product_attention): their float inputs are cast."""

AUTOCAST_FP32_OPS = frozenset({
    "Softmax", "LogSoftmax", "LayerNormalization", "GroupNormalization",
    "SimplifiedLayerNormalization", "RMSNormalization", "ReduceSum", "ReduceLogSumExp",
    "ReduceProd", "ReduceL2", "CumSum", "Pow", "Exp", "Log", "Sqrt", "Reciprocal", "Softplus",
    "SoftmaxCrossEntropyLoss", "NegativeLogLikelihoodLoss"})
"""ONNX op types autocast runs in fp32 (PyTorch's fp32 list: softmax, log_softmax, layer_norm,
group_norm, norms, sum, prod, cumsum, logsumexp, pow, exp, log, rsqrt (exported as
Reciprocal(Sqrt)), reciprocal, softplus, the losses): their half inputs are cast up and their
outputs are fp32. `mean`, `erf` and `gelu` are not on it: they run in their input's dtype."""

AUTOCAST_INPUT_DTYPE_OPS = frozenset({"BatchNormalization", "InstanceNormalization"})
"""ONNX op types that run in their data input's dtype whatever their parameters': PyTorch's
batch norm (instance norm runs through it) takes a half input with fp32 weight, bias and
running statistics and returns the input's dtype, so a CNN's conv → batch norm → ReLU chain
stays half under autocast. Every op on none of the three lists runs in the widest float dtype
of its operands."""


def precision(name: str) -> Precision:
    """The registry entry of `name`; KeyError for an unknown one (callers validate first)."""
    return PRECISION_TABLE[name]
