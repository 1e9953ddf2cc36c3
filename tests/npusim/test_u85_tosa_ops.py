"""npu-sim on U85 operations no ONNX lowering reaches, graphs built straight in TOSA: each bit-exact against the
TOSA reference model, and each asserted to use the U85 feature it is there for (read from the command stream)."""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np
import pytest
import tosa_serializer as ts
from npbtest.npusim import assert_bitexact, vela_raw
from npbtest.tosa_graphs import Graph, attr

from npubuild.npusim.cmdstream import decode
from npubuild.npusim.npz import load_raw
from npubuild.npusim.u85.registers import COMMANDS, field

Op = ts.Op
D = ts.DType
S = [1, 4, 8, 16]
I8, I16, I32 = np.int8, np.int16, np.int32
RNG = np.random.default_rng(11)


def _binary(op, dtype, out_dtype=None, attribute=None, b=None):
    g = Graph()
    x = g.input(S, dtype)
    y = g.input(S, dtype) if b is None else g.const(b, dtype)
    g.op(op, [x, y], S, out_dtype or dtype, attribute or attr(op.name.title().replace("_", "")), output=True)
    return g


def argmax(axis):
    g = Graph()
    x = g.input(S, I8)
    shape = [d for i, d in enumerate(S) if i != axis]
    g.op(Op.ARGMAX, [x], shape, I32, attr("ArgMax", axis, ts.NanPropagationMode.PROPAGATE), output=True)
    return g


def reverse(axis):
    g = Graph()
    g.op(Op.REVERSE, [g.input(S, I8)], S, I8, attr("Reverse", axis), output=True)
    return g


def gather():
    g = Graph()
    values = g.input([2, 10, 16], I8)
    idx = g.const(RNG.integers(0, 10, (2, 5)), I32)
    g.op(Op.GATHER, [values, idx], [2, 5, 16], I8, attr("Gather"), output=True)
    return g


def scatter():
    g = Graph()
    values = g.input([2, 10, 16], I8)
    fill = g.input([2, 4, 16], I8)
    idx = g.const(np.stack([RNG.permutation(10)[:4] for _ in range(2)]), I32)
    g.op(Op.SCATTER, [values, idx, fill], [2, 10, 16], I8, attr("Scatter"), output=True)
    return g


def compare_select(op):
    """A comparison (int32 operands, as TOSA requires) chooses between the inputs, so the output is integer."""
    g = Graph()
    a, b = g.input(S, I8), g.input(S, I8)
    a32, b32 = (g.op(Op.CAST, [t], S, I32, attr("Cast")) for t in (a, b))
    cond = g.op(op, [a32, b32], S, np.bool_, attr(op.name.title().replace("_", "")))
    g.op(Op.SELECT, [cond, a, b], S, I8, attr("Select"), output=True)
    return g


def logical(op):
    g = Graph()
    a, b, c = g.input(S, I8), g.input(S, I8), g.input(S, I8)
    a32, b32, c32 = (g.op(Op.CAST, [t], S, I32, attr("Cast")) for t in (a, b, c))
    p = g.op(Op.GREATER, [a32, b32], S, np.bool_, attr("Greater"))
    q = g.op(Op.GREATER, [b32, c32], S, np.bool_, attr("Greater"))
    name = {Op.LOGICAL_AND: "LogicalAnd", Op.LOGICAL_OR: "LogicalOr", Op.LOGICAL_XOR: "LogicalXor"}[op]
    r = g.op(op, [p, q], S, np.bool_, attr(name))
    g.op(Op.SELECT, [r, a, c], S, I8, attr("Select"), output=True)
    return g


def logical_not():
    g = Graph()
    a, b = g.input(S, I8), g.input(S, I8)
    a32, b32 = (g.op(Op.CAST, [t], S, I32, attr("Cast")) for t in (a, b))
    p = g.op(Op.GREATER_EQUAL, [a32, b32], S, np.bool_, attr("GreaterEqual"))
    q = g.op(Op.LOGICAL_NOT, [p], S, np.bool_, attr("LogicalNot"))
    g.op(Op.SELECT, [q, a, b], S, I8, attr("Select"), output=True)
    return g


def bitwise(op, dtype):
    name = {Op.BITWISE_AND: "BitwiseAnd", Op.BITWISE_OR: "BitwiseOr", Op.BITWISE_XOR: "BitwiseXor"}[op]
    return _binary(op, dtype, attribute=attr(name))


