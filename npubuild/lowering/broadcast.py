"""Operand broadcasting for binary elementwise ops (ranks and shapes lined up as TOSA wants them)."""

from __future__ import annotations

import numpy as np

from npubuild.lowering.context import LoweringContext, QConst, TTensor
from npubuild.lowering.emit import reshape, to_layout

CONST_BITS = 23  # precision of an int32 constant operand of Mul/Div (|product| stays below 2**31)


def broadcast_pair(ctx: LoweringContext, a: TTensor, b: TTensor) -> tuple[TTensor, TTensor]:
    """Both tensors in one layout and one rank (TOSA broadcasts only between equal ranks)."""
    ra, rb = len(a.shape), len(b.shape)
    if ra < rb:
        a = unsqueeze_front(ctx, a, rb)
    elif rb < ra:
        b = unsqueeze_front(ctx, b, ra)
    # the larger operand keeps its layout (the smaller is usually a constant or a broadcast vector)
    layout = a.perm if int(np.prod(a.shape)) >= int(np.prod(b.shape)) else b.perm
    return to_layout(ctx, a, layout), to_layout(ctx, b, layout)


def broadcast_operands(ctx: LoweringContext) -> tuple[TTensor, TTensor]:
    """Inputs 0 and 1 of the current node, ready for a TOSA binary op."""
    rank = max(operand_rank(ctx, 0), operand_rank(ctx, 1))
    return broadcast_pair(ctx, operand(ctx, 0, rank), operand(ctx, 1, rank))


def operand_rank(ctx: LoweringContext, i: int) -> int:
    v = ctx.values.get(ctx.current.input[i])
    if isinstance(v, QConst):
        return v.data.ndim
    if isinstance(v, np.ndarray):
        return v.ndim
    return len(ctx.tensor(i).shape)


def operand(ctx: LoweringContext, i: int, rank: int) -> TTensor:
    """Input i; a constant gets leading unit dims in numpy (no RESHAPE op) before it becomes a TOSA constant."""
    v = ctx.values.get(ctx.current.input[i])
    if isinstance(v, QConst) and ctx.profile == "int" and v.q.axis is None:
        return ctx.materialize_const(v.data.reshape((1,) * (rank - v.data.ndim) + v.data.shape), v.q, "qconst")
    if isinstance(v, np.ndarray) and ctx.profile == "fp" and v.dtype.kind in "fiu":  # Pow(float, int64 y): float y
        return ctx.materialize_const(v.astype(np.float32).reshape((1,) * (rank - v.ndim) + v.shape), None)
    return ctx.tensor(i)


def unsqueeze_front(ctx: LoweringContext, x: TTensor, rank: int) -> TTensor:
    logical = (1,) * (rank - len(x.shape)) + x.logical_shape
    x = to_layout(ctx, x, tuple(range(len(x.shape))))
    return reshape(ctx, x, logical, tuple(range(rank)))
