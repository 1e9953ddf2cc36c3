"""Each support rule on both sides of its limit, and Vela agrees: what a rule rejects Vela rejects, and vice versa.

Graphs are built straight in TOSA (tosa_serializer) so the op, data type and
shape under test are exactly the ones the rule reads.
"""

from __future__ import annotations

import numpy as np
import pytest
import tosa_serializer as ts
from npbtest.support import compare, rule_verdict, tosa_attr, tosa_serializer, vela_compiles

D = ts.DType
U55, U85 = "ethos-u55-128", "ethos-u85-256"


def select() -> bytes:
    s = tosa_serializer()
    c = s.addPlaceholder([1, 4, 4, 8], D.BOOL)
    a, b = s.addPlaceholder([1, 4, 4, 8], D.INT8), s.addPlaceholder([1, 4, 4, 8], D.INT8)
    o = s.addOutput([1, 4, 4, 8], D.INT8)
    s.addOperator(ts.Op.SELECT, [c.name, a.name, b.name], [o.name], tosa_attr("Select"))
    return s.serialize()


def gather() -> bytes:
    s = tosa_serializer()
    v = s.addPlaceholder([1, 10, 8], D.INT8)
    s.addConst([1, 3], D.INT32, np.array([[0, 2, 5]], np.int32), name="idx")
    o = s.addOutput([1, 3, 8], D.INT8)
    s.addOperator(ts.Op.GATHER, [v.name, "idx"], [o.name], tosa_attr("Gather"))
    return s.serialize()


def argmax(channels: int, axis: int = 3, dtype=D.INT8) -> bytes:
    s = tosa_serializer()
    shape = [1, 4, 4, channels]
    v = s.addPlaceholder(shape, dtype)
    o = s.addOutput([d for i, d in enumerate(shape) if i != axis], D.INT32)
    s.addOperator(ts.Op.ARGMAX, [v.name], [o.name], tosa_attr("ArgMax", axis, ts.NanPropagationMode.PROPAGATE))
    return s.serialize()


def add(dtype) -> bytes:
    s = tosa_serializer()
    a, b = s.addPlaceholder([1, 4, 4, 8], dtype), s.addPlaceholder([1, 4, 4, 8], dtype)
    o = s.addOutput([1, 4, 4, 8], dtype)
    s.addOperator(ts.Op.ADD, [a.name, b.name], [o.name], tosa_attr("Add"))
    return s.serialize()


