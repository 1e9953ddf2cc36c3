"""Models quantised by other tools: QOperator graphs rewritten to the QDQ form the lowering reads.

onnxruntime's QOperator format (and TF/other exporters) write fused integer
ops: QLinearConv, QLinearMatMul, com.microsoft QLinearAdd... Each is exactly
DequantizeLinear on its inputs -> the float op -> QuantizeLinear on its
output, so that is what it is rewritten to (scales and zero points are the
op's own inputs; a QLinearConv bias is int32 with scale x_scale * w_scale).
Ops that already run on the integer tensors (MaxPool, Reshape, Transpose...)
stay as they are: the lowering carries the quantisation through them.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx
from onnx import helper, numpy_helper

from npubuild.errors import InputError

MS = "com.microsoft"


@dataclass(frozen=True)
class Rule:
    float_op: str
    triples: tuple[int, ...]  # input positions where an (x, scale, zero_point) triple starts
    out_scale: int  # input position of the output scale (zero point follows)
    variadic: bool = False  # QLinearConcat: (y_scale, y_zp, then triples...)
    bias: int | None = None  # input position of an int32 bias with scale x_scale * w_scale


RULES: dict[tuple[str, str], Rule] = {
    ("", "QLinearConv"): Rule("Conv", (0, 3), 6, bias=8),
    (MS, "QGemm"): Rule("Gemm", (0, 3), 7, bias=6),
    ("", "QLinearMatMul"): Rule("MatMul", (0, 3), 6),
    (MS, "QLinearAdd"): Rule("Add", (0, 3), 6),
    (MS, "QLinearMul"): Rule("Mul", (0, 3), 6),
    (MS, "QLinearSigmoid"): Rule("Sigmoid", (0,), 3),
    (MS, "QLinearLeakyRelu"): Rule("LeakyRelu", (0,), 3),
    (MS, "QLinearAveragePool"): Rule("AveragePool", (0,), 3),
    (MS, "QLinearGlobalAveragePool"): Rule("GlobalAveragePool", (0,), 3),
    (MS, "QLinearSoftmax"): Rule("Softmax", (0,), 3),
    (MS, "QLinearConcat"): Rule("Concat", (), 0, variadic=True),
}
DROP_ATTRS = {"channels_last", "opset"}  # QLinear-only attributes


def is_quantized(model: onnx.ModelProto) -> bool:
    """True if the model already carries its own quantisation (QDQ or QOperator)."""
    return any(n.op_type in ("QuantizeLinear", "DequantizeLinear") or (_domain(n), n.op_type) in RULES
               for n in model.graph.node)


def _domain(node: onnx.NodeProto) -> str:
    return "" if node.domain in ("", "ai.onnx") else node.domain


def to_qdq(model: onnx.ModelProto) -> onnx.ModelProto:
    """Rewrite every QLinear* node into DQ -> float op -> Q; other nodes are kept in order."""
    inits = {i.name: i for i in model.graph.initializer}
    new_nodes: list[onnx.NodeProto] = []
    new_inits: list[onnx.TensorProto] = []
    for node in model.graph.node:
        rule = RULES.get((_domain(node), node.op_type))
        if rule is None:
            new_nodes.append(node)
            continue
        name = node.name or f"{node.op_type}_{len(new_nodes)}"
        ins = list(node.input)
        if rule.variadic:
            y_scale, y_zp = ins[0], ins[1]
            triples = [tuple(ins[i:i + 3]) for i in range(2, len(ins), 3)]
        else:
            y_scale, y_zp = ins[rule.out_scale], ins[rule.out_scale + 1]
            triples = [tuple(ins[i:i + 3]) for i in rule.triples]
        float_ins = []
        for k, (x, s, zp) in enumerate(triples):
            out = f"{name}__dq{k}"
            axis = _per_axis(inits, s, node.op_type, k)
            new_nodes.append(helper.make_node("DequantizeLinear", [x, s, zp], [out], name=out,
                                              **({"axis": axis} if axis is not None else {})))
            float_ins.append(out)
        if rule.bias is not None and len(ins) > rule.bias and ins[rule.bias]:
            float_ins.append(_bias(name, node.op_type, ins, rule.bias, inits, new_nodes, new_inits))
        if not y_scale:
            raise InputError(f"node '{name}' ({node.op_type}): a float output is not supported (no output scale)")
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute if a.name not in DROP_ATTRS}
        if node.op_type == "QLinearGlobalAveragePool" and any(a.name == "channels_last" and a.i for a in node.attribute):
            raise InputError(f"node '{name}' ({node.op_type}): channels_last=1 is not supported")
        y = f"{name}__float"
        new_nodes.append(helper.make_node(rule.float_op, float_ins, [y], name=name, **attrs))
        new_nodes.append(helper.make_node("QuantizeLinear", [y, y_scale, y_zp], [node.output[0]], name=f"{name}__q"))
    del model.graph.node[:]
    model.graph.node.extend(new_nodes)
    model.graph.initializer.extend(new_inits)
    if not any(n.domain == MS for n in new_nodes):  # the com.microsoft ops are all rewritten
        keep = [o for o in model.opset_import if o.domain != MS]
        del model.opset_import[:]
        model.opset_import.extend(keep)
    return model


def _per_axis(inits: dict, scale: str, op: str, k: int) -> int | None:
    """Per-channel weight scales: axis 0 for Conv weights, 1 (columns) for MatMul's second operand."""
    t = inits.get(scale)
    if t is None or numpy_helper.to_array(t).size <= 1:
        return None
    if op == "QLinearConv" or (op == "QGemm" and k == 1):
        return 0  # Conv weights [O, I, kh, kw]; QGemm's B is quantised per output row when transB=1
    return 1 if (op == "QLinearMatMul" and k == 1) else None


def _bias(name: str, op: str, ins: list[str], index: int, inits: dict, nodes: list, new_inits: list) -> str:
    """An int32 bias (QLinearConv, QGemm) has scale x_scale * w_scale and zero point 0."""
    xs, ws = inits.get(ins[1]), inits.get(ins[4])
    if xs is None or ws is None:
        raise InputError(f"node '{name}' ({op}): input and weight scales must be constants")
    scale = (numpy_helper.to_array(xs).astype(np.float64) * numpy_helper.to_array(ws).astype(np.float64))
    scale = scale.astype(np.float32).reshape(-1)
    s_name, zp_name, out = f"{name}__bias_scale", f"{name}__bias_zp", f"{name}__bias"
    new_inits.append(numpy_helper.from_array(scale if scale.size > 1 else scale.reshape(()), s_name))
    new_inits.append(numpy_helper.from_array(np.zeros(scale.shape if scale.size > 1 else (), np.int32), zp_name))
    nodes.append(helper.make_node("DequantizeLinear", [ins[index], s_name, zp_name], [out], name=out,
                                  **({"axis": 0} if scale.size > 1 else {})))
    return out
