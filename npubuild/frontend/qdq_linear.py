"""QDQ post-pass: a constant-weight MatMul and its bias Add as one linear layer, like TFLite's FullyConnected.

onnxruntime quantises MatMul(x, W) + b (torch's Linear on rank-3 activations,
a transformer's projections) as two int8 ops: the MatMul's output is rounded to
its own int8 scale (a Q -> DQ pair) and the bias is an int8 constant added by a
second, elementwise op. On the NPU that is an extra ADD pass per layer, and a
lowering that folds the bias into the matrix product's int32 accumulator drifts
from that reference by the skipped rounding (see lowering/epilogue.py).

This pass removes the intermediate Q -> DQ pair and requantises the bias to
int32 at the accumulator's scale (s_x * s_w per output channel), so the QDQ
model itself computes int32 accumulate + int32 bias, then one rounding at the
Add's output: what a fully connected layer on the NPU computes, and closer to
the float model (one rounding fewer, a 32-bit bias instead of an 8-bit one).
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper, numpy_helper

from npubuild.frontend.graph_index import GraphIndex

Q, DQ = "QuantizeLinear", "DequantizeLinear"


def _dq_params(g: GraphIndex, dq: onnx.NodeProto) -> tuple[np.ndarray, np.ndarray, np.ndarray, int] | None:
    """(data, scale, zero point, axis) of a DequantizeLinear of an initializer, or None."""
    data = g.array(dq.input[0])
    scale = g.array(dq.input[1])
    if data is None or scale is None:
        return None
    zp = g.array(dq.input[2]) if len(dq.input) > 2 and dq.input[2] else np.zeros_like(scale, np.int64)
    if zp is None:
        return None
    axis = next((a.i for a in dq.attribute if a.name == "axis"), 1)
    return data, scale.astype(np.float64), zp.astype(np.int64), axis


def _weight_scales(g: GraphIndex, mm: onnx.NodeProto) -> np.ndarray | None:
    """Per-output-column scales of a MatMul's constant int8 2-D weight with zero point 0, or None."""
    dq = g.producer.get(mm.input[1])
    p = None if dq is None or dq.op_type != DQ else _dq_params(g, dq)
    if p is None:
        return None
    data, scale, zp, axis = p
    if data.dtype != np.int8 or data.ndim != 2 or np.any(zp != 0):
        return None
    n = data.shape[1]
    if scale.size == 1:
        return np.full(n, float(scale.reshape(-1)[0]))
    if scale.size == n and axis in (1, -1):
        return scale.reshape(n)
    return None


def _activation_scale(g: GraphIndex, name: str) -> float | None:
    """The per-tensor scale of an activation read through a DequantizeLinear, or None."""
    dq = g.producer.get(name)
    if dq is None or dq.op_type != DQ or dq.input[0] in g.inits:
        return None
    scale = g.array(dq.input[1])
    return None if scale is None or scale.size != 1 else float(scale.reshape(-1)[0])


def _bias(g: GraphIndex, name: str, n: int, float_bias: np.ndarray | None) -> np.ndarray | None:
    """The Add's constant operand as n real per-column values (the float model's if known), or None."""
    values = float_bias
    if values is None:
        values = g.array(name)
        dq = g.producer.get(name)
        if values is None and dq is not None and dq.op_type == DQ:
            p = _dq_params(g, dq)
            if p is not None and p[1].size == 1:
                values = (p[0].astype(np.float64) - p[2].reshape(-1)[0]) * p[1].reshape(-1)[0]
    if values is None or values.size != n or (values.ndim and values.shape[-1] != n):
        return None
    return np.asarray(values, np.float64).reshape(n)


def _float_biases(float_model: onnx.ModelProto | None) -> dict[str, tuple[str, ...]]:
    """Add output name -> its operands in the float model (to read the bias before int8 quantisation)."""
    if float_model is None:
        return {}
    return {n.output[0]: tuple(n.input) for n in float_model.graph.node if n.op_type == "Add"}


