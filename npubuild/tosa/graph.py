"""Read a serialized TOSA 1.0 graph back: its operators (type, operands, kernel/stride) and tensors.

The support rules judge what the lowering actually emitted, and per-layer
performance needs the ONNX node behind each TOSA tensor; both read the
flatbuffer here rather than reaching into the serializer's internals.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field

import numpy as np
from tosa import Attribute, DType, Op
from tosa.ArgMaxAttribute import ArgMaxAttribute
from tosa.AvgPool2dAttribute import AvgPool2dAttribute
from tosa.Conv2dAttribute import Conv2dAttribute
from tosa.DepthwiseConv2dAttribute import DepthwiseConv2dAttribute
from tosa.MaxPool2dAttribute import MaxPool2dAttribute
from tosa.TosaGraph import TosaGraph
from tosa.TransposeConv2dAttribute import TransposeConv2dAttribute

OP_NAMES = {v: k for k, v in vars(Op.Op).items() if not k.startswith("_")}
DTYPE_NAMES = {v: k for k, v in vars(DType.DType).items() if not k.startswith("_")}
ATTR_NAMES = {v: k for k, v in vars(Attribute.Attribute).items() if not k.startswith("_")}
CONST_OPS = ("CONST", "CONST_SHAPE")  # constants are operators in a TOSA 1.0 flatbuffer; lowerings never list them
WINDOW_ATTRS = {"Conv2dAttribute": Conv2dAttribute, "DepthwiseConv2dAttribute": DepthwiseConv2dAttribute,
                "MaxPool2dAttribute": MaxPool2dAttribute, "AvgPool2dAttribute": AvgPool2dAttribute,
                "TransposeConv2dAttribute": TransposeConv2dAttribute, "ArgMaxAttribute": ArgMaxAttribute}


@dataclass
class TosaTensorInfo:
    name: str
    shape: tuple[int, ...]
    dtype: str
    is_const: bool


@dataclass
class TosaOpInfo:
    op: str
    inputs: list[str]
    outputs: list[str]
    attr: dict = field(default_factory=dict)  # kernel / stride / pad / dilation where the op has them


@dataclass
class TosaGraphInfo:
    ops: list[TosaOpInfo]
    tensors: dict[str, TosaTensorInfo]
    inputs: list[str]
    outputs: list[str]
    shapes: dict[str, tuple[int, ...]] = field(default_factory=dict)  # constant SHAPE operands (RESIZE, SLICE...)


def _window_attr(op) -> dict:
    name = ATTR_NAMES.get(op.AttributeType())
    cls = WINDOW_ATTRS.get(name or "")
    table = op.Attribute()
    if cls is None or table is None:
        return {}
    a = cls()
    a.Init(table.Bytes, table.Pos)
    out = {}
    for key in ("Kernel", "Stride", "Pad", "Dilation"):
        if hasattr(a, f"{key}Length"):
            out[key.lower()] = [int(getattr(a, key)(j)) for j in range(getattr(a, f"{key}Length")())]
    if hasattr(a, "Axis"):
        out["axis"] = int(a.Axis())
    return out


@functools.lru_cache(maxsize=4)
def read_tosa(data: bytes) -> TosaGraphInfo:
    """The graph's operators and tensors. Cached (the result is shared: read it, never change it): the lower
    stage reads each graph two or three times (node tensors, partition plan), and reading a flatbuffer in
    Python costs ~0.5 s for MobileViT-xxs."""
    g = TosaGraph.GetRootAs(bytearray(data), 0)
    block = g.Regions(0).Blocks(0)
    tensors = {}
    for i in range(block.TensorsLength()):
        t = block.Tensors(i)
        name = t.Name().decode()
        tensors[name] = TosaTensorInfo(name, tuple(int(t.Shape(j)) for j in range(t.ShapeLength())),
                                       DTYPE_NAMES.get(t.Type(), "UNKNOWN"), t.DataLength() > 0)
    ops = []
    for i in range(block.OperatorsLength()):
        o = block.Operators(i)
        ops.append(TosaOpInfo(OP_NAMES.get(o.Op(), "UNKNOWN"),
                              [o.Inputs(j).decode() for j in range(o.InputsLength())],
                              [o.Outputs(j).decode() for j in range(o.OutputsLength())], _window_attr(o)))
    shapes = {}
    for i in range(block.ShapesLength()):
        sh = block.Shapes(i)
        if sh.DataLength() > 0:
            shapes[sh.Name().decode()] = tuple(int(v) for v in np.frombuffer(sh.DataAsNumpy().tobytes(), "<i8"))
    return TosaGraphInfo(ops, tensors, [block.Inputs(j).decode() for j in range(block.InputsLength())],
                         [block.Outputs(j).decode() for j in range(block.OutputsLength())], shapes)


def ops_by_node(graph: TosaGraphInfo, node_ops: dict[str, list[str]]) -> dict[str, list[TosaOpInfo]]:
    """Split the graph's operators among ONNX nodes: the driver emits each node's ops contiguously, in order."""
    out: dict[str, list[TosaOpInfo]] = {}
    ops = [o for o in graph.ops if o.op not in CONST_OPS]
    i = 0
    for node, names in node_ops.items():
        chunk = ops[i:i + len(names)]
        if [o.op for o in chunk] != names:
            raise ValueError(f"TOSA operators do not line up with node '{node}'")
        out[node] = chunk
        i += len(names)
    return out


def tensor_nodes(by_node: dict[str, list[TosaOpInfo]]) -> dict[str, str]:
    """TOSA output tensor name -> the ONNX node whose lowering wrote it."""
    return {t: node for node, ops in by_node.items() for op in ops for t in op.outputs}
