"""Issue 33, U55: how Vela 5.2 costs an int8 elementwise op, by the forms a lowering could give it.

    PYTHONPATH=. /work/main/.venv/bin/python bench/u55_eltwise.py --work /tmp/u55_eltwise > table.md

A benchmark script, not part of npubuild. Each case is one graph: two int8 inputs, each through a 1x1
MAX_POOL2D (so the elementwise op's operands and result are NPU intermediates, as in a network), npubuild's
int8 elementwise form (each operand RESCALEd to int32, the op, a RESCALE to int8, which Vela fuses into one
NPU op), a 1x1 MAX_POOL2D to the output. A form is a variant of that graph: operands swapped, the broadcast
operand's shape, a RESHAPE view around the op, a TABLE after it. Compiled by Vela with its bundled vela.ini
and the named config the U55 profile mirrors (bench/peer_vela.py); printed: the elementwise layers' cycles and
the graph's. bench/u55_eltwise.md keeps the table and what it means.
"""

from __future__ import annotations

import argparse
import csv
import sys
from pathlib import Path

import numpy as np
import tosa_serializer as ts

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
import peer_vela  # noqa: E402

from npubuild.lowering.emit import attr  # noqa: E402
from npubuild.lowering.quant import multiplier_shift  # noqa: E402

TOSA_TYPES = {np.int8: ts.DType.INT8, np.int32: ts.DType.INT32}


class Graph:
    """A TOSA 1.0 graph written op by op (the few ops these cases need)."""

    def __init__(self) -> None:
        self.ser = ts.TosaSerializer("", ts.ConstMode.EMBED, 1, 0, 0, False)
        self.count = 0

    def const(self, data: np.ndarray, dtype) -> str:
        self.count += 1
        name = f"c{self.count}"
        self.ser.addConst(list(data.shape), dtype, data, name=name)
        return name

    def pool(self, x: str, shape: tuple[int, ...], output: bool = False) -> str:
        """A 1x1 MAX_POOL2D: an NPU op that reads or writes the elementwise op's tensors."""
        t = (self.ser.addOutput if output else self.ser.addIntermediate)(list(shape), ts.DType.INT8)
        self.ser.addOperator(ts.Op.MAX_POOL2D, [x], [t.name],
                             attr("MaxPool2d", [1, 1], [1, 1], [0, 0, 0, 0], ts.NanPropagationMode.PROPAGATE))
        return t.name

    def rescale(self, x: str, shape: tuple[int, ...], scale: float, src, dst, in_zp: int, out_zp: int) -> str:
        mult, shift = multiplier_shift(np.atleast_1d(np.float64(scale)), 32)
        ins = [x, self.const(mult.astype(np.int32), ts.DType.INT32), self.const(shift.astype(np.int8), ts.DType.INT8),
               self.const(np.array([in_zp], src), TOSA_TYPES[src]), self.const(np.array([out_zp], dst), TOSA_TYPES[dst])]
        t = self.ser.addIntermediate(list(shape), TOSA_TYPES[dst])
        self.ser.addOperator(ts.Op.RESCALE, ins, [t.name],
                             attr("Rescale", True, ts.RoundingMode.SINGLE_ROUND, False, False, False))
        return t.name

    def reshape(self, x: str, shape: tuple[int, ...]) -> str:
        self.count += 1
        name = f"s{self.count}"
        self.ser.addConst([len(shape)], ts.DType.SHAPE, np.asarray(shape, np.int64), name=name)
        t = self.ser.addIntermediate(list(shape), ts.DType.INT8)
        a = ts.TosaSerializerAttribute()
        a.ReshapeAttribute()
        self.ser.addOperator(ts.Op.RESHAPE, [x, name], [t.name], a)
        return t.name


def case(op: str, sa: tuple[int, ...], sb: tuple[int, ...], swap: bool = False, view=None,
         table: bool = False) -> bytes:
    """One elementwise op of int8 tensors of shapes sa and sb in npubuild's form; `view` (the operands' and
    result's shapes) RESHAPEs around it, `table` puts a TABLE after it."""
    g = Graph()
    a = g.pool(g.ser.addPlaceholder(list(sa), ts.DType.INT8).name, sa)
    b = g.pool(g.ser.addPlaceholder(list(sb), ts.DType.INT8).name, sb)
    out = tuple(max(p, q) for p, q in zip(sa, sb, strict=True))
    va, vb, vo = view or (sa, sb, out)
    if view:
        a, b = g.reshape(a, va), g.reshape(b, vb)
    add = op != "MUL"
    a32 = g.rescale(a, va, 0.5 * 2**20 if add else 1.0, np.int8, np.int32, 3, 0)
    b32 = g.rescale(b, vb, 0.37 * 2**20 if add else 1.0, np.int8, np.int32, -5, 0)
    acc = g.ser.addIntermediate(list(vo), ts.DType.INT32).name
    operands = [b32, a32] if swap else [a32, b32]
    if op == "MUL":
        operands.append(g.const(np.zeros([1], np.int8), ts.DType.INT8))
    g.ser.addOperator(getattr(ts.Op, op), operands, [acc], attr(op.capitalize()))
    y = g.rescale(acc, vo, 0.8 / 2**20 if add else 0.01, np.int32, np.int8, 0, 1)
    if table:
        t = g.ser.addIntermediate(list(vo), ts.DType.INT8).name
        g.ser.addOperator(ts.Op.TABLE, [y, g.const(np.arange(127, -129, -1).astype(np.int8), ts.DType.INT8)], [t],
                          attr("Table"))
        y = t
    if view:
        y = g.reshape(y, out)
    g.pool(y, out, output=True)
    return g.ser.serialize()