def fold_linear_bias(qdq: onnx.ModelProto, float_model: onnx.ModelProto | None = None) -> int:
    """Rewrite every MatMul(x, W const) -> Q -> DQ -> Add(., b const) -> Q in place; returns how many.

    The bias becomes DequantizeLinear(int32, s_x * s_w) read by the Add straight from the MatMul.
    """
    g = GraphIndex(qdq)
    float_inits = {i.name: i for i in float_model.graph.initializer} if float_model is not None else {}
    float_adds = _float_biases(float_model)
    inserts: dict[str, onnx.NodeProto] = {}  # Add output -> its int32 bias DequantizeLinear (first in the graph)
    removed: set[str] = set()  # outputs of the Q/DQ nodes bypassed
    for mm in list(g.graph.node):
        if mm.op_type != "MatMul":
            continue
        s_w = _weight_scales(g, mm)
        s_x = _activation_scale(g, mm.input[0])
        q = g.only_user(mm.output[0], Q)
        dq = q and g.only_user(q.output[0], DQ)
        add = dq and g.only_user(dq.output[0], "Add")
        if s_w is None or s_x is None or add is None or len(add.input) != 2:
            continue
        side = list(add.input).index(dq.output[0])
        users = g.consumers.get(add.output[0], [])
        if add.output[0] in g.outputs or len(users) != 1 or users[0].op_type != Q:
            continue
        float_operand = float_adds.get(add.output[0], ("", ""))[1 - side]
        float_bias = numpy_helper.to_array(float_inits[float_operand]) if float_operand in float_inits else None
        real = _bias(g, add.input[1 - side], s_w.size, float_bias)
        if real is None:
            continue
        inserts[add.output[0]] = _rewrite(g, q, add, side, real, (s_x * s_w).astype(np.float32))
        removed |= {q.output[0], dq.output[0]}
    if inserts:  # one rebuild of the node list: the rewritten Adds were edited in place above
        kept = [n for n in g.graph.node if n.output[0] not in removed]
        nodes = [onnx.NodeProto.FromString(n.SerializeToString()) for n in [*inserts.values(), *kept]]
        del g.graph.node[:]
        g.graph.node.extend(nodes)
        _drop_unused(g.graph)
    return len(inserts)


def _rewrite(g: GraphIndex, q: onnx.NodeProto, add: onnx.NodeProto, side: int, real: np.ndarray,
             scale: np.ndarray) -> onnx.NodeProto:
    """Point the Add at the MatMul itself and add its int32 bias constants; returns the bias DequantizeLinear."""
    stem = add.output[0]
    values = np.clip(np.round(real / scale.astype(np.float64)), -(2**31), 2**31 - 1).astype(np.int32)
    per_channel = not np.all(scale == scale[0])
    s = scale if per_channel else np.array(scale[0], np.float32)
    names = (f"{stem}_bias_int32", f"{stem}_bias_int32_scale", f"{stem}_bias_int32_zero_point")
    g.graph.initializer.extend([numpy_helper.from_array(values, names[0]), numpy_helper.from_array(s, names[1]),
                                numpy_helper.from_array(np.zeros(s.shape, np.int32), names[2])])
    bias_dq = helper.make_node(DQ, list(names), [f"{stem}_bias_int32_dq"], name=f"{stem}_bias_int32_dq",
                               **({"axis": 0} if per_channel else {}))
    add.input[side] = q.input[0]
    add.input[1 - side] = bias_dq.output[0]
    return bias_dq


def _drop_unused(graph: onnx.GraphProto) -> None:
    """Remove nodes whose outputs nothing reads (the old int8 bias DQs) and initializers no node reads."""
    while True:
        read = {name for n in graph.node for name in n.input} | {o.name for o in graph.output}
        dead = [n for n in graph.node if not any(o in read for o in n.output)]
        if not dead:
            break
        for n in dead:
            graph.node.remove(n)
    read = {name for n in graph.node for name in n.input}
    keep = [i for i in graph.initializer if i.name in read]
    del graph.initializer[:]
    graph.initializer.extend(keep)