def conv(kh: int, kw: int, stride: int) -> bytes:
    s = tosa_serializer()
    h, w = kh + 2 * stride, kw + 2 * stride  # exact output size, as TOSA requires
    x = s.addPlaceholder([1, h, w, 4], D.INT8)
    s.addConst([4, kh, kw, 4], D.INT8, np.ones((4, kh, kw, 4), np.int8), name="w")
    s.addConst([4], D.INT32, np.zeros(4, np.int32), name="b")
    s.addConst([1], D.INT8, np.zeros(1, np.int8), name="zi")
    s.addConst([1], D.INT8, np.zeros(1, np.int8), name="zw")
    o = s.addOutput([1, (h - kh) // stride + 1, (w - kw) // stride + 1, 4], D.INT32)
    s.addOperator(ts.Op.CONV2D, [x.name, "w", "b", "zi", "zw"], [o.name],
                  tosa_attr("Conv2d", [0, 0, 0, 0], [stride, stride], [1, 1], False, D.INT32))
    return s.serialize()


def transpose_conv(sy: int, sx: int, ih: int, iw: int, kh: int, kw: int) -> bytes:
    s = tosa_serializer()
    x = s.addPlaceholder([1, ih, iw, 4], D.INT8)
    s.addConst([4, kh, kw, 4], D.INT8, np.ones((4, kh, kw, 4), np.int8), name="w")
    s.addConst([4], D.INT32, np.zeros(4, np.int32), name="b")
    s.addConst([1], D.INT8, np.zeros(1, np.int8), name="zi")
    s.addConst([1], D.INT8, np.zeros(1, np.int8), name="zw")
    o = s.addOutput([1, (ih - 1) * sy + kh, (iw - 1) * sx + kw, 4], D.INT32)
    s.addOperator(ts.Op.TRANSPOSE_CONV2D, [x.name, "w", "b", "zi", "zw"], [o.name],
                  tosa_attr("TransposeConv2d", [0, 0, 0, 0], [sy, sx], False, D.INT32))
    return s.serialize()


# (graph, accelerator, rule expected to reject it or None): pairs on both sides of each limit
CASES = [
    pytest.param(compare("GREATER", D.INT32), U55, "u55-op-type", id="greater-u55"),
    pytest.param(compare("GREATER", D.INT32), U85, None, id="greater-u85"),
    pytest.param(compare("EQUAL", D.INT32), U55, "u55-op-type", id="equal-u55"),
    pytest.param(compare("EQUAL", D.INT32), U85, None, id="equal-u85"),
    pytest.param(select(), U55, "u55-op-type", id="select-u55"),
    pytest.param(select(), U85, None, id="select-u85"),
    pytest.param(gather(), U55, "u55-op-type", id="gather-u55"),
    pytest.param(gather(), U85, None, id="gather-u85"),
    pytest.param(compare("GREATER", D.INT16), U85, "comparison-int32", id="greater-int16-u85"),
    pytest.param(argmax(127), U55, None, id="argmax-127-u55"),
    pytest.param(argmax(128), U55, "u55-argmax-channels", id="argmax-128-u55"),
    pytest.param(argmax(128), U85, None, id="argmax-128-u85"),
    pytest.param(argmax(8, axis=1), U55, "u55-argmax-axis", id="argmax-axis1-u55"),
    pytest.param(argmax(8, axis=1), U85, None, id="argmax-axis1-u85"),
    pytest.param(argmax(8, dtype=D.INT16), U55, "u55-argmax-axis", id="argmax-int16-u55"),
    pytest.param(argmax(8, dtype=D.INT16), U85, None, id="argmax-int16-u85"),
    pytest.param(add(D.INT32), U55, None, id="add-int32-u55"),
    pytest.param(add(D.FP32), U55, "pro-int-only", id="add-fp32-u55"),
    pytest.param(add(D.FP32), U85, "pro-int-only", id="add-fp32-u85"),
    pytest.param(transpose_conv(2, 2, 4, 4, 3, 3), U55, None, id="tconv-2x2-u55"),
    pytest.param(transpose_conv(3, 2, 4, 4, 3, 3), U55, "u55-transpose-conv-stride", id="tconv-3x2-u55"),
    pytest.param(transpose_conv(3, 2, 4, 4, 3, 3), U85, None, id="tconv-3x2-u85"),
    pytest.param(transpose_conv(1, 2, 1, 4, 1, 3), U55, None, id="tconv-1x2-unit-height-u55"),
    pytest.param(transpose_conv(1, 2, 4, 4, 3, 3), U55, "u55-transpose-conv-stride", id="tconv-1x2-u55"),
    pytest.param(transpose_conv(2, 1, 4, 4, 3, 3), U55, "u55-transpose-conv-stride", id="tconv-2x1-u55"),
    pytest.param(transpose_conv(3, 2, 1, 4, 1, 3), U55, None, id="tconv-3x2-unit-height-u55"),
]


@pytest.mark.parametrize(("tosa", "accelerator", "rule"), CASES)
def test_rule_and_vela_agree(tosa: bytes, accelerator: str, rule: str | None):
    assert rule_verdict(tosa, accelerator) == rule
    assert vela_compiles(tosa, accelerator) == (rule is None)


@pytest.mark.parametrize(("kh", "kw", "stride"), [(3, 3, 3), (3, 3, 4), (64, 1, 1), (65, 1, 1)])
def test_no_rule_where_vela_decomposes_beyond_native_limits(kh: int, kw: int, stride: int):
    """SUPPORTED_OPS.md lists stride <= 3 and kernel_y <= 64 for U55 CONV2D, but Vela splits such convs itself."""
    g = conv(kh, kw, stride)
    assert rule_verdict(g, U55) is None
    assert vela_compiles(g, U55)
