"""Import-time folding: constants (including Shape chains once shapes are static) and BatchNorm.

Constant folding evaluates any node whose inputs are all constants with ONNX's
reference evaluator (the specification's own semantics), so every op type is
folded the same way without a hand-written table.
"""

from __future__ import annotations

import numpy as np
import onnx
import onnx_ir as ir
from onnx.reference import ReferenceEvaluator

from npubuild.frontend.passes import register

MAX_FOLDED_ELEMENTS = 1 << 22
NON_DETERMINISTIC = {"RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike", "Multinomial", "Bernoulli"}
KEEP_FOR_QUANTISATION = {"QuantizeLinear", "DequantizeLinear"}


def _const(value: ir.Value | None) -> np.ndarray | None:
    if value is None:
        return None
    if value.const_value is None:
        return None
    return value.const_value.numpy()


def _static_shape(value: ir.Value) -> list[int] | None:
    if value.shape is None:
        return None
    dims = list(value.shape)
    if all(isinstance(d, int) for d in dims):
        return dims
    return None


def evaluate_node(node: ir.Node, inputs: list[np.ndarray | None], opset: int) -> list[np.ndarray]:
    proto = ir.serde.serialize_node(node)
    names_in = [f"in{i}" if v is not None else "" for i, v in enumerate(inputs)]
    names_out = [f"out{i}" for i in range(len(node.outputs))]
    del proto.input[:]
    proto.input.extend(names_in)
    del proto.output[:]
    proto.output.extend(names_out)
    graph = onnx.helper.make_graph([proto], "fold", [], [])
    model = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", opset)])
    feeds = {n: v for n, v in zip(names_in, inputs, strict=True) if n}
    # the one-node graph declares no outputs: name them, or run(None) returns nothing
    return ReferenceEvaluator(model).run(names_out, feeds)


@register("fold_constants")
class FoldConstants(ir.passes.InPlacePass):
    """Replace nodes computed only from constants by initializers; fold Shape of static tensors. Inside the
    branches of a data-dependent If and a Loop's body too (as that subgraph's initializers: shape inference
    reads no constant values from outer scopes), so shape inference gets through them, and if_select can tell
    whether both branches return one shape."""

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        opset = model.opset_imports.get("", 13)
        modified = False
        for sub in model.graph.subgraphs():
            modified |= _localise_small_constants(sub)
        for node in list(ir.traversal.RecursiveGraphIterator(model.graph)):
            if node.domain not in ("", "ai.onnx") or node.op_type in NON_DETERMINISTIC | KEEP_FOR_QUANTISATION:
                continue
            if node.op_type == "Shape":
                shape = _static_shape(node.inputs[0])
                if shape is None:
                    continue
                start = node.attributes.get_int("start", 0)
                end = node.attributes.get_int("end", len(shape))
                results = [np.asarray(shape[slice(start, end)], np.int64)]
            elif node.op_type == "Size" and _static_shape(node.inputs[0]) is not None:
                results = [np.asarray(int(np.prod(_static_shape(node.inputs[0]))), np.int64)]
            else:
                if node.op_type == "Constant":
                    pass
                elif not node.inputs or any(v is not None and _const(v) is None for v in node.inputs):
                    continue
                if any(isinstance(a, ir.Attr) and a.type in (ir.AttributeType.GRAPH, ir.AttributeType.GRAPHS)
                       for a in node.attributes.values()):
                    continue
                try:
                    results = evaluate_node(node, [_const(v) for v in node.inputs], opset)
                except Exception:  # the evaluator lacks this op or these types: leave it to the lowering
                    continue
            if any(np.asarray(r).size > MAX_FOLDED_ELEMENTS for r in results):
                continue
            for out, arr in zip(node.outputs, results, strict=True):
                arr = np.asarray(arr)
                if out.is_graph_output():
                    break
                name = out.name
                new = ir.Value(name=f"{name}__folded", const_value=ir.tensor(arr, name=f"{name}__folded"),
                               shape=ir.Shape(arr.shape), type=ir.TensorType(ir.DataType.from_numpy(arr.dtype)))
                node.graph.register_initializer(new)  # a subgraph keeps its own: inference reads it there
                ir.convenience.replace_all_uses_with(out, new)
            else:
                node.graph.remove(node, safe=True)
                modified = True
        return ir.passes.PassResult(model, modified)


MAX_LOCAL_CONSTANT = 64  # elements: shapes, axes, pads, starts; never weights


