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
import tosa_serializer as ts

from npubuild.lowering.context import NHWC, LoweringContext, TTensor
from npubuild.lowering.emit import Op, attr, requantize, rescale, reshape
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


def physical_axes(x: TTensor, axes: list[int]) -> list[int]:
    return [j for j, p in enumerate(x.perm) if p in axes]


def emit_reduce(ctx: LoweringContext, op, x: TTensor, phys_axes: list[int], q=None) -> TTensor:
    """TOSA REDUCE_* over physical axes (kept as size 1).

    TOSA reduces one axis per op; adjacent axes (H and W of NHWC) are merged
    by a free RESHAPE into one and reduced once: fewer ops, and Vela's
    chained int32 REDUCE_SUM over two non-channel axes (through its own
    transposes) was seen to differ from the TOSA reference on npu-sim.
    """
    axes = sorted(phys_axes)
    runs: list[list[int]] = []
    for ax in axes:
        if runs and runs[-1][-1] == ax - 1:
            runs[-1].append(ax)
        else:
            runs.append([ax])
    for run in reversed(runs):  # from the back, so earlier axis numbers stay valid
        first, last = run[0], run[-1]
        kept = tuple(1 if first <= i <= last else s for i, s in enumerate(x.shape))
        src = x
        if len(run) > 1:
            merged = (*x.shape[:first], int(np.prod(x.shape[first:last + 1])), *x.shape[last + 1:])
            src = reshape(ctx, x, merged, tuple(range(len(merged))))
        shape = tuple(1 if i == first else s for i, s in enumerate(src.shape))
        out = ctx.new_tensor(shape, x.dtype, src.perm, q if q is not None else x.q)
        if op in (Op.REDUCE_MAX, Op.REDUCE_MIN):
            a = attr("ReduceMax" if op == Op.REDUCE_MAX else "ReduceMin", first, ts.NanPropagationMode.PROPAGATE)
        else:
            a = attr("ReduceSum", first)
        ctx.op(op, [src.name], [out.name], a)
        x = reshape(ctx, out, kept, x.perm) if len(run) > 1 else TTensor(out.name, out.shape, out.dtype, x.perm, out.q)
    return x


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


def int_sum(ctx: LoweringContext, x: TTensor, phys: list[int], divisor: int, output_of: str | None) -> TTensor:
    """sum(x - zp) / divisor over physical axes, rounded once into the node's output quantisation.

    Widened to int32, summed exactly by REDUCE_SUM (adjacent axes merged), one
    RESCALE. For a global average this beats a DEPTHWISE_CONV2D of ones by 2x
    on Vela (U55 41k vs 87k cycles, U85 38k vs 86k for 32x32x64) and is exact.
    """
    out_q = ctx.require_output_q()
    assert x.q is not None
    wide = rescale(ctx, x, 1.0, np.int32, x.q.zp, 0, None)
    total = emit_reduce(ctx, Op.REDUCE_SUM, wide, phys)
    return rescale(ctx, total, x.q.s / out_q.s / divisor, out_q.dtype, 0, out_q.zp, out_q, output_of=output_of)


def _spatial_mean(ctx: LoweringContext, x: TTensor, phys: list[int], keepdims: bool) -> bool:
    """Mean over H and W of an NHWC tensor, keepdims, same scale in and out: one AVG_POOL2D (exact then)."""
    out_q = ctx.require_output_q()
    if not (x.perm == NHWC and phys == [1, 2] and keepdims and x.q is not None and x.q.same_as(out_q)):
        return False
    if x.shape[1] > MAX_POOL_KERNEL_H or x.shape[1] * x.shape[2] > MAX_POOL_KERNEL_AREA:
        return False
    from npubuild.lowering.ops_pool import avg_pool

    avg_pool(ctx, x, (x.shape[1], x.shape[2]), (1, 1), [0, 0, 0, 0])
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
