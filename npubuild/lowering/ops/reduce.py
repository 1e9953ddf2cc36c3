"""Reductions: ReduceMean, ReduceSum, ReduceMax, ReduceMin, ReduceSumSquare, ReduceL1, ReduceL2, ReduceLogSum,
ReduceLogSumExp, ReduceProd (axes as attribute or input, keepdims).

Integer form: ReduceSum/ReduceMean widen to int32 (minus the zero point),
REDUCE_SUM exactly, and round once in the RESCALE to the output (the mean's
1/count folds into that scale). ReduceMax/Min stay int8 (order is kept by
the affine map) and requantize only if the output's parameters differ. A
mean over H and W of an NHWC tensor is a global average pool, which Vela
runs natively instead of transposing for a REDUCE_SUM over non-channel axes.

The other reductions in int8 keep the same shape: an exact int32 transform of x - zp (the square by
MUL, |v| by ABS), an exact REDUCE_SUM, then one per-row step and one RESCALE. ReduceL2's square root is
sum * rsqrt(sum) with the layer norm's Newton-Raphson rsqrt (relative error < 1e-4); ReduceLogSum's
logarithm is CLZ plus a mantissa TABLE, and ReduceLogSumExp is the log softmax's exp-sum-log
(fusion/softmax_int.py). ReduceProd multiplies int32 slices (two factors in int8: a longer chain of int32
MULs, shifting right as the bound grows, matched the reference model but not U55's command stream on
npu-sim, so it is refused and runs on the host; REDUCE_PRODUCT in fp32).
"""

from __future__ import annotations

import math

import numpy as np

from npubuild.lowering import fp
from npubuild.lowering import intmath as im
from npubuild.lowering.context import NHWC, LoweringContext, TTensor, identity
from npubuild.lowering.emit import Op, attr, requantize, rescale, reshape, to_layout
from npubuild.lowering.fusion.norm_rows import rsqrt_rows
from npubuild.lowering.fusion.softmax_int import LOG_FRAC_BITS, ln_int32, log_sum_exp_int
from npubuild.lowering.movement import slice_phys
from npubuild.lowering.pooling import avg_pool
from npubuild.lowering.reduction import axis_last, emit_reduce, int_sum, physical_axes
from npubuild.lowering.registry import lowers, quantize_also

quantize_also("ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin")  # onnxruntime leaves them in float on their own
quantize_also("ReduceSumSquare", "ReduceL1", "ReduceL2", "ReduceLogSum", "ReduceLogSumExp", "ReduceProd")
MAX_INT_PRODUCT_FACTORS = 2  # a chain of int32 MULs (3+ factors) was not bit-exact on U55 (npu-sim): refused

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


def _reduction(ctx: LoweringContext) -> tuple[TTensor, list[int], bool, int, list[int]] | None:
    """The input, its logical reduce axes, keepdims, the elements each output reduces and the physical axes;
    None (output bound to the input) for a no-op reduce."""
    x = ctx.tensor(0)
    axes = reduce_axes(ctx, len(x.shape))
    if axes is None:
        ctx.set_output(0, x)
        return None
    return x, axes, bool(int(ctx.attr("keepdims", 1))), int(np.prod([x.logical_shape[a] for a in axes])), \
        physical_axes(x, axes)


def _sum_like(ctx: LoweringContext, mean: bool) -> None:
    args = _reduction(ctx)
    if args is None:
        return
    x, axes, keepdims, count, phys = args
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
    x, axes, keepdims, _, phys = args
    y = emit_reduce(ctx, op, x, phys)
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


# ---------------------------------------------------------------------------------------------- sum-like transforms


def _int_transformed_sum(ctx: LoweringContext, x: TTensor, phys: list[int], square: bool) -> TTensor:
    """sum over physical axes of (x - zp)^2 or |x - zp|, exact in int32."""
    assert x.q is not None
    v = im.widen(ctx, x)
    if square:
        t = im.mul(ctx, v, v, 0)
    else:
        t = ctx.new_tensor(v.shape, np.int32, v.perm)
        ctx.op(Op.ABS, [v.name], [t.name], attr("Abs"))
    return emit_reduce(ctx, Op.REDUCE_SUM, t, phys)


def _int_reduction_input(ctx: LoweringContext, x: TTensor, count: int, per_element: int) -> None:
    if x.q is None or x.dtype != np.int8:
        raise ctx.unsupported("the integer reduction needs an int8 input")
    if count * per_element >= 2**31:
        raise ctx.unsupported(f"a sum over {count} elements overflows int32")


