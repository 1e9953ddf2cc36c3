"""Issue 33, U55: an int8 residual ADD against the same sum as one 1x2 depthwise conv, on Vela 5.2.

    PYTHONPATH=. /work/main/.venv/bin/python bench/u55_add_dw.py --work /tmp/u55_add_dw > table.md

A benchmark script, not part of npubuild. Each case is one graph: two int8 inputs, each through a 1x1
MAX_POOL2D (so the sum's operands are NPU intermediates written by an op, as a conv branch's are), the sum, a
1x1 MAX_POOL2D to the output. Forms: npubuild's ADD (bench/u55_eltwise.py's graph), and the depthwise form
lowering/ops/elementwise._depthwise_sum emits: a CONCAT of the operands along channels, the RESHAPE of that
[1, H, W, 2C] to [1, H, 2W, C] (the same bytes), a 1x2 stride-(1, 2) DEPTHWISE_CONV2D of weights (64, p) and
its RESCALE. Compiled by Vela with its bundled vela.ini and the named config each target's profile mirrors
(bench/peer_vela.py); printed per target: the cycles of the layers Vela's per-layer CSV gives the sum (the ADD;
the conv and any copy the CONCAT costs) and of the whole graph. bench/u55_add_dw.md keeps the table.
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
from u55_eltwise import Graph, case  # noqa: E402

from npubuild.lowering.emit import attr  # noqa: E402

SHAPES = [(1, 32, 32, 16), (1, 16, 16, 32), (1, 8, 8, 64), (1, 32, 32, 64), (1, 1, 128, 16)]
TARGETS = ["ethos-u55-128", "ethos-u65-256", "ethos-u85-256"]
SUM_LAYERS = ("Add", "DepthwiseConv2D", "MemoryCopy")


def depthwise_case(shape: tuple[int, ...]) -> bytes:
    """The sum of two pooled int8 operands in the depthwise form (weights 64 and 40, zero points 3 and -5)."""
    n, h, w, c = shape
    g = Graph()
    a = g.pool(g.ser.addPlaceholder(list(shape), ts.DType.INT8).name, shape)
    b = g.pool(g.ser.addPlaceholder(list(shape), ts.DType.INT8).name, shape)
    pair = g.ser.addIntermediate([n, h, w, 2 * c], ts.DType.INT8).name
    g.ser.addOperator(ts.Op.CONCAT, [a, b], [pair], attr("Concat", 3))
    side_by_side = g.reshape(pair, (n, h, 2 * w, c))
    kernel = np.stack([np.full(c, 64), np.full(c, 40)]).reshape(1, 2, c, 1).astype(np.int8)
    acc = g.ser.addIntermediate([n, h, w, c], ts.DType.INT32).name
    ins = [side_by_side, g.const(kernel, ts.DType.INT8), g.const(np.full(c, 40 * 8, np.int32), ts.DType.INT32),
           g.const(np.array([3], np.int8), ts.DType.INT8), g.const(np.array([0], np.int8), ts.DType.INT8)]
    g.ser.addOperator(ts.Op.DEPTHWISE_CONV2D, ins, [acc],
                      attr("DepthwiseConv2d", [0, 0, 0, 0], [1, 2], [1, 1], False, ts.DType.INT32))
    g.pool(g.rescale(acc, shape, 0.0125, np.int32, np.int8, 0, 1), shape, output=True)
    return g.ser.serialize()


def measure(src: Path, accelerator: str, out: Path) -> tuple[int, int]:
    """(the sum's cycles, the graph's cycles) from Vela's per-layer CSV."""
    peer_vela.vela(src, accelerator, ["--verbose-performance"], out)
    (per_layer,) = out.glob("*_per-layer.csv")
    with per_layer.open(newline="") as f:
        rows = list(csv.DictReader(f))
    return (sum(int(r["Op Cycles"]) for r in rows if r["NNG Operator"] in SUM_LAYERS),
            sum(int(r["Op Cycles"]) for r in rows))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--work", type=Path, required=True)
    args = ap.parse_args()
    print("| target | operands | ADD: sum / graph cycles | depthwise: sum / graph cycles | graph ratio |")
    print("|---|---|---:|---:|---:|")
    for target in TARGETS:
        for shape in SHAPES:
            figures = []
            for form, tosa in (("add", case("ADD", shape, shape)), ("dw", depthwise_case(shape))):
                stem = f"{target}-{form}-{'x'.join(map(str, shape[1:]))}"
                src = args.work / f"{stem}.tosa"
                src.parent.mkdir(parents=True, exist_ok=True)
                src.write_bytes(tosa)
                figures.append(measure(src, target, args.work / stem))
            (add_sum, add_all), (dw_sum, dw_all) = figures
            print(f"| {target} | {'x'.join(map(str, shape[1:]))} | {add_sum} / {add_all} | {dw_sum} / {dw_all} | "
                  f"{dw_all / add_all:.3f} |")


if __name__ == "__main__":
    main()
