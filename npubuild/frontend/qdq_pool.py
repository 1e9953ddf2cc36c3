"""QDQ post-pass: an average pool's output keeps its input's quantisation, as TFLite's quantiser does.

onnxruntime calibrates an average pool's (GlobalAveragePool, AveragePool, or a ReduceMean over H and W with
keepdims) output on its own, so the lowering must change scale: Vela's
AVG_POOL2D then needs a RESCALE after it that rounds a second time, which is why the lowering sums exactly
in int32 instead (a TRANSPOSE + REDUCE_SUM + RESCALE on U85: MobileNetV3 block SE 37344 cycles against one
20696-cycle AVG_POOL2D in ExecuTorch's graph, bench/routes.md). A mean never leaves its input's range, so the
input's parameters represent it; with them the pool is one AVG_POOL2D that rounds once. Only activations
quantised per tensor, and an output whose parameters nothing else shares, are rewritten.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import numpy_helper

from npubuild.frontend.qdq_concat import SCALE_PRESERVING, _activation_keys, _scalar_int8, _values

AVERAGE_POOLS = frozenset({"GlobalAveragePool", "AveragePool"})


def _ranks(model: onnx.ModelProto) -> dict[str, int]:
    """The rank of every tensor shape inference knows."""
    graph = onnx.shape_inference.infer_shapes(model).graph
    return {v.name: len(v.type.tensor_type.shape.dim) for v in (*graph.input, *graph.value_info, *graph.output)
            if v.type.tensor_type.HasField("shape")}


def _is_plane_mean(node: onnx.NodeProto, inits: dict[str, onnx.TensorProto], ranks: dict[str, int]) -> bool:
    """A ReduceMean of a 4-D tensor over axes 2 and 3 with keepdims (torch's global average pool), which
    lowers as the pool."""
    if node.op_type != "ReduceMean" or ranks.get(node.input[0]) != 4:
        return False
    attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
    if not attrs.get("keepdims", 1):
        return False
    axes = attrs.get("axes")
    if axes is None and len(node.input) > 1 and node.input[1] in inits:
        axes = numpy_helper.to_array(inits[node.input[1]]).tolist()
    return axes is not None and sorted(a % 4 for a in axes) == [2, 3]


def _owned(model: onnx.ModelProto, pool: onnx.NodeProto, key: tuple[str, str]) -> bool:
    """Whether only the pool's output and values moved on from it (Flatten, Reshape...: onnxruntime gives them
    the same parameters) are quantised with `key`."""
    producer = {o: n for n in model.graph.node for o in n.output}
    q_outputs = set()
    for n in model.graph.node:
        if n.op_type == "QuantizeLinear" and key[0] in n.input[1:]:
            src = producer.get(n.input[0])
            if src is not pool and (src is None or src.op_type not in SCALE_PRESERVING):
                return False
            q_outputs.add(n.output[0])
    return all(n.input[0] in q_outputs for n in model.graph.node
               if n.op_type == "DequantizeLinear" and key[0] in n.input[1:])


def share_pool_scales(model: onnx.ModelProto) -> int:
    """Rewrite (in place) each average pool's output parameters to its input's; returns how many changed."""
    inits = {t.name: t for t in model.graph.initializer}
    dq_of, q_of = _activation_keys(model)
    ranks = _ranks(model) if any(n.op_type == "ReduceMean" for n in model.graph.node) else {}
    changed = 0
    for n in model.graph.node:
        if not n.output or (n.op_type not in AVERAGE_POOLS and not _is_plane_mean(n, inits, ranks)):
            continue
        src, out = dq_of.get(n.input[0]), q_of.get(n.output[0])
        if src is None or out is None or src == out or not (_scalar_int8(inits, src) and _scalar_int8(inits, out)):
            continue
        scale, zp = _values(inits, src)
        if _values(inits, out) == (scale, zp) or not _owned(model, n, out):
            continue
        for name, value in ((out[0], np.float32(scale)), (out[1], np.int8(zp))):
            old = numpy_helper.to_array(inits[name])
            inits[name].CopyFrom(numpy_helper.from_array(np.full(old.shape, value, old.dtype), name))
        changed += 1
    return changed