def _sum_square_like(ctx: LoweringContext, kind: str) -> None:
    """ReduceSumSquare (kind "square"), ReduceL1 ("abs"), ReduceL2 ("l2")."""
    args = _reduction(ctx)
    if args is None:
        return
    x, axes, keepdims, count, phys = args
    if ctx.profile == "fp":
        t = fp.mul(ctx, x, x) if kind != "abs" else fp.unary(ctx, Op.ABS, "Abs", x)
        y = emit_reduce(ctx, Op.REDUCE_SUM, t, phys)
        if kind == "l2":
            y = fp.binary(ctx, Op.POW, "Pow", y, fp.scalar(ctx, 0.5, y))
        _finish(ctx, y, axes, keepdims)
        return
    out_q = ctx.require_output_q()
    _int_reduction_input(ctx, x, count, 255 if kind == "abs" else 65025)
    rows = _rows(ctx, x, axes)  # computed int32 tensors are summed along the last axis only (see axis_last)
    total = _int_transformed_sum(ctx, rows, [len(rows.shape) - 1], square=kind != "abs")
    s = x.q.s
    if kind == "abs":
        y = rescale(ctx, total, s / out_q.s, out_q.dtype, 0, out_q.zp, out_q)
    elif kind == "square":
        y = rescale(ctx, total, s * s / out_q.s, out_q.dtype, 0, out_q.zp, out_q)
    else:
        y = _int_sqrt(ctx, total, math.sqrt(count * 65025.0), s, out_q)
    _finish(ctx, _unrows(ctx, y, x, axes), axes, keepdims)


def _int_sqrt(ctx: LoweringContext, total: TTensor, bound: float, unit: float, out_q) -> TTensor:
    """sqrt(total) * unit into out_q, for int32 total >= 0 below bound^2: total * rsqrt(max(total, 1))."""
    one = im.const_i32(ctx, 1, total)
    clamped = ctx.new_tensor(total.shape, np.int32, total.perm)
    ctx.op(Op.MAXIMUM, [total.name, one.name], [clamped.name], attr("Maximum", fp.NAN_MODE))
    a = rsqrt_rows(ctx, clamped)  # 1/sqrt(v) = a 2^-30
    frac = min(15, 30 - math.ceil(math.log2(bound + 1)))  # sqrt(total) 2^frac stays below 2^30
    r = im.mul(ctx, total, a, 30 - frac)
    return rescale(ctx, r, unit * 2.0**-frac / out_q.s, out_q.dtype, 0, out_q.zp, out_q)


@lowers("ReduceSumSquare")
def lower_reduce_sum_square(ctx: LoweringContext) -> None:
    _sum_square_like(ctx, "square")


@lowers("ReduceL1")
def lower_reduce_l1(ctx: LoweringContext) -> None:
    _sum_square_like(ctx, "abs")


@lowers("ReduceL2")
def lower_reduce_l2(ctx: LoweringContext) -> None:
    _sum_square_like(ctx, "l2")


# ---------------------------------------------------------------------------------------------- logarithms


@lowers("ReduceLogSum")
def lower_reduce_log_sum(ctx: LoweringContext) -> None:
    """log(sum x): in int8 the exact int32 sum (at least 1: the log of a non-positive sum is not finite),
    ln by CLZ + mantissa TABLE in 2^-12 output LSBs, one RESCALE."""
    args = _reduction(ctx)
    if args is None:
        return
    x, axes, keepdims, count, phys = args
    if ctx.profile == "fp":
        _finish(ctx, fp.unary(ctx, Op.LOG, "Log", emit_reduce(ctx, Op.REDUCE_SUM, x, phys)), axes, keepdims)
        return
    out_q = ctx.require_output_q()
    _int_reduction_input(ctx, x, count, 255)
    rows = _rows(ctx, x, axes)
    total = emit_reduce(ctx, Op.REDUCE_SUM, im.widen(ctx, rows), [len(rows.shape) - 1])
    positive = ctx.new_tensor(total.shape, np.int32, total.perm)
    ctx.op(Op.MAXIMUM, [total.name, im.const_i32(ctx, 1, total).name], [positive.name], attr("Maximum", fp.NAN_MODE))
    unit = out_q.s * 2.0**-LOG_FRAC_BITS
    y = im.add(ctx, ln_int32(ctx, positive, unit), im.const_i32(ctx, round(math.log(x.q.s) / unit), positive))
    y = rescale(ctx, y, 2.0**-LOG_FRAC_BITS, out_q.dtype, 0, out_q.zp, out_q)
    _finish(ctx, _unrows(ctx, y, x, axes), axes, keepdims)


