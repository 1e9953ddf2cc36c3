"""fp32 TOSA building blocks for the FP profile, so composite lowerings read like the formula they compute.

Every helper emits one TOSA op (`gelu` a few) and returns its result; scalars become
rank-matched [1,...,1] constants (TOSA broadcasts only between equal ranks).
The last op of a composition takes `output_of` so a graph output becomes a
TOSA output.
"""

from __future__ import annotations

import math

import numpy as np
import tosa_serializer as ts

from npubuild.lowering.context import LoweringContext, TTensor
from npubuild.lowering.emit import Op, attr

NAN_MODE = ts.NanPropagationMode.PROPAGATE


def scalar(ctx: LoweringContext, value: float, like: TTensor) -> TTensor:
    """A float constant broadcastable against `like` (same rank, all dims 1)."""
    shape = (1,) * len(like.shape)
    name = ctx.const(np.full(shape, value, np.float32), "fconst")
    return TTensor(name, shape, np.dtype(np.float32), like.perm)


def _out(ctx: LoweringContext, a: TTensor, b: TTensor | None, output_of: str | None) -> TTensor:
    shape = a.shape if b is None else tuple(max(p, q) for p, q in zip(a.shape, b.shape, strict=True))
    perm = a.perm if b is None or a.shape == shape else b.perm
    return ctx.new_tensor(shape, np.float32, perm, output_of=output_of)


def unary(ctx: LoweringContext, op, kind: str, x: TTensor, output_of: str | None = None) -> TTensor:
    """A one-input fp op without extra operands (SIGMOID, TANH, EXP, LOG, ERF, ABS, RECIPROCAL, RSQRT)."""
    out = _out(ctx, x, None, output_of)
    ctx.op(op, [x.name], [out.name], attr(kind))
    return out


def negate(ctx: LoweringContext, x: TTensor, output_of: str | None = None) -> TTensor:
    out = _out(ctx, x, None, output_of)
    zero = ctx.const(np.zeros([1], np.float32), "zp")
    ctx.op(Op.NEGATE, [x.name, zero, ctx.const(np.zeros([1], np.float32), "zp")], [out.name], attr("Negate"))
    return out


def binary(ctx: LoweringContext, op, kind: str, a: TTensor, b: TTensor, output_of: str | None = None) -> TTensor:
    """ADD, SUB, POW (operands already of equal rank and layout)."""
    out = _out(ctx, a, b, output_of)
    ctx.op(op, [a.name, b.name], [out.name], attr(kind))
    return out


def add(ctx: LoweringContext, a: TTensor, b: TTensor, output_of: str | None = None) -> TTensor:
    return binary(ctx, Op.ADD, "Add", a, b, output_of)


def sub(ctx: LoweringContext, a: TTensor, b: TTensor, output_of: str | None = None) -> TTensor:
    return binary(ctx, Op.SUB, "Sub", a, b, output_of)


def mul(ctx: LoweringContext, a: TTensor, b: TTensor, output_of: str | None = None) -> TTensor:
    """MUL; TOSA 1.0 gives it a shift operand, which must be 0 for floats."""
    out = _out(ctx, a, b, output_of)
    ctx.op(Op.MUL, [a.name, b.name, ctx.const(np.zeros([1], np.int8), "shift")], [out.name], attr("Mul"))
    return out


def minimum(ctx: LoweringContext, a: TTensor, b: TTensor, output_of: str | None = None) -> TTensor:
    out = _out(ctx, a, b, output_of)
    ctx.op(Op.MINIMUM, [a.name, b.name], [out.name], attr("Minimum", NAN_MODE))
    return out


def maximum(ctx: LoweringContext, a: TTensor, b: TTensor, output_of: str | None = None) -> TTensor:
    out = _out(ctx, a, b, output_of)
    ctx.op(Op.MAXIMUM, [a.name, b.name], [out.name], attr("Maximum", NAN_MODE))
    return out


def mul_scalar(ctx: LoweringContext, x: TTensor, value: float, output_of: str | None = None) -> TTensor:
    return mul(ctx, x, scalar(ctx, value, x), output_of)


def add_scalar(ctx: LoweringContext, x: TTensor, value: float, output_of: str | None = None) -> TTensor:
    return add(ctx, x, scalar(ctx, value, x), output_of)


def greater(ctx: LoweringContext, a: TTensor, b: TTensor) -> TTensor:
    """a > b as a BOOL tensor (operands of equal rank)."""
    shape = tuple(max(p, q) for p, q in zip(a.shape, b.shape, strict=True))
    out = ctx.new_tensor(shape, np.bool_, a.perm if a.shape == shape else b.perm)
    ctx.op(Op.GREATER, [a.name, b.name], [out.name], attr("Greater"))
    return out


def equal(ctx: LoweringContext, a: TTensor, b: TTensor) -> TTensor:
    shape = tuple(max(p, q) for p, q in zip(a.shape, b.shape, strict=True))
    out = ctx.new_tensor(shape, np.bool_, a.perm if a.shape == shape else b.perm)
    ctx.op(Op.EQUAL, [a.name, b.name], [out.name], attr("Equal"))
    return out


def logical(ctx: LoweringContext, op, kind: str, a: TTensor, b: TTensor) -> TTensor:
    """LOGICAL_AND / LOGICAL_OR of two BOOL tensors."""
    out = ctx.new_tensor(a.shape, np.bool_, a.perm)
    ctx.op(op, [a.name, b.name], [out.name], attr(kind))
    return out


def select(ctx: LoweringContext, cond: TTensor, a: TTensor, b: TTensor, output_of: str | None = None) -> TTensor:
    """cond ? a : b (a and b broadcast to cond's shape)."""
    out = ctx.new_tensor(cond.shape, np.float32, cond.perm, output_of=output_of)
    ctx.op(Op.SELECT, [cond.name, a.name, b.name], [out.name], attr("Select"))
    return out


def floor(ctx: LoweringContext, x: TTensor, output_of: str | None = None) -> TTensor:
    return unary(ctx, Op.FLOOR, "Floor", x, output_of)


def gelu(ctx: LoweringContext, x: TTensor, tanh: bool, output_of: str | None = None) -> TTensor:
    """0.5 x (1 + erf(x / sqrt 2)), or with `tanh` the approximation 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715
    x^3))): ONNX's Gelu and the com.microsoft Gelu/FastGelu/BiasGelu share it."""
    if tanh:
        cube = mul(ctx, mul(ctx, x, x), x)
        inner = mul_scalar(ctx, add(ctx, x, mul_scalar(ctx, cube, 0.044715)), math.sqrt(2.0 / math.pi))
        s = unary(ctx, Op.TANH, "Tanh", inner)
    else:
        s = unary(ctx, Op.ERF, "Erf", mul_scalar(ctx, x, 1.0 / math.sqrt(2.0)))
    return mul(ctx, mul_scalar(ctx, x, 0.5), add_scalar(ctx, s, 1.0), output_of=output_of)
