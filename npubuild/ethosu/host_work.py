"""The multiply-accumulates a host partition's nodes do, from the model's inferred shapes.

npubuild runs no Cortex-M, so a host part's time is not measured and not estimated (`inference_ms` is the
NPU's). What can be counted exactly is its arithmetic: a kept-float filterbank's 257 x 32 MatMul over 8 frames
is 65 792 multiply-accumulates, which a reader can weigh against the CPU they have. Counted for the ops whose
work is multiply-accumulates (MatMul, Gemm, Conv, ConvTranspose, LRN's window sums); an elementwise or data
movement op counts 0; a node whose shapes did not infer (or an If or Loop left whole) counts None: unknown, not
zero.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import onnx

Infos = Mapping[str, onnx.ValueInfoProto]
CONTROL_FLOW = frozenset({"If", "Loop", "Scan"})


def _shape(infos: Infos, name: str) -> tuple[int, ...] | None:
    """The tensor's static shape, or None where a dim is unknown."""
    vi = infos.get(name)
    if vi is None or not vi.type.tensor_type.HasField("shape"):
        return None
    dims = [d.dim_value if d.HasField("dim_value") else None for d in vi.type.tensor_type.shape.dim]
    return None if any(d is None for d in dims) else tuple(int(d) for d in dims)


def _attr(node: onnx.NodeProto, name: str, default: int) -> int:
    return next((int(onnx.helper.get_attribute_value(a)) for a in node.attribute if a.name == name), default)


def node_macs(node: onnx.NodeProto, infos: Infos) -> int | None:
    """The node's multiply-accumulates (0 for an op that does none), None where its shapes are not known."""
    if node.op_type in CONTROL_FLOW:
        return None
    if node.op_type not in ("MatMul", "Gemm", "Conv", "ConvTranspose", "LRN"):
        return 0
    out = _shape(infos, node.output[0])
    a = _shape(infos, node.input[0])
    if out is None or a is None:
        return None
    size = math.prod(out)
    if node.op_type == "MatMul":
        return size * a[-1] if a else None
    if node.op_type == "Gemm":
        return size * (a[0] if _attr(node, "transA", 0) else a[-1]) if len(a) == 2 else None
    if node.op_type == "LRN":
        return size * _attr(node, "size", 1)
    w = _shape(infos, node.input[1])
    if w is None or len(w) < 3:
        return None
    if node.op_type == "Conv":  # weights [O, C / group, k...]
        return size * w[1] * math.prod(w[2:])
    return math.prod(a) * w[1] * math.prod(w[2:])  # ConvTranspose: weights [C, O / group, k...]

