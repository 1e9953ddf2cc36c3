"""Rewrite, at import, forms that onnxruntime's quantiser fails on into the same function in a form it takes.

- Gemm with a constant bias C of shape [1, N], [1] or a scalar: onnxruntime's QDQ Gemm handler quantises C
  as a per-channel vector and fails on those shapes; C broadcast to [N] is the same Gemm.
- LayerNormalization over more than one axis (axis other than -1) or with a scale/bias smaller than the
  normalised shape (broadcast): the quantiser's LayerNormalization handler fails on a scale of rank > 1
  ("The truth value of an array with more than one element is ambiguous"). Reshaped to [..., K] (the
  trailing axes merged), normalised along the last axis with scale and bias broadcast to [K], and reshaped
  back, it is the same function, and the lowering's one-axis layer norm applies. When its Mean or
  InvStdDev output is read, it is written out as the ONNX function body instead (ReduceMean, Sub, Mul,
  ReduceMean, Add, Sqrt, Reciprocal, Mul, Mul, Add), which onnxruntime quantises node by node.
- Cast to the type its input already has (exporters write float32 -> float32 Casts for stash_type):
  onnxruntime leaves a Cast unquantised, so its input would reach the int8 graph as a float; it is the
  identity and is dropped.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from npubuild.frontend.passes import register
from npubuild.frontend.passes._rewrite import replace_value


def _const(value: ir.Value | None) -> np.ndarray | None:
    if value is None or value.const_value is None:
        return None
    return value.const_value.numpy()


def _initializer(graph: ir.Graph, name: str, arr: np.ndarray) -> ir.Value:
    v = ir.Value(name=name, const_value=ir.tensor(arr, name=name), shape=ir.Shape(arr.shape),
                 type=ir.TensorType(ir.DataType.from_numpy(arr.dtype)))
    graph.register_initializer(v)
    return v


def _gemm_bias(graph: ir.Graph, node: ir.Node) -> bool:
    c = _const(node.inputs[2]) if len(node.inputs) > 2 else None
    w = _const(node.inputs[1])
    if c is None or w is None or w.ndim != 2 or c.ndim > 2 or (c.ndim == 1 and c.size != 1):
        return False
    n = w.shape[0] if node.attributes.get_int("transB", 0) else w.shape[1]
    if c.ndim == 1 and c.shape[0] == n:
        return False  # already the vector (a Gemm of one output unit): rewriting it again would never end
    if c.ndim == 2 and (c.shape[0] != 1 or c.shape[1] not in (1, n)):
        return False
    vector = np.ascontiguousarray(np.broadcast_to(c.reshape(-1), (n,)).astype(c.dtype))
    node.replace_input_with(2, _initializer(graph, f"{node.name or 'gemm'}_bias_vector", vector))
    return True


def _expand_layer_norm(graph: ir.Graph, node: ir.Node, opset: int) -> bool:
    """The LayerNormalization function body, so that its Mean and InvStdDev outputs are ordinary tensors."""
    x = node.inputs[0]
    rank = len(x.shape)
    axis = node.attributes.get_int("axis", -1)
    axes = list(range(axis + rank if axis < 0 else axis, rank))
    name = node.name or "layer_norm"
    made: list[ir.Node] = []

    def op(op_type: str, inputs: list[ir.Value | None], **attrs) -> ir.Value:
        out = ir.Value(name=f"{name}_{op_type.lower()}_{len(made)}")
        made.append(ir.node(op_type, inputs, attrs, outputs=[out], name=f"{name}_{op_type}_{len(made)}"))
        return out

    def mean(t: ir.Value) -> ir.Value:
        if opset >= 18:
            return op("ReduceMean", [t, _initializer(graph, f"{name}_axes_{len(made)}", np.array(axes, np.int64))],
                      keepdims=1)
        return op("ReduceMean", [t], axes=axes, keepdims=1)

    eps = np.array(node.attributes.get_float("epsilon", 1e-5), np.float32)
    mu = mean(x)
    d = op("Sub", [x, mu])
    var = mean(op("Mul", [d, d]))
    inv = op("Reciprocal", [op("Sqrt", [op("Add", [var, _initializer(graph, f"{name}_eps", eps)])])])
    y = op("Mul", [op("Mul", [d, inv]), node.inputs[1]])
    if len(node.inputs) > 2 and node.inputs[2] is not None:
        y = op("Add", [y, node.inputs[2]])
    graph.insert_before(node, made)
    for out, new in zip(node.outputs, (y, mu, inv), strict=False):
        replace_value(out, new)
    graph.remove(node, safe=True)
    return True


def _same_type_cast(graph: ir.Graph, node: ir.Node) -> bool:
    x, out = node.inputs[0], node.outputs[0]
    if x is None or x.type is None or out.type is None or x.dtype != out.dtype or x.is_graph_input() and \
            out.is_graph_output():
        return False
    replace_value(out, x)
    graph.remove(node, safe=True)
    return True


def _layer_norm(graph: ir.Graph, node: ir.Node, opset: int) -> bool:
    x = node.inputs[0]
    if x is None or x.shape is None or not all(isinstance(d, int) for d in x.shape):
        return False
    if any(o.uses() or o.is_graph_output() for o in node.outputs[1:]):
        return _expand_layer_norm(graph, node, opset)
    shape = list(x.shape)
    axis = node.attributes.get_int("axis", -1)
    axis = axis + len(shape) if axis < 0 else axis
    trailing = shape[axis:]
    k = int(np.prod(trailing))
    params = []
    for i in (1, 2):
        v = _const(node.inputs[i]) if i < len(node.inputs) and node.inputs[i] is not None else None
        if i < len(node.inputs) and node.inputs[i] is not None and v is None:
            return False
        params.append(v)
    if axis == len(shape) - 1 and all(p is None or p.shape == (k,) for p in params):
        return False  # already the one-axis form
    name = node.name or "layer_norm"
    flat = [np.ascontiguousarray(np.broadcast_to(p, trailing).reshape(k)) if p is not None else None for p in params]
    ins = [None, _initializer(graph, f"{name}_scale_flat", flat[0])]
    if flat[1] is not None:
        ins.append(_initializer(graph, f"{name}_bias_flat", flat[1]))
    merged = ir.Value(name=f"{name}_rows")
    normed = ir.Value(name=f"{name}_rows_normed")
    reshape_in = ir.node("Reshape", [x, _initializer(graph, f"{name}_rows_shape", np.array([*shape[:axis], k], np.int64))],
                         outputs=[merged], name=f"{name}_to_rows")
    ins[0] = merged
    norm = ir.node("LayerNormalization", ins, {"axis": -1, "epsilon": node.attributes.get_float("epsilon", 1e-5)},
                   outputs=[normed], name=f"{name}_rows_norm")
    out = node.outputs[0]
    back = ir.node("Reshape", [normed, _initializer(graph, f"{name}_back_shape", np.array(shape, np.int64))],
                   name=f"{name}_from_rows")
    graph.insert_before(node, [reshape_in, norm, back])
    out_name = out.name
    replace_value(out, back.outputs[0])
    back.outputs[0].name = out_name
    graph.remove(node, safe=True)
    return True


@register("quantiser_forms")
class QuantiserForms(ir.passes.InPlacePass):
    def call(self, model: ir.Model) -> ir.passes.PassResult:
        modified = False
        for node in list(model.graph):
            if node.domain not in ("", "ai.onnx"):
                continue
            if node.op_type == "Gemm" and len(node.inputs) > 2:
                modified |= _gemm_bias(model.graph, node)
            elif node.op_type == "LayerNormalization":
                modified |= _layer_norm(model.graph, node, model.opset_imports.get("", 17))
            elif node.op_type == "Cast":
                modified |= _same_type_cast(model.graph, node)
        return ir.passes.PassResult(model, modified)