def bitwise_not(dtype):
    g = Graph()
    g.op(Op.BITWISE_NOT, [g.input(S, dtype)], S, dtype, attr("BitwiseNot"), output=True)
    return g


def shift(op, dtype, rounding=None):
    amounts = RNG.integers(0, 8 * np.dtype(dtype).itemsize - 1, S)
    if op == Op.ARITHMETIC_RIGHT_SHIFT:
        return _binary(op, dtype, attribute=attr("ArithmeticRightShift", rounding), b=amounts)
    name = {Op.LOGICAL_LEFT_SHIFT: "LogicalLeftShift", Op.LOGICAL_RIGHT_SHIFT: "LogicalRightShift"}[op]
    return _binary(op, dtype, attribute=attr(name), b=amounts)


def _int32_input(g: Graph, dtype=I8) -> str:
    return g.op(Op.CAST, [g.input(S, dtype)], S, I32, attr("Cast"))


def clz():
    g = Graph()
    g.op(Op.CLZ, [g.input(S, I32)], S, I32, attr("Clz"), output=True)
    return g


def intdiv():
    d = RNG.integers(1, 1000, S) * RNG.choice([-1, 1], S)
    return _binary(Op.INTDIV, I32, attribute=attr("IntDiv"), b=d)


def mul32(shift_bits):
    """int32 MUL with a result shift (operands from int8 so the product stays in range)."""
    g = Graph()
    a = g.op(Op.CAST, [g.input(S, I8)], S, I32, attr("Cast"))
    b = g.op(Op.CAST, [g.input(S, I8)], S, I32, attr("Cast"))
    g.op(Op.MUL, [a, b, g.const([shift_bits], I8)], S, I32, attr("Mul"), output=True)
    return g


def minmax32(op):
    g = Graph()
    a, b = _int32_input(g, I16), _int32_input(g, I16)
    g.op(op, [a, b], S, I32, attr("Minimum" if op == Op.MINIMUM else "Maximum", ts.NanPropagationMode.PROPAGATE),
         output=True)
    return g


def table(dtype):
    g = Graph()
    x = g.input(S, dtype)
    if dtype == I8:
        t = g.const(RNG.integers(-128, 128, 256), I8)
        g.op(Op.TABLE, [x, t], S, I8, attr("Table"), output=True)
    else:
        t = g.const((np.cos(np.linspace(-2, 2, 513)) * 20000).astype(np.int16), I16)
        g.op(Op.TABLE, [x, t], S, I32, attr("Table"), output=True)
    return g


def rescale(in_dtype, out_dtype, per_channel=False, **kw):
    g = Graph()
    # int32 from int16 values: TOSA requires |value| < 2^(shift - 1) of RESCALE's input
    x = _int32_input(g, I16) if in_dtype == I32 else g.input(S, in_dtype)
    c = S[-1] if per_channel else 1
    mult = RNG.integers(1 << 29, (1 << 31) - 1, c).tolist()
    shift = RNG.integers(30, 38, c).tolist()
    g.rescale(x, S, in_dtype, out_dtype, mult, shift, output=True, **kw)
    return g


def cast(in_dtype, out_dtype):
    g = Graph()
    g.op(Op.CAST, [g.input(S, in_dtype)], S, out_dtype, attr("Cast"), output=True)
    return g


def negate_abs(dtype):
    """NEGATE (int8/16/32) then ABS (int32 only in TOSA)."""
    g = Graph()
    x = g.input(S, dtype)
    n = g.op(Op.NEGATE, [x, g.zp(dtype, 3), g.zp(dtype, -2)], S, dtype, attr("Negate"))
    n32 = g.op(Op.CAST, [n], S, I32, attr("Cast")) if dtype != I32 else n
    g.op(Op.ABS, [n32], S, I32, attr("Abs"), output=True)
    return g


def matmul(dtype, zp_a=0, zp_b=0):
    g = Graph()
    a, b = g.input([2, 5, 16], dtype), g.input([2, 16, 7], dtype)
    out = I32 if dtype == I8 else np.int64
    g.op(Op.MATMUL, [a, b, g.zp(dtype, zp_a), g.zp(dtype, zp_b)], [2, 5, 7], out, attr("MatMul"))
    if dtype == I8:
        g.rescale(g.last, [2, 5, 7], I32, I8, [1 << 30], [40], output=True)
    else:
        g.rescale(g.last, [2, 5, 7], np.int64, I16, [1 << 14], [28], output=True)
    return g


