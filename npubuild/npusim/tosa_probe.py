"""TOSA intermediates for op-by-op comparison: re-point the main block's outputs at every computed tensor.

The reference model only returns graph outputs. Flatbuffer offsets point
forward, so a new outputs vector (and copies of the names) appended at the
end of the buffer is valid; only the block's `outputs` field is patched.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

import numpy as np
from tosa.DType import DType
from tosa.Op import Op
from tosa.TosaGraph import TosaGraph

OUTPUTS_SLOT = 12  # vtable offset of TosaBasicBlock.outputs
SKIP_OPS = {Op.CONST, getattr(Op, "CONST_SHAPE", -1)}


def probe_tensors(tosa: bytes) -> tuple[bytes, list[tuple[str, tuple[int, ...]]]]:
    """A copy of the graph whose outputs are all tensors written by non-constant operators, and their shapes."""
    buf = bytearray(tosa)
    block = TosaGraph.GetRootAs(buf, 0).Regions(0).Blocks(0)
    shapes = {}
    for i in range(block.TensorsLength()):
        t = block.Tensors(i)
        shapes[t.Name().decode()] = tuple(int(t.Shape(j)) for j in range(t.ShapeLength()))
    names: list[str] = []
    for i in range(block.OperatorsLength()):
        op = block.Operators(i)
        if op.Op() in SKIP_OPS:
            continue
        names.extend(op.Outputs(j).decode() for j in range(op.OutputsLength()))
    field = block._tab.Offset(OUTPUTS_SLOT)
    if not field or not names:
        return bytes(tosa), []
    field_pos = block._tab.Pos + field
    while len(buf) % 4:
        buf.append(0)
    vec_pos = len(buf)
    buf += struct.pack("<I", len(names)) + bytes(4 * len(names))
    for k, name in enumerate(names):
        while len(buf) % 4:
            buf.append(0)
        str_pos = len(buf)
        raw = name.encode()
        buf += struct.pack("<I", len(raw)) + raw + b"\0"
        slot = vec_pos + 4 + 4 * k
        struct.pack_into("<I", buf, slot, str_pos - slot)
    while len(buf) % 4:
        buf.append(0)
    struct.pack_into("<I", buf, field_pos, vec_pos - field_pos)
    return bytes(buf), [(n, shapes.get(n, ())) for n in names]


@dataclass(frozen=True)
class GraphOp:
    """One non-constant TOSA operator: its type name and the tensors it reads and writes."""

    kind: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]


OP_NAMES = {v: k for k, v in vars(Op).items() if not k.startswith("_") and isinstance(v, int)}


def graph_ops(tosa: bytes) -> list[GraphOp]:
    """The main block's computing operators in graph order (for tracing a wrong result back to its first op)."""
    block = TosaGraph.GetRootAs(bytearray(tosa), 0).Regions(0).Blocks(0)
    ops = []
    for i in range(block.OperatorsLength()):
        op = block.Operators(i)
        if op.Op() in SKIP_OPS:
            continue
        ops.append(GraphOp(OP_NAMES.get(op.Op(), str(op.Op())),
                           tuple(op.Inputs(j).decode() for j in range(op.InputsLength())),
                           tuple(op.Outputs(j).decode() for j in range(op.OutputsLength()))))
    return ops


def intermediates(tosa: bytes, inputs: list[np.ndarray]) -> dict[str, np.ndarray]:
    """Every computed tensor of the graph on these inputs (TOSA layout)."""
    import tosa_reference_model as trm

    from npubuild.tosa.run import _quiet_stdio

    probe, names = probe_tensors(tosa)
    with _quiet_stdio():
        outs, status = trm.run(probe, [np.ascontiguousarray(x) for x in inputs])
    if "VALID" not in str(status):
        return {}
    return {n: np.asarray(o) for (n, _), o in zip(names, outs, strict=False)}


NP_TYPES = {getattr(DType, name): t for name, t in (("INT8", np.int8), ("INT16", np.int16), ("INT32", np.int32),
                                                    ("UINT8", np.uint8), ("UINT16", np.uint16)) if hasattr(DType, name)}


def graph_io(tosa: bytes) -> tuple[list[tuple[str, tuple[int, ...], type]], list[str]]:
    """The main block's inputs (name, shape, numpy integer type) and output names, in graph order."""
    block = TosaGraph.GetRootAs(bytearray(tosa), 0).Regions(0).Blocks(0)
    tensors = {}
    for i in range(block.TensorsLength()):
        t = block.Tensors(i)
        tensors[t.Name().decode()] = (tuple(int(t.Shape(j)) for j in range(t.ShapeLength())), t.Type())
    inputs = []
    for j in range(block.InputsLength()):
        name = block.Inputs(j).decode()
        shape, dtype = tensors[name]
        if dtype not in NP_TYPES:
            raise ValueError(f"input '{name}' has a non-integer TOSA type {dtype}")
        inputs.append((name, shape, NP_TYPES[dtype]))
    return inputs, [block.Outputs(j).decode() for j in range(block.OutputsLength())]
