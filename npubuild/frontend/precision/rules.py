"""Which ops read and write 16-bit activations on which Ethos-U family: the lowering's int16 forms
(tests/lowering/test_int16.py has one test per family of them, compiled by Vela and run on npu-sim) and Vela
5.2's TOSA constraints (`vela --supported-ops-report`; measured where the report and Vela disagree).

Measured on Vela 5.2: int16 MATMUL of two activations runs on U85 only (U55/U65 "MatMul could not run on
NPU"); an int16 TABLE compiles on U55/U65 too (six NPU ops, bit-exact in npu-sim), although the report lists
TABLE as int8 only there; 16x4 (int16 activation, int4 weights) exists on no family (the lowering then stores
the int4 weights as int8, the same integers). An op not listed here has no int16 form: a 16-bit input reaches
it through an int8 copy (a convert) and its output stays int8.
"""

from __future__ import annotations

from collections.abc import Iterable

import onnx

# read and write int16 on every family
EVERYWHERE = frozenset({
    "Conv", "ConvTranspose", "Gemm", "BatchNormalization",
    "Add", "Sub", "Mul", "Sum", "Mean", "Min", "Max",
    "Relu", "Clip", "LeakyRelu", "PRelu", "Sigmoid", "Tanh", "Exp", "Log", "Erf", "Gelu", "Sqrt", "Reciprocal",
    "Abs", "Neg", "Pow", "HardSigmoid", "HardSwish", "Elu", "Selu", "Celu", "Softplus", "Softsign", "Mish",
    "Swish", "ThresholdedRelu", "Shrink", "Sign", "Floor", "Ceil", "Round",
    "com.microsoft:Gelu", "com.microsoft:FastGelu", "com.microsoft:BiasGelu", "com.microsoft:QuickGelu",
    "MaxPool", "GlobalMaxPool", "AveragePool", "GlobalAveragePool", "Resize",
    "Reshape", "Transpose", "Squeeze", "Unsqueeze", "Flatten", "Identity", "Slice", "Split", "Pad",
    "DepthToSpace", "SpaceToDepth", "Concat", "Tile", "Expand", "Dropout", "Gather",
    "ReduceMax", "ReduceMin", "ReduceMean", "ReduceSum",
    "Softmax",
})
U85_ONLY = frozenset({"MatMul"})  # two activations (a constant-weight MatMul is a fully connected layer)
U85_FAMILIES = frozenset({"u85", "u85wide"})
WRITE_ONLY = frozenset({"Div"})  # general Div: its operands int8 (reciprocal tables of 256 codes), output any


def _key(node: onnx.NodeProto) -> str:
    return node.op_type if node.domain in ("", "ai.onnx") else f"{node.domain}:{node.op_type}"


def _constant_weight(node: onnx.NodeProto, constants: set[str]) -> bool:
    return len(node.input) > 1 and node.input[1] in constants


def reads_int16(node: onnx.NodeProto, index: int, families: Iterable[str], constants: set[str]) -> bool:
    """Whether input `index` of `node` may be an int16 activation on every one of `families`. `constants` are
    the tensors that are constant (initializers and DequantizeLinears of them)."""
    key = _key(node)
    if key in EVERYWHERE:
        return True
    if key == "MatMul":
        return _constant_weight(node, constants) or set(families) <= U85_FAMILIES
    if key == "Div":
        return index == 0 and len(node.input) > 1 and node.input[1] in constants  # a constant divisor: a Mul
    return False


def writes_int16(node: onnx.NodeProto, families: Iterable[str], constants: set[str]) -> bool:
    """Whether `node`'s output may be an int16 activation on every one of `families` (a MatMul's int32 or
    int48 product rescales to int16 on every family, whatever its operands)."""
    del families, constants  # no op writes int16 on one family and not another (yet)
    key = _key(node)
    return key in EVERYWHERE or key in WRITE_ONLY or key == "MatMul"
