"""Reductions: ReduceMean, ReduceSum, ReduceMax, ReduceMin (axes as attribute or input, keepdims).

Integer form: ReduceSum/ReduceMean widen to int32 (minus the zero point),
REDUCE_SUM exactly, and round once in the RESCALE to the output (the mean's
1/count folds into that scale). ReduceMax/Min stay int8 (order is kept by
the affine map) and requantize only if the output's parameters differ. A
mean over H and W of an NHWC tensor is a global average pool, which Vela
runs natively instead of transposing for a REDUCE_SUM over non-channel axes.
"""

from __future__ import annotations

import numpy as np

from npubuild.lowering.context import NHWC, LoweringContext, TTensor
from npubuild.lowering.emit import Op, attr, requantize, reshape
from npubuild.lowering.pooling import avg_pool
from npubuild.lowering.reduction import emit_reduce, int_sum, physical_axes
from npubuild.lowering.registry import lowers, quantize_also

quantize_also("ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin")  # onnxruntime leaves them in float on their own

MAX_POOL_KERNEL_H, MAX_POOL_KERNEL_AREA = 64, 4096  # what both AVG_POOL2D and DEPTHWISE_CONV2D accept on Vela


def reduce_axes(ctx: LoweringContext, rank: int) -> list[int] | None:
    """The logical axes to reduce, sorted; None means the node is an identity (noop_with_empty_axes)."""
    axes = ctx.attr("axes")
    if ctx.has_input(1):
        v = ctx.constant(1)
        if v is None:
            raise ctx.unsupported("axes must be a constant")
        axes = [int(a) for a in v.reshape(-1)]
    if not axes:
        return None if int(ctx.attr("noop_with_empty_axes", 0)) else list(range(rank))
    return sorted({a + rank if a < 0 else a for a in axes})






def drop_axes(ctx: LoweringContext, x: TTensor, axes: list[int], keepdims: bool, output_of: str | None) -> TTensor:
    """After the reduction: the keepdims=0 result is a reshape that removes the unit axes (order is kept)."""
    if keepdims:
        return reshape(ctx, x, x.shape, x.perm, output_of=output_of) if output_of else x
    keep = [j for j, p in enumerate(x.perm) if p not in axes]
    remaining = [x.perm[j] for j in keep]
    rank = {p: i for i, p in enumerate(sorted(remaining))}
    perm = tuple(rank[p] for p in remaining)
    return reshape(ctx, x, tuple(x.shape[j] for j in keep), perm, output_of=output_of)


def _finish(ctx: LoweringContext, y: TTensor, axes: list[int], keepdims: bool) -> None:
    out_name = ctx.current.output[0]
    ctx.set_output(0, drop_axes(ctx, y, axes, keepdims, out_name if ctx.is_graph_output(out_name) else None))


def _reduction(ctx: LoweringContext) -> tuple[TTensor, list[int], bool] | None:
    """The input, its logical reduce axes and keepdims; None (output bound to the input) for a no-op reduce."""
    x = ctx.tensor(0)
    axes = reduce_axes(ctx, len(x.shape))
    if axes is None:
        ctx.set_output(0, x)
        return None
    return x, axes, bool(int(ctx.attr("keepdims", 1)))


def _sum_like(ctx: LoweringContext, mean: bool) -> None:
    args = _reduction(ctx)
    if args is None:
        return
    x, axes, keepdims = args
    count = int(np.prod([x.logical_shape[a] for a in axes]))
    phys = physical_axes(x, axes)
    if mean and ctx.profile == "int" and _spatial_mean(ctx, x, phys, keepdims):
        return
    if ctx.profile == "fp":
        y = emit_reduce(ctx, Op.REDUCE_SUM, x, phys)
        if mean:
            out = ctx.new_tensor(y.shape, np.float32, y.perm)
            inv = ctx.const(np.full((1,) * len(y.shape), 1.0 / count, np.float32), "inv_count")
            ctx.op(Op.MUL, [y.name, inv, ctx.const(np.zeros(1, np.int8), "shift")], [out.name], attr("Mul"))
            y = out
        _finish(ctx, y, axes, keepdims)
        return
    y = int_sum(ctx, x, phys, count if mean else 1, None)
    _finish(ctx, y, axes, keepdims)




def _spatial_mean(ctx: LoweringContext, x: TTensor, phys: list[int], keepdims: bool) -> bool:
    """Mean over H and W of an NHWC tensor, keepdims, same scale in and out: one AVG_POOL2D (exact then)."""
    out_q = ctx.require_output_q()
    if not (x.perm == NHWC and phys == [1, 2] and keepdims and x.q is not None and x.q.same_as(out_q)):
        return False
    if x.shape[1] > MAX_POOL_KERNEL_H or x.shape[1] * x.shape[2] > MAX_POOL_KERNEL_AREA:
        return False
    ctx.set_output(0, avg_pool(ctx, x, (x.shape[1], x.shape[2]), (1, 1), [0, 0, 0, 0],
                               output_of=ctx.current.output[0]))
    return True


def _max_like(ctx: LoweringContext, op) -> None:
    args = _reduction(ctx)
    if args is None:
        return
    x, axes, keepdims = args
    y = emit_reduce(ctx, op, x, physical_axes(x, axes))
    if ctx.profile == "int":
        out_q = ctx.output_q()
        if out_q is not None and x.q is not None and not x.q.same_as(out_q):
            y = requantize(ctx, y, out_q)
    _finish(ctx, y, axes, keepdims)


@lowers("ReduceSum")
def lower_reduce_sum(ctx: LoweringContext) -> None:
    _sum_like(ctx, mean=False)


@lowers("ReduceMean")
def lower_reduce_mean(ctx: LoweringContext) -> None:
    _sum_like(ctx, mean=True)


@lowers("ReduceMax")
def lower_reduce_max(ctx: LoweringContext) -> None:
    _max_like(ctx, Op.REDUCE_MAX)


@lowers("ReduceMin")
def lower_reduce_min(ctx: LoweringContext) -> None:
    _max_like(ctx, Op.REDUCE_MIN)
