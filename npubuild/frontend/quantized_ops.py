"""The op types the quantize stage asks onnxruntime to put Q/DQ around.

onnxruntime's own QDQ and QLinear registries, plus op types npubuild lowers in
int8 that onnxruntime leaves in float unless asked (its kernels for them are
float only). The second list is data here, not read from the lowering's
registry, so that the quantize stage (and its cache key) does not depend on
the lowering's code; a test holds it equal to what the op lowerings declare
with `registry.quantize_also`.
"""

from __future__ import annotations

QUANTIZE_ALSO = frozenset({
    "Abs", "ArgMin", "BiasGelu", "Ceil", "Celu", "Div", "Elu", "Erf", "Exp", "FastGelu", "Floor", "Gelu", "GlobalMaxPool", "GroupNormalization", "HardSigmoid", "HardSwish", "Hardmax",
    "Log", "LogSoftmax", "LpNormalization", "Max", "Mean", "Min", "Mish", "Neg", "PRelu", "Pow", "QuickGelu", "Reciprocal", "ReduceMax", "ReduceMean",
    "ReduceMin", "ReduceSum", "ReduceSumSquare", "ReduceL1", "ReduceL2", "ReduceLogSum", "ReduceLogSumExp",
    "ReduceProd", "RMSNormalization", "Round", "Selu", "Shrink", "Sign", "Softplus", "Softsign", "Sqrt", "Sub", "Sum", "Swish",
    "Tanh", "ThresholdedRelu", "TopK",
})


def quantized_op_types() -> list[str]:
    from onnxruntime.quantization.registry import QDQRegistry, QLinearOpsRegistry

    return sorted(set(QDQRegistry) | set(QLinearOpsRegistry) | QUANTIZE_ALSO)