@lowers("ReduceLogSumExp")
def lower_reduce_log_sum_exp(ctx: LoweringContext) -> None:
    args = _reduction(ctx)
    if args is None:
        return
    x, axes, keepdims, _, phys = args
    if ctx.profile == "fp":
        mx = emit_reduce(ctx, Op.REDUCE_MAX, x, phys)
        e = fp.unary(ctx, Op.EXP, "Exp", fp.sub(ctx, x, mx))
        y = fp.add(ctx, mx, fp.unary(ctx, Op.LOG, "Log", emit_reduce(ctx, Op.REDUCE_SUM, e, phys)))
        _finish(ctx, y, axes, keepdims)
        return
    out_q = ctx.require_output_q()
    if x.q is None or x.dtype != np.int8:
        raise ctx.unsupported("the integer log-sum-exp needs an int8 input")
    rows = _rows(ctx, x, axes)
    y = log_sum_exp_int(ctx, rows, out_q, None)
    _finish(ctx, _unrows(ctx, y, x, axes), axes, keepdims)


def _rows(ctx: LoweringContext, x: TTensor, axes: list[int]) -> TTensor:
    """x with the reduced logical axes physically last, merged into one: [kept..., K]."""
    x = axis_last(ctx, x, axes)
    kept = [x.shape[j] for j, p in enumerate(x.perm) if p not in axes]
    k = int(np.prod([x.logical_shape[a] for a in axes]))
    return reshape(ctx, x, (*kept, k), tuple(range(len(kept) + 1)))


def _unrows(ctx: LoweringContext, y: TTensor, x: TTensor, axes: list[int]) -> TTensor:
    """The [kept..., 1] result as x's rank with the reduced axes of size 1 (keepdims form, layout of x's kept
    axes then the reduced ones, as _rows moved them)."""
    order = tuple(p for p in x.perm if p not in axes) + tuple(axes)  # physical order after axis_last
    shape = tuple(1 if p in axes else x.logical_shape[p] for p in order)
    return reshape(ctx, y, shape, order)


# ---------------------------------------------------------------------------------------------- product


@lowers("ReduceProd")
def lower_reduce_prod(ctx: LoweringContext) -> None:
    args = _reduction(ctx)
    if args is None:
        return
    x, axes, keepdims, _, phys = args
    if ctx.profile == "fp":
        _finish(ctx, emit_reduce(ctx, Op.REDUCE_PRODUCT, x, phys), axes, keepdims)
        return
    out_q = ctx.require_output_q()
    if x.q is None or x.dtype != np.int8:
        raise ctx.unsupported("the integer product needs an int8 input")
    shape = x.logical_shape
    if axes != list(range(axes[0], axes[-1] + 1)):
        raise ctx.unsupported("an integer product over non-adjacent axes is not supported")
    outer, k = int(np.prod(shape[:axes[0]])), int(np.prod([shape[a] for a in axes]))
    inner = int(np.prod(shape[axes[-1] + 1:]))
    if k > MAX_INT_PRODUCT_FACTORS:
        raise ctx.unsupported(f"an integer product of {k} factors (at most {MAX_INT_PRODUCT_FACTORS})")
    v = reshape(ctx, to_layout(ctx, x, identity(len(shape))), (outer, k, inner), (0, 1, 2))

    def factor(i: int) -> TTensor:  # one int8 slice, widened on its own (a computed int32 tensor is not sliced)
        return im.widen(ctx, slice_phys(ctx, v, [0, i, 0], [outer, 1, inner]))

    acc = factor(0)
    bound, shift = 255.0, 0
    for i in range(1, k):
        bound *= 255.0
        sh = max(0, math.ceil(math.log2(bound)) - 30)  # keep the running product within int32
        acc = im.mul(ctx, acc, factor(i), sh)
        bound /= 2.0**sh
        shift += sh
    y = rescale(ctx, acc, x.q.s**k * 2.0**shift / out_q.s, out_q.dtype, 0, out_q.zp, out_q)
    keep_shape = tuple(1 if a in axes else d for a, d in enumerate(shape))
    _finish(ctx, reshape(ctx, y, keep_shape, identity(len(shape))), axes, keepdims)
