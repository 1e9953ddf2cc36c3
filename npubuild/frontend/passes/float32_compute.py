"""float16 / bfloat16 models computed in float32, at import (the first pass: every later step sees float32).

A model shared in half precision (its weights and arithmetic float16, often with float32 Casts at its
inputs and outputs) cannot be quantised as it is: onnxruntime's quantiser and the lowering work on float32,
and a float16 node left over became a host partition onnxruntime then refused to load. Its int8 build only
needs the function, and float32 holds every float16 and bfloat16 value exactly: initializers, Constant and
ConstantOfShape values, Cast targets, dtype attributes and every value's type become float32. The
arithmetic then rounds less than the half-precision original did (relative 1e-3 at most), far under int8's
own step; the reports measure against this float32 model.

Only a model that holds half-precision data (an initializer, a Constant or a graph input) is one: a float32
model whose Cast to float16 or bfloat16 rounds on purpose (ONNX's Cast node tests) keeps that Cast.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from npubuild.frontend.passes import register

HALF = (ir.DataType.FLOAT16, ir.DataType.BFLOAT16)
FLOAT = ir.DataType.FLOAT


def _widened(t: ir.TensorProtocol) -> ir.Tensor:
    return ir.tensor(t.numpy().astype(np.float32), name=t.name)


def _widen_value(v: ir.Value | None) -> bool:
    if v is None or v.dtype not in HALF:
        return False
    v.dtype = FLOAT
    if v.const_value is not None:
        v.const_value = _widened(v.const_value)
    return True


def _widen_node(node: ir.Node) -> bool:
    changed = False
    for key, attr in list(node.attributes.items()):
        if key in ("to", "dtype") and attr.type == ir.AttributeType.INT and attr.value in (d.value for d in HALF):
            node.attributes[key] = ir.AttrInt64(key, FLOAT.value)  # Cast, RandomNormal, EyeLike...
            changed = True
        elif attr.type == ir.AttributeType.TENSOR and attr.value.dtype in HALF:  # Constant, ConstantOfShape
            node.attributes[key] = ir.AttrTensor(key, _widened(attr.value))
            changed = True
    for v in node.outputs:
        changed |= _widen_value(v)
    return changed


def _holds_half_data(graph: ir.Graph) -> bool:
    """Whether the graph's weights, constants or inputs are float16 / bfloat16: a half-precision model."""
    if any(v.dtype in HALF for v in [*graph.inputs, *graph.initializers.values()]):
        return True
    return any(node.op_type == "Constant" and any(a.type == ir.AttributeType.TENSOR and a.value.dtype in HALF
                                                  for a in node.attributes.values()) for node in graph)


@register("float32_compute")
class Float32Compute(ir.passes.InPlacePass):
    def call(self, model: ir.Model) -> ir.passes.PassResult:
        graphs = [model.graph, *model.graph.subgraphs()]
        if not any(_holds_half_data(g) for g in graphs):
            return ir.passes.PassResult(model, False)
        modified = False
        for graph in graphs:
            for v in [*graph.inputs, *graph.outputs, *graph.initializers.values()]:
                modified |= _widen_value(v)
            for node in graph:
                modified |= _widen_node(node)
        return ir.passes.PassResult(model, modified)
