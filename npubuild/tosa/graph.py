"""Read a serialized TOSA 1.0 graph back: its operators (type, operands, kernel/stride) and tensors.

The support rules judge what the lowering actually emitted, and per-layer
performance needs the ONNX node behind each TOSA tensor; both read the
flatbuffer here rather than reaching into the serializer's internals.
"""

from __future__ import annotations

import functools
import struct
from dataclasses import dataclass, field

import numpy as np
from tosa import Attribute, DType, Op

OP_NAMES = {v: k for k, v in vars(Op.Op).items() if not k.startswith("_")}
DTYPE_NAMES = {v: k for k, v in vars(DType.DType).items() if not k.startswith("_")}
ATTR_NAMES = {v: k for k, v in vars(Attribute.Attribute).items() if not k.startswith("_")}
CONST_OPS = ("CONST", "CONST_SHAPE")  # constants are operators in a TOSA 1.0 flatbuffer; lowerings never list them


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


_U8, _U16, _U32, _I32 = struct.Struct("<B"), struct.Struct("<H"), struct.Struct("<I"), struct.Struct("<i")

# The flatbuffer fields read, by their position in the table (0, 1, 2...: the schema's field order, tosa.fbs, which
# the generated tosa/*.py read as vtable slot 4 + 2 * position)
REGIONS = BLOCKS = 1  # TosaGraph.regions, TosaRegion.blocks
BLOCK_OPERATORS, BLOCK_TENSORS, BLOCK_INPUTS, BLOCK_OUTPUTS, BLOCK_SHAPES = 1, 2, 3, 4, 5
NAME = 0  # TosaTensor.name, TosaShape.name
TENSOR_SHAPE, TENSOR_TYPE, TENSOR_DATA = 1, 2, 3
OP_OP, OP_ATTRIBUTE_TYPE, OP_ATTRIBUTE, OP_INPUTS, OP_OUTPUTS = 0, 1, 2, 3, 4
SHAPE_DATA = 2
# window attributes: the fields kept (in this order) and their positions; ArgMax's axis is an int32 at 0
WINDOW_FIELDS = {"Conv2dAttribute": {"stride": 1, "pad": 0, "dilation": 2},
                 "DepthwiseConv2dAttribute": {"stride": 1, "pad": 0, "dilation": 2},
                 "MaxPool2dAttribute": {"kernel": 0, "stride": 1, "pad": 2},
                 "AvgPool2dAttribute": {"kernel": 0, "stride": 1, "pad": 2},
                 "TransposeConv2dAttribute": {"stride": 1}}
WINDOW_TYPES = {k: v for k, v in ATTR_NAMES.items() if v in WINDOW_FIELDS or v == "ArgMaxAttribute"}


class _Reader:
    """Flatbuffer tables read straight from the bytes with struct, one vtable read per table: the generated
    accessors (a dozen Python calls per field) took ~0.07 s for a 1.3 MB graph of a thousand tensors and
    operators (0.25 s profiled, six times per palm build's lower stage), this ~0.01 s."""

    def __init__(self, data: bytes) -> None:
        self.data = data

    def fields(self, table: int) -> list[int]:
        """Where each field of the table at `table` is, by its position in the schema (0: absent)."""
        vtable = table - _I32.unpack_from(self.data, table)[0]
        size = _U16.unpack_from(self.data, vtable)[0]
        return [table + at if at else 0 for at in struct.unpack_from(f"<{(size - 4) // 2}H", self.data, vtable + 4)]

    def scalar(self, fields: list[int], i: int, kind: struct.Struct) -> int:
        return kind.unpack_from(self.data, fields[i])[0] if i < len(fields) and fields[i] else 0

    def ref(self, fields: list[int], i: int) -> int | None:
        """The table, vector or string field `i` points to, or None when absent."""
        if i >= len(fields) or not fields[i]:
            return None
        return fields[i] + _U32.unpack_from(self.data, fields[i])[0]

    def vector(self, fields: list[int], i: int) -> tuple[int, int]:
        """(first element's position, length) of a vector field; length 0 when absent."""
        at = self.ref(fields, i)
        return (at + 4, _U32.unpack_from(self.data, at)[0]) if at is not None else (0, 0)

    def tables(self, fields: list[int], i: int) -> list[int]:
        """The positions of the tables (or strings) of a vector field."""
        start, n = self.vector(fields, i)
        return [start + 4 * j + o for j, o in enumerate(struct.unpack_from(f"<{n}I", self.data, start))]

    def string(self, at: int) -> str:
        n = _U32.unpack_from(self.data, at)[0]
        return self.data[at + 4:at + 4 + n].decode()

    def strings(self, fields: list[int], i: int) -> list[str]:
        return [self.string(at) for at in self.tables(fields, i)]

    def ints(self, fields: list[int], i: int) -> tuple[int, ...]:
        start, n = self.vector(fields, i)
        return struct.unpack_from(f"<{n}i", self.data, start)

    def window_attr(self, fields: list[int]) -> dict:
        """Kernel / stride / pad / dilation of a window op (axis of an ARGMAX); {} for other ops."""
        kind = WINDOW_TYPES.get(self.scalar(fields, OP_ATTRIBUTE_TYPE, _U8))
        table = self.ref(fields, OP_ATTRIBUTE)
        if kind is None or table is None:
            return {}
        attr = self.fields(table)
        if kind == "ArgMaxAttribute":
            return {"axis": self.scalar(attr, 0, _I32)}
        return {key: list(self.ints(attr, i)) for key, i in WINDOW_FIELDS[kind].items()}


@functools.lru_cache(maxsize=4)
def read_tosa(data: bytes) -> TosaGraphInfo:
    """The graph's operators and tensors. Cached (the result is shared: read it, never change it): the lower
    stage reads each graph two or three times (node tensors, partition plan)."""
    r = _Reader(data)
    region = r.tables(r.fields(_U32.unpack_from(data, 0)[0]), REGIONS)[0]
    block = r.fields(r.tables(r.fields(region), BLOCKS)[0])
    tensors = {}
    for at in r.tables(block, BLOCK_TENSORS):
        f = r.fields(at)
        name = r.string(r.ref(f, NAME) or 0)
        tensors[name] = TosaTensorInfo(name, r.ints(f, TENSOR_SHAPE),
                                       DTYPE_NAMES.get(r.scalar(f, TENSOR_TYPE, _U32), "UNKNOWN"),
                                       r.vector(f, TENSOR_DATA)[1] > 0)
    ops = []
    for at in r.tables(block, BLOCK_OPERATORS):
        f = r.fields(at)
        ops.append(TosaOpInfo(OP_NAMES.get(r.scalar(f, OP_OP, _U32), "UNKNOWN"), r.strings(f, OP_INPUTS),
                              r.strings(f, OP_OUTPUTS), r.window_attr(f)))
    shapes = {}
    for at in r.tables(block, BLOCK_SHAPES):
        f = r.fields(at)
        start, n = r.vector(f, SHAPE_DATA)
        if n > 0:
            shapes[r.string(r.ref(f, NAME) or 0)] = tuple(int(v) for v in np.frombuffer(data, "<i8", n // 8, start))
    return TosaGraphInfo(ops, tensors, r.strings(block, BLOCK_INPUTS), r.strings(block, BLOCK_OUTPUTS), shapes)


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
