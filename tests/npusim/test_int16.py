"""npu-sim on 16-bit activations (16x8 CONV/DEPTHWISE, 48-bit bias, 16-bit scales) on U55/U65 and U85, graphs
built straight in TOSA."""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np
import pytest
import tosa_serializer as ts
from npbtest.npusim import assert_bitexact, vela_raw

D = ts.DType


def _attr(kind: str, *args) -> ts.TosaSerializerAttribute:
    a = ts.TosaSerializerAttribute()
    getattr(a, f"{kind}Attribute")(*args)
    return a


def conv16(k: int, cin: int, cout: int, depthwise: bool) -> bytes:
    """int16 x int8 -> int48 accumulator -> RESCALE (16-bit multipliers, per channel) -> int16."""
    s = ts.TosaSerializer("", ts.ConstMode.EMBED, 1, 0, 0, False)
    rng = np.random.default_rng(k + cin)
    x = s.addPlaceholder([1, 8, 8, cin], D.INT16)
    wshape = [k, k, cin, 1] if depthwise else [cout, k, k, cin]
    s.addConst(wshape, D.INT8, rng.integers(-127, 128, wshape).astype(np.int8), name="w")
    s.addConst([cout], D.INT48, rng.integers(-5000, 5000, cout).astype(np.int64), name="b")
    s.addConst([1], D.INT16, np.zeros(1, np.int16), name="zi")
    s.addConst([1], D.INT8, np.zeros(1, np.int8), name="zw")
    acc = s.addIntermediate([1, 8, 8, cout], D.INT48)
    s.addOperator(ts.Op.DEPTHWISE_CONV2D if depthwise else ts.Op.CONV2D, [x.name, "w", "b", "zi", "zw"], [acc.name],
                  _attr("DepthwiseConv2d" if depthwise else "Conv2d", [k // 2] * 4, [1, 1], [1, 1], False, D.INT48))
    s.addConst([cout], D.INT16, rng.integers(1 << 13, 1 << 14, cout).astype(np.int16), name="m")
    s.addConst([cout], D.INT8, np.full(cout, 26, np.int8), name="sh")
    s.addConst([1], D.INT48, np.zeros(1, np.int64), name="rzi")
    s.addConst([1], D.INT16, np.zeros(1, np.int16), name="rzo")
    o = s.addOutput([1, 8, 8, cout], D.INT16)
    s.addOperator(ts.Op.RESCALE, [acc.name, "m", "sh", "rzi", "rzo"], [o.name],
                  _attr("Rescale", False, ts.RoundingMode.SINGLE_ROUND, True, False, False))
    return s.serialize()


@pytest.mark.parametrize("k,cin,cout,depthwise,accel", [
    (3, 8, 16, False, "ethos-u55-128"), (1, 24, 8, False, "ethos-u55-256"), (5, 8, 8, False, "ethos-u65-512"),
    (3, 16, 16, True, "ethos-u55-128"),
    # U85: 48-bit accumulator and bias entries; 16-bit part-kernel (fast format), depthwise and depth-first orders
    (3, 8, 16, False, "ethos-u85-256"), (3, 40, 70, False, "ethos-u85-128"), (3, 16, 16, True, "ethos-u85-512"),
    (1, 80, 48, False, "ethos-u85-2048"),
])
def test_int16_conv_bitexact(k, cin, cout, depthwise, accel):
    tosa = conv16(k, cin, cout, depthwise)
    io = {"inputs": [{"shape": [1, 8, 8, cin], "dtype": "int16"}]}
    with tempfile.TemporaryDirectory() as tmp:
        assert_bitexact(tosa, io, vela_raw(tosa, Path(tmp), accel))


def table16() -> bytes:
    """TOSA's interpolating int16 TABLE (513 entries, int32 out): Vela builds it from 16-bit LUT passes and MULs."""
    s = ts.TosaSerializer("", ts.ConstMode.EMBED, 1, 0, 0, False)
    x = s.addPlaceholder([1, 4, 4, 8], D.INT16)
    s.addConst([513], D.INT16, (np.sin(np.linspace(-3, 3, 513)) * 30000).astype(np.int16), name="t")
    o = s.addOutput([1, 4, 4, 8], D.INT32)
    s.addOperator(ts.Op.TABLE, [x.name, "t"], [o.name], _attr("Table"))
    return s.serialize()


def maxpool16() -> bytes:
    s = ts.TosaSerializer("", ts.ConstMode.EMBED, 1, 0, 0, False)
    x = s.addPlaceholder([1, 8, 8, 8], D.INT16)
    o = s.addOutput([1, 4, 4, 8], D.INT16)
    s.addOperator(ts.Op.MAX_POOL2D, [x.name], [o.name],
                  _attr("MaxPool2d", [2, 2], [2, 2], [0, 0, 0, 0], ts.NanPropagationMode.PROPAGATE))
    return s.serialize()


@pytest.mark.parametrize("graph,shape", [(table16, [1, 4, 4, 8]), (maxpool16, [1, 8, 8, 8])],
                         ids=["table16", "maxpool16"])
def test_int16_lut_and_pool_bitexact(graph, shape):
    tosa = graph()
    with tempfile.TemporaryDirectory() as tmp:
        assert_bitexact(tosa, {"inputs": [{"shape": shape, "dtype": "int16"}]}, vela_raw(tosa, Path(tmp)))