def resize(mode, dtype, scale=(2, 1), border=0, size=(5, 6)):
    g = Graph()
    x = g.input([1, *size, 8], dtype)
    n, d = scale
    oh, ow = ((size[0] - 1) * n + border) // d + 1, ((size[1] - 1) * n + border) // d + 1
    scale_t, offset_t, border_t = g.shape([n, d, n, d]), g.shape([0, 0]), g.shape([border, border])
    bilinear = mode == ts.ResizeMode.BILINEAR
    out = (I32 if dtype == I8 else np.int64) if bilinear else dtype
    g.op(Op.RESIZE, [x, scale_t, offset_t, border_t], [1, oh, ow, 8], out, attr("Resize", mode), output=not bilinear)
    if bilinear:
        # single rounding: Vela folds this rescale into the RESIZE's OFM scale, which cannot double-round
        wide = dtype != I8  # int48 accumulator: 16-bit multiplier
        g.rescale(g.last, [1, oh, ow, 8], out, dtype, [1 << (14 if wide else 30)],
                  [(14 if wide else 30) + 2 * int(np.log2(n))], output=True, double_round=False)
    return g


def pool16(kind):
    g = Graph()
    x = g.input([1, 8, 8, 8], I16)
    if kind == "avg":
        g.op(Op.AVG_POOL2D, [x, g.zp(I16), g.zp(I16)], [1, 8, 8, 8], I16,
             attr("AvgPool2d", [3, 3], [1, 1], [1, 1, 1, 1], D.INT32), output=True)
    else:
        g.op(Op.MAX_POOL2D, [x], [1, 4, 4, 8], I16,
             attr("MaxPool2d", [2, 2], [2, 2], [0, 0, 0, 0], ts.NanPropagationMode.PROPAGATE), output=True)
    return g


def reduce(op, axis, dtype=I8):
    g = Graph()
    x = g.input(S, dtype)
    shape = [1 if i == axis else d for i, d in enumerate(S)]
    if op == Op.REDUCE_SUM:
        x = g.op(Op.CAST, [x], S, I32, attr("Cast"))
        g.op(op, [x], shape, I32, attr("ReduceSum", axis), output=True)
    else:
        name = "ReduceMax" if op == Op.REDUCE_MAX else "ReduceMin"
        g.op(op, [x], shape, dtype, attr(name, axis, ts.NanPropagationMode.PROPAGATE), output=True)
    return g


def conv2d(depthwise: bool, stride: int, dynamic: bool):
    """int8 CONV2D / DEPTHWISE_CONV2D -> int32 -> RESCALE; weights a graph input when `dynamic`."""
    g = Graph()
    x = g.input([1, 15, 15, 8], I8)  # (15 - 3) divisible by the strides used
    wshape = [3, 3, 8, 1] if depthwise else [12, 3, 3, 8]
    w = g.input(wshape, I8) if dynamic else g.const(RNG.integers(-127, 128, wshape), I8)
    cout = 8 if depthwise else 12
    b = g.const(RNG.integers(-3000, 3000, cout), I32)
    o = (15 - 3) // stride + 1
    op, name = (Op.DEPTHWISE_CONV2D, "DepthwiseConv2d") if depthwise else (Op.CONV2D, "Conv2d")
    acc = g.op(op, [x, w, b, g.zp(I8, 2), g.zp(I8, 0)], [1, o, o, cout], I32,
               attr(name, [0, 0, 0, 0], [stride, stride], [1, 1], False, D.INT32))
    g.rescale(acc, [1, o, o, cout], I32, I8, [1 << 30] * cout, [42] * cout, out_zp=-3, output=True)
    return g


def transpose_conv(stride: int):
    """TOSA TRANSPOSE_CONV2D int8, 3x3, out_pad 0."""
    g = Graph()
    x = g.input([1, 6, 6, 8], I8)
    w = g.const(RNG.integers(-127, 128, [12, 3, 3, 8]), I8)
    b = g.const(RNG.integers(-3000, 3000, 12), I32)
    o = (6 - 1) * stride + 3
    acc = g.op(Op.TRANSPOSE_CONV2D, [x, w, b, g.zp(I8, 1), g.zp(I8, 0)], [1, o, o, 12], I32,
               attr("TransposeConv2d", [0, 0, 0, 0], [stride, stride], False, D.INT32))
    g.rescale(acc, [1, o, o, 12], I32, I8, [1 << 30] * 12, [42] * 12, output=True)
    return g