CASES: dict[str, tuple] = {
    "ADD 32x32x16": ("ADD", (1, 32, 32, 16), (1, 32, 32, 16), {}),
    "ADD 32x32x16, operands swapped": ("ADD", (1, 32, 32, 16), (1, 32, 32, 16), {"swap": True}),
    "SUB 32x32x16": ("SUB", (1, 32, 32, 16), (1, 32, 32, 16), {}),
    "MUL 32x32x16": ("MUL", (1, 32, 32, 16), (1, 32, 32, 16), {}),
    "MUL 32x32x16, TABLE after": ("MUL", (1, 32, 32, 16), (1, 32, 32, 16), {"table": True}),
    "ADD 32x32x16, TABLE after": ("ADD", (1, 32, 32, 16), (1, 32, 32, 16), {"table": True}),
    "MUL 32x32x64 by [1,1,1,64] (SE gate)": ("MUL", (1, 32, 32, 64), (1, 1, 1, 64), {}),
    "MUL 32x32x64 by [1,1,1,64], swapped": ("MUL", (1, 32, 32, 64), (1, 1, 1, 64), {"swap": True}),
    "MUL 32x32x64 by a scalar": ("MUL", (1, 32, 32, 64), (1, 1, 1, 1), {}),
    "MUL 32x32x64 by [1,32,32,1]": ("MUL", (1, 32, 32, 64), (1, 32, 32, 1), {}),
    "MUL 32x32x64 by [1,32,1,64]": ("MUL", (1, 32, 32, 64), (1, 32, 1, 64), {}),
    "MUL 32x32x64 by [1,1,1,64] as [1,1,1024,64]": ("MUL", (1, 32, 32, 64), (1, 1, 1, 64),
                                                     {"view": ((1, 1, 1024, 64), (1, 1, 1, 64), (1, 1, 1024, 64))}),
    "MUL 32x32x64 by [1,1,1,64] as [1,128,8,64]": ("MUL", (1, 32, 32, 64), (1, 1, 1, 64),
                                                    {"view": ((1, 128, 8, 64), (1, 1, 1, 64), (1, 128, 8, 64))}),
    "ADD 32x32x16 as [1,1,1024,16]": ("ADD", (1, 32, 32, 16), (1, 32, 32, 16),
                                      {"view": ((1, 1, 1024, 16), (1, 1, 1024, 16), (1, 1, 1024, 16))}),
    "ADD 32x32x12": ("ADD", (1, 32, 32, 12), (1, 32, 32, 12), {}),
    "ADD 32x32x12 as [1,1,768,16]": ("ADD", (1, 32, 32, 12), (1, 32, 32, 12),
                                     {"view": ((1, 1, 768, 16), (1, 1, 768, 16), (1, 1, 768, 16))}),
}
ELEMENTWISE = ("Add", "Sub", "Mul")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--work", type=Path, required=True)
    ap.add_argument("--accelerator", default="ethos-u55-128")
    args = ap.parse_args()
    print(f"| case ({args.accelerator}, {' / '.join(peer_vela.named_config(args.accelerator))}) | output elements "
          "| elementwise cycles | per element | graph cycles |")
    print("|---|---:|---:|---:|---:|")
    for i, (name, (op, sa, sb, kw)) in enumerate(CASES.items()):
        src = args.work / f"case{i}.tosa"
        src.parent.mkdir(parents=True, exist_ok=True)
        src.write_bytes(case(op, sa, sb, **kw))
        figures = peer_vela.vela(src, args.accelerator, ["--verbose-performance"], args.work / f"case{i}")
        with next((args.work / f"case{i}").glob("*_per-layer.csv")).open(newline="") as f:
            cycles = sum(int(r["Op Cycles"]) for r in csv.DictReader(f) if r["NNG Operator"] in ELEMENTWISE)
        elements = int(np.prod([max(p, q) for p, q in zip(sa, sb, strict=True)]))
        print(f"| {name} | {elements} | {cycles} | {cycles / elements:.3f} | {figures['npu_cycles']} |")


if __name__ == "__main__":
    main()