def _localise_small_constants(graph: ir.Graph) -> bool:
    """Integer constants of an outer graph that nodes of `graph` read (pads, shapes, axes: exporters share
    them across branches) copied into `graph`'s own initializers. ONNX's shape inference reads no values
    from outer scopes, so a branch's Pad or Reshape on an outer constant has unknown output shapes."""
    modified = False
    for node in graph:
        for i, v in enumerate(node.inputs):
            if v is None or v.const_value is None or v.graph is graph or v.graph is None:
                continue
            if v.dtype not in (ir.DataType.INT64, ir.DataType.INT32) or v.const_value.size > MAX_LOCAL_CONSTANT:
                continue
            name = f"{v.name}__local"
            local = graph.initializers.get(name)
            if local is None:
                local = ir.Value(name=name, const_value=v.const_value, shape=v.shape, type=v.type)
                graph.register_initializer(local)
            node.replace_input_with(i, local)
            modified = True
    return modified


@register("fold_batchnorm")
class FoldBatchNorm(ir.passes.InPlacePass):
    """Fold an inference BatchNormalization into the Conv, ConvTranspose or Gemm that alone feeds it."""

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        modified = False
        for bn in list(model.graph):
            if bn.op_type != "BatchNormalization" or len(bn.outputs) != 1 and any(o.uses() for o in bn.outputs[1:]):
                continue
            prod = bn.inputs[0].producer()
            if prod is None or prod.op_type not in ("Conv", "ConvTranspose", "Gemm") or len(bn.inputs[0].uses()) != 1:
                continue
            if bn.inputs[0].is_graph_output() or bn.outputs[0].is_graph_output():
                continue
            params = [_const(v) for v in bn.inputs[1:5]]
            w = _const(prod.inputs[1])
            if any(p is None for p in params) or w is None:
                continue
            if prod.op_type == "Gemm" and (prod.attributes.get_int("transA", 0) or
                                           prod.attributes.get_float("alpha", 1.0) != 1.0):
                continue
            gamma, beta, mean, var = (p.astype(np.float64) for p in params)
            eps = bn.attributes.get_float("epsilon", 1e-5)
            k = gamma / np.sqrt(var + eps)
            bias = _const(prod.inputs[2]) if len(prod.inputs) > 2 and prod.inputs[2] is not None else None
            if prod.op_type == "Gemm" and bias is not None and prod.attributes.get_float("beta", 1.0) != 1.0:
                continue
            n_out = k.shape[0]
            bias = np.zeros(n_out) if bias is None else np.broadcast_to(bias.astype(np.float64), (n_out,))
            if prod.op_type == "Conv":
                new_w = w.astype(np.float64) * k.reshape(-1, *([1] * (w.ndim - 1)))
            elif prod.op_type == "ConvTranspose":  # weights [C_in, C_out / group, k...]: output channel g * n + j
                group = prod.attributes.get_int("group", 1)
                per_in, per_out = w.shape[0] // group, w.shape[1]
                scale = k.reshape(group, 1, per_out).repeat(per_in, axis=1).reshape(w.shape[0], per_out)
                new_w = w.astype(np.float64) * scale.reshape(*scale.shape, *([1] * (w.ndim - 2)))
            elif prod.attributes.get_int("transB", 0):
                new_w = w.astype(np.float64) * k[:, None]
            else:
                new_w = w.astype(np.float64) * k[None, :]
            new_b = (bias - mean) * k + beta
            dtype = w.dtype
            w_val = _initializer(model, f"{prod.name}_bnfolded_W", new_w.astype(dtype))
            b_val = _initializer(model, f"{prod.name}_bnfolded_B", new_b.astype(dtype))
            if len(prod.inputs) > 2:
                prod.replace_input_with(1, w_val)
                prod.replace_input_with(2, b_val)
            else:
                prod.replace_input_with(1, w_val)
                _append_input(prod, b_val)
            ir.convenience.replace_all_uses_with(bn.outputs[0], prod.outputs[0])
            model.graph.remove(bn, safe=True)
            modified = True
        return ir.passes.PassResult(model, modified)


def _initializer(model: ir.Model, name: str, arr: np.ndarray) -> ir.Value:
    v = ir.Value(name=name, const_value=ir.tensor(arr, name=name), shape=ir.Shape(arr.shape),
                 type=ir.TensorType(ir.DataType.from_numpy(arr.dtype)))
    model.graph.register_initializer(v)
    return v


def _append_input(node: ir.Node, value: ir.Value) -> None:
    node.resize_inputs(len(node.inputs) + 1)
    node.replace_input_with(len(node.inputs) - 1, value)