def transpose(perm, dtype):
    g = Graph()
    g.op(Op.TRANSPOSE, [g.input(S, dtype)], [S[p] for p in perm], dtype, attr("Transpose", perm), output=True)
    return g


def uses(kind: str, param: int | None = None, reg: str | None = None, name: str | None = None, value: int = 1):
    """A predicate on a command: its kind, its op parameter, and optionally a register field's value."""
    def test(c) -> bool:
        if c.kind != kind or (param is not None and c.param != param):
            return False
        return reg is None or field(reg, name, c.regs.get(reg, 0), 0) == value
    return test


CASES = {
    "argmax_w": (lambda: argmax(2), uses("POOL", 6)), "argmax_h": (lambda: argmax(1), uses("POOL", 6)),
    "argmax_c": (lambda: argmax(3), uses("POOL", 6)),
    "reverse_h": (lambda: reverse(1), uses("POOL", 3, "OFM_PRECISION", "activation_reverse", 1)),
    "reverse_w": (lambda: reverse(2), uses("POOL", 3, "OFM_PRECISION", "activation_reverse", 2)),
    "reverse_c": (lambda: reverse(3), uses("POOL", 3, "OFM_PRECISION", "activation_reverse", 3)),
    "gather": (gather, uses("DMA_START", None, "DMA0_SRC_REGION", "idx_mode")),
    "scatter": (scatter, uses("DMA_START", None, "DMA0_DST_REGION", "idx_mode")),
    "equal": (lambda: compare_select(Op.EQUAL), uses("ELEMENTWISE", 16)),
    "greater": (lambda: compare_select(Op.GREATER), uses("ELEMENTWISE", 19)),
    "greater_equal": (lambda: compare_select(Op.GREATER_EQUAL), uses("ELEMENTWISE", 18)),
    "logical_and": (lambda: logical(Op.LOGICAL_AND), uses("ELEMENTWISE", 33)),
    "logical_or": (lambda: logical(Op.LOGICAL_OR), uses("ELEMENTWISE", 34)),
    "logical_xor": (lambda: logical(Op.LOGICAL_XOR), uses("ELEMENTWISE", 35)),
    "logical_not": (logical_not, uses("ELEMENTWISE")),
    "bitwise_and8": (lambda: bitwise(Op.BITWISE_AND, I8), uses("ELEMENTWISE", 33)),
    "bitwise_or16": (lambda: bitwise(Op.BITWISE_OR, I16), uses("ELEMENTWISE", 34)),
    "bitwise_xor32": (lambda: bitwise(Op.BITWISE_XOR, I32), uses("ELEMENTWISE", 35)),
    "bitwise_not8": (lambda: bitwise_not(I8), uses("ELEMENTWISE", 36)),
    "shl32": (lambda: shift(Op.LOGICAL_LEFT_SHIFT, I32), uses("ELEMENTWISE", 9)),
    "lsr32": (lambda: shift(Op.LOGICAL_RIGHT_SHIFT, I32), uses("ELEMENTWISE", 10)),
    "lsr8": (lambda: shift(Op.LOGICAL_RIGHT_SHIFT, I8), uses("ELEMENTWISE", 10)),
    "asr32_round": (lambda: shift(Op.ARITHMETIC_RIGHT_SHIFT, I32, True), uses("ELEMENTWISE", 8)),
    "asr32": (lambda: shift(Op.ARITHMETIC_RIGHT_SHIFT, I32, False), uses("ELEMENTWISE", 8)),
    "asr16": (lambda: shift(Op.ARITHMETIC_RIGHT_SHIFT, I16, True), uses("ELEMENTWISE", 8)),
    "clz": (clz, uses("ELEMENTWISE", 7)), "intdiv": (intdiv, uses("ELEMENTWISE", 11)),
    "mul32_shift": (lambda: mul32(5), uses("ELEMENTWISE", 0)),
    "min32": (lambda: minmax32(Op.MINIMUM), uses("ELEMENTWISE", 3)),
    "max32": (lambda: minmax32(Op.MAXIMUM), uses("ELEMENTWISE", 4)),
    "table8": (lambda: table(I8), uses("POOL", None, "ACTIVATION", "activation_function", 4)),
    "table16": (lambda: table(I16), uses("POOL", None, "ACTIVATION", "activation_function", 9)),
    "rescale_8_16": (lambda: rescale(I8, I16), uses("POOL")),
    "rescale_16_8_pc": (lambda: rescale(I16, I8, True), uses("POOL")),
    "rescale_32_8_single": (lambda: rescale(I32, I8, double_round=False), uses("ELEMENTWISE", 1)),
    "rescale_u8_in": (lambda: rescale(np.int8, I8, in_unsigned=True), uses("POOL")),
    "rescale_u8_out": (lambda: rescale(I8, I8, out_unsigned=True), uses("POOL")),
    "cast_8_16": (lambda: cast(I8, I16), uses("ELEMENTWISE", 1)),
    "cast_16_8": (lambda: cast(I16, I8), uses("ELEMENTWISE", 1)),
    "cast_32_8": (lambda: cast(I32, I8), uses("ELEMENTWISE", 1)),
    "negate_abs8": (lambda: negate_abs(I8), uses("ELEMENTWISE", 6)),
    "matmul8": (lambda: matmul(I8, 3, -2), uses("CONV", 1)), "matmul16": (lambda: matmul(I16), uses("CONV", 1)),
    "resize_bilinear8": (lambda: resize(ts.ResizeMode.BILINEAR, I8), uses("RESIZE", 0)),
    "resize_bilinear8_x4": (lambda: resize(ts.ResizeMode.BILINEAR, I8, (4, 1)), uses("RESIZE", 0)),
    "resize_nearest8": (lambda: resize(ts.ResizeMode.NEAREST, I8), uses("RESIZE", 2)),
    "resize_nearest8_3_2": (lambda: resize(ts.ResizeMode.NEAREST, I8, (3, 2), size=(5, 7)), uses("RESIZE", 2)),
    "resize_bilinear16": (lambda: resize(ts.ResizeMode.BILINEAR, I16), uses("RESIZE", 0)),
    "avgpool16": (lambda: pool16("avg"), uses("POOL", 1)), "maxpool16": (lambda: pool16("max"), uses("POOL", 0)),
    "reduce_sum_c": (lambda: reduce(Op.REDUCE_SUM, 3), uses("POOL")),
    "reduce_sum_h": (lambda: reduce(Op.REDUCE_SUM, 1), uses("POOL")),
    "reduce_max_w": (lambda: reduce(Op.REDUCE_MAX, 2), uses("POOL", 0)),
    "reduce_min_c": (lambda: reduce(Op.REDUCE_MIN, 3), uses("POOL")),
    "reduce_min_h16": (lambda: reduce(Op.REDUCE_MIN, 1, I16), uses("POOL", 5)),
    # kernels the hardware cannot stride over: one 1x1 op per tap summing in the kept accumulator
    "depthwise_stride4": (lambda: conv2d(True, 4, False), uses("DEPTHWISE", None, "ACC_FORMAT", "acc_input", 1)),
    "transpose_conv_s2": (lambda: transpose_conv(2), uses("CONV")),
    "conv_dynamic_weights": (lambda: conv2d(False, 1, True), uses("CONV", 1)),
    "transpose_0312_16": (lambda: transpose([0, 3, 1, 2], I16), uses("POOL", None, "OFM_PRECISION",
                                                                       "activation_transpose", 6)),
    "transpose_0213_32": (lambda: transpose([0, 2, 1, 3], I32), uses("POOL", None, "OFM_PRECISION",
                                                                       "activation_transpose", 1)),
    # the other hardware transposes (OFM written HCW, WCH, CWH), int8
    **{f"transpose_{''.join(map(str, perm))}": (lambda perm=perm: transpose(perm, I8), uses(
        "POOL", None, "OFM_PRECISION", "activation_transpose", code)) for perm, code in
       (([0, 1, 3, 2], 2), ([0, 2, 3, 1], 3), ([0, 3, 2, 1], 7))},
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_u85_tosa_op_bitexact(name):
    build, used = CASES[name]
    g = build()
    tosa = g.serialize()
    with tempfile.TemporaryDirectory() as tmp:
        npz = vela_raw(tosa, Path(tmp), "ethos-u85-256")
        assert_bitexact(tosa, g.io, npz)
        cmds = decode(load_raw(npz).commands, "x", COMMANDS)
    assert any(used(c) for c in cmds), sorted({(c.kind, c.param) for c in cmds})
