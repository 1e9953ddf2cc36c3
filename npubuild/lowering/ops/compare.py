"""Comparisons and selection: Greater, Less, GreaterOrEqual, LessOrEqual, Where.

These are the ops Ethos-U85 runs and Ethos-U55/U65 do not (Vela has no
GREATER or SELECT there), so they are what target-aware partitioning moves to
the host on U55. INT profile: a comparison of an int8 tensor with a constant
is exact in integers, `(x - zp) * s > c  <=>  x - zp > floor(c / s)`; TOSA
PRO-INT compares int32, so x is first RESCALEd (scale 1) to int32. With equality the bound moves by
one integer step instead (`x - zp >= c / s  <=>  x - zp > ceil(c / s) - 1`): GreaterOrEqual(score, 0.5),
the gate of openWakeWord's second stage, is then the same GREATER as Greater; two tensors compare with
GREATER_EQUAL.
"""

from __future__ import annotations

import math

import numpy as np

from npubuild.lowering.broadcast import broadcast_pair, operand, operand_rank
from npubuild.lowering.context import LoweringContext, TTensor
from npubuild.lowering.emit import Op, attr, requantize, rescale, reshape, to_layout
from npubuild.lowering.registry import lowers


def _scalar_const(ctx: LoweringContext, value, dtype, rank: int) -> str:
    return ctx.const(np.full((1,) * rank, value, dtype=dtype), "cmp")


def _same_rank(ctx: LoweringContext, x: TTensor, rank: int) -> TTensor:
    if len(x.shape) == rank:
        return x
    logical = (1,) * (rank - len(x.shape)) + x.logical_shape
    x = to_layout(ctx, x, tuple(range(len(x.shape))))
    return reshape(ctx, x, logical, tuple(range(rank)))


def _bound(t: float, greater: bool, or_equal: bool) -> int:
    """The integer k with (x > c) == (x - zp > k) (greater) or (x < c) == (k > x - zp), for t = c / s."""
    if greater:
        return math.ceil(t) - 1 if or_equal else math.floor(t)
    return math.floor(t) + 1 if or_equal else math.ceil(t)


def _compare(ctx: LoweringContext, greater: bool, or_equal: bool = False) -> None:
    """x > c (or <) with x an activation; a constant first operand is swapped into second place with the
    comparison flipped (Less(c, x) is Greater(x, c)). Two int8 tensors on different scales are compared on a
    common int32 grid 2**20 finer than the coarser one, as Add aligns its operands (exact but for values
    closer than that)."""
    if ctx.constant(0) is not None and ctx.constant(1) is None:
        x, c, greater = ctx.tensor(1), ctx.constant(0), not greater
        other_index = 0
    else:
        x, c, other_index = ctx.tensor(0), ctx.constant(1), 1
    out_name = ctx.current.output[0]
    if ctx.profile == "fp":
        if c is not None and np.asarray(c).size == 1:
            rank = len(x.shape)
            other = _scalar_const(ctx, float(np.asarray(c).ravel()[0]), np.float32, rank)
            shape, perm = x.shape, x.perm
        else:
            x, y = broadcast_pair(ctx, x, operand(ctx, other_index, max(len(x.shape), operand_rank(ctx, other_index))))
            other = y.name
            shape = tuple(max(p, q) for p, q in zip(x.shape, y.shape, strict=True))
            perm = x.perm
        out = ctx.new_tensor(shape, np.bool_, perm, output_of=out_name)
        ins = [x.name, other] if greater else [other, x.name]
        ctx.op(Op.GREATER_EQUAL if or_equal else Op.GREATER, ins, [out.name], _attr(or_equal))
        ctx.set_output(0, out)
        return
    if x.q is None or x.q.axis is not None:
        raise ctx.unsupported("the compared tensor must be per-tensor quantized")
    if c is not None and np.asarray(c).size == 1:
        rank = len(x.shape)
        x32 = rescale(ctx, x, 1.0, np.int32, x.q.zp, 0, None)
        t = float(np.asarray(c).ravel()[0]) / x.q.s
        other = _scalar_const(ctx, _bound(t, greater, or_equal), np.int32, rank)
        shape = x.shape
        or_equal = False  # folded into the integer bound
    else:
        x, y = broadcast_pair(ctx, x, operand(ctx, other_index, max(len(x.shape), operand_rank(ctx, other_index))))
        if y.q is None or y.q.axis is not None:
            raise ctx.unsupported("both compared tensors must be per-tensor quantized")
        if y.q.same_as(x.q):
            x32 = rescale(ctx, x, 1.0, np.int32, x.q.zp, 0, None)
            other = rescale(ctx, y, 1.0, np.int32, y.q.zp, 0, None).name
        else:
            top = max(x.q.s, y.q.s)
            x32 = rescale(ctx, x, x.q.s / top * (1 << 20), np.int32, x.q.zp, 0, None)
            other = rescale(ctx, y, y.q.s / top * (1 << 20), np.int32, y.q.zp, 0, None).name
        shape = tuple(max(p, q) for p, q in zip(x.shape, y.shape, strict=True))
    out = ctx.new_tensor(shape, np.bool_, x.perm, output_of=out_name)
    ctx.op(Op.GREATER_EQUAL if or_equal else Op.GREATER, [x32.name, other] if greater else [other, x32.name], [out.name], _attr(or_equal))
    ctx.set_output(0, out)


def _attr(or_equal: bool):
    return attr("GreaterEqual") if or_equal else attr("Greater")


@lowers("Greater")
def lower_greater(ctx: LoweringContext) -> None:
    _compare(ctx, greater=True)


@lowers("Less")
def lower_less(ctx: LoweringContext) -> None:
    _compare(ctx, greater=False)


@lowers("GreaterOrEqual")
def lower_greater_or_equal(ctx: LoweringContext) -> None:
    _compare(ctx, greater=True, or_equal=True)


@lowers("LessOrEqual")
def lower_less_or_equal(ctx: LoweringContext) -> None:
    _compare(ctx, greater=False, or_equal=True)


@lowers("Where")
def lower_where(ctx: LoweringContext) -> None:
    cond = ctx.tensor(0)
    a, b = ctx.tensor(1), ctx.tensor(2)
    rank = max(len(cond.shape), len(a.shape), len(b.shape))
    cond = _same_rank(ctx, cond, rank)
    a = to_layout(ctx, _same_rank(ctx, a, rank), cond.perm)
    b = to_layout(ctx, _same_rank(ctx, b, rank), cond.perm)
    shape = tuple(int(max(p, q, r)) for p, q, r in zip(cond.shape, a.shape, b.shape, strict=True))
    out_name = ctx.current.output[0]
    if ctx.profile == "int":
        out_q = ctx.require_output_q()
        if a.q is None or b.q is None:
            raise ctx.unsupported("both selected operands must be quantized")
        a, b = requantize(ctx, a, out_q), requantize(ctx, b, out_q)
        out = ctx.new_tensor(shape, out_q.dtype, cond.perm, out_q, output_of=out_name)
    else:
        out = ctx.new_tensor(shape, np.float32, cond.perm, output_of=out_name)
    ctx.op(Op.SELECT, [cond.name, a.name, b.name], [out.name], attr("Select"))
    ctx.set_output(0, out)
