"""Reduction building blocks shared by the op lowerings: REDUCE_* over physical axes, the exact int32 sum."""

from __future__ import annotations

import numpy as np
import tosa_serializer as ts

from npubuild.lowering.context import VELA_MAX_DIM, LoweringContext, TTensor
from npubuild.lowering.emit import Op, attr, rescale, reshape, to_layout
from npubuild.lowering.movement import concat_phys, slice_phys


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
        elif op == Op.REDUCE_PRODUCT:
            a = attr("ReduceProduct", first)
        else:
            a = attr("ReduceSum", first)
        ctx.op(op, [src.name], [out.name], a)
        x = reshape(ctx, out, kept, x.perm) if len(run) > 1 else TTensor(out.name, out.shape, out.dtype, x.perm, out.q)
    return x


def int_sum(ctx: LoweringContext, x: TTensor, phys: list[int], divisor: int, output_of: str | None) -> TTensor:
    """sum(x - zp) / divisor over physical axes, rounded once into the node's output quantisation.

    Widened to int32, summed exactly by REDUCE_SUM (adjacent axes merged), one
    RESCALE. For a global average this beats a DEPTHWISE_CONV2D of ones over the
    whole plane by 2x on Vela (U55 41k vs 87k cycles, U85 38k vs 86k for 32x32x64)
    and is exact; where the family's plane_rows limits say so, the plane is first
    summed row by row (row_sums), the same integers.
    """
    out_q = ctx.require_output_q()
    assert x.q is not None
    if sorted(phys) == [1, 2] and ctx.options.plane_pool_rows and pooled_rows_fit(x):
        total = emit_reduce(ctx, Op.REDUCE_SUM, rescale(ctx, pooled_row_sums(ctx, x), 1.0, np.int32, 0, 0, None), [1])
    elif sorted(phys) == [1, 2] and ctx.options.plane_rows_pays(x):
        total = emit_reduce(ctx, Op.REDUCE_SUM, row_sums(ctx, x), [1])
    else:
        wide = rescale(ctx, x, 1.0, np.int32, x.q.zp, 0, None)
        total = emit_reduce(ctx, Op.REDUCE_SUM, wide, phys)
    return rescale(ctx, total, x.q.s / out_q.s / divisor, out_q.dtype, 0, out_q.zp, out_q, output_of=output_of)


def row_sums(ctx: LoweringContext, x: TTensor) -> TTensor:
    """sum(x - zp) over W of an int8 [N, H, W, C] x as int32 [N, H, 1, C], for a REDUCE_SUM over H.

    A (1, W) depthwise convolution of ones, which leaves W times less data for the transpose Vela puts
    in front of a REDUCE_SUM over H (LoweringOptions.plane_rows). The sums pass through int16 (exact:
    |sum| <= 255 * max_width), so Vela writes, moves and sums 16-bit data: faster, and on U55 its
    transpose of a computed int32 tensor for the REDUCE_SUM gives sums npu-sim does not reproduce
    (mobilenet_v3_block: every sample; as int16 it is bit-exact on U55 and U85).
    """
    assert x.q is not None
    n, h, w, c = x.shape
    assert 255 * w <= np.iinfo(np.int16).max, "row sums must fit int16"
    out = ctx.new_tensor((n, h, 1, c), np.int32, x.perm)
    ones = ctx.const(np.ones((1, w, c, 1), np.int8), "ones")  # HWCM
    ins = [x.name, ones, ctx.const(np.zeros(c, np.int32), "bias"), ctx.zp(x.q.zp, np.int8), ctx.zp(0, np.int8)]
    ctx.op(Op.DEPTHWISE_CONV2D, ins, [out.name], attr("DepthwiseConv2d", [0, 0, 0, 0], [1, 1], [1, 1], False,
                                                     ts.DType.INT32))
    narrow = rescale(ctx, out, 1.0, np.int16, 0, 0, None)
    return rescale(ctx, narrow, 1.0, np.int32, 0, 0, None)


def pooled_rows_fit(x: TTensor) -> bool:
    """Whether an int8 NHWC x's rows can be summed exactly in int16 by pooled_row_sums: 255 W fits int16."""
    return (len(x.shape) == 4 and x.dtype == np.int8 and x.q is not None and x.q.is_per_tensor
            and 255 * x.shape[2] <= np.iinfo(np.int16).max)


def pooled_row_sums(ctx: LoweringContext, x: TTensor) -> TTensor:
    """sum(x - zp) over W of an int8 [N, H, W, C] x as int16 [N, H, 1, C], with no constant at all.

    Each value widened to int16 as (x - zp) W (|.| <= 255 W fits), then an AVG_POOL2D over the row divides a
    sum of multiples of W by W: exact, so the row sums are the integers a REDUCE_SUM gives. Vela runs a
    REDUCE_SUM whose input carries a zero point as a conv of ones (U55 / U65: 768 bytes of weights for a
    32x32 plane) or with a Sub of a constant (U85), and the row sums of `row_sums` as a depthwise of ones with
    10 bytes of bias and scale a channel; here it stores nothing (LoweringOptions.plane_pool_rows, a memory
    choice). The widening runs in bands of rows, each a quarter of x's bytes at most, so the int16 copy is
    never whole (one 2x copy of a 32x32x64 plane raised the U55-128 SRAM peak from 100 to 212 KiB)."""
    assert x.q is not None
    n, h, w, c = x.shape
    rows = max(1, h // 8)  # int16 band of rows * W * C * 2 bytes <= a quarter of x's
    parts = []
    for start in range(0, h, rows):
        size = min(rows, h - start)
        band = slice_phys(ctx, x, [0, start, 0, 0], [n, size, w, c])
        wide = rescale(ctx, band, float(w), np.int16, x.q.zp, 0, None)
        sums = ctx.new_tensor((n, size, 1, c), np.int16, x.perm)
        ctx.op(Op.AVG_POOL2D, [wide.name, ctx.zp(0, np.int16), ctx.zp(0, np.int16)], [sums.name],
               attr("AvgPool2d", [1, w], [1, 1], [0, 0, 0, 0], ts.DType.INT32))
        parts.append(sums)
    return concat_phys(ctx, parts, 1)


def axis_last(ctx: LoweringContext, x: TTensor, logical_axes: list[int]) -> TTensor:
    """x in a layout with the given logical axes physically last (a TRANSPOSE only if the order changes).

    The integer lowerings reduce int32 tensors; Vela runs REDUCE_SUM natively
    over the channel (last) axis only and otherwise moves the data itself,
    which npu-sim showed to give wrong sums for computed int32 tensors. An
    int8 layout change up front is cheap and exact; the result keeps the new
    layout (the next op converts only if it needs to).
    """
    layout = tuple(p for p in x.perm if p not in logical_axes) + tuple(logical_axes)
    return to_layout(ctx, x, layout)


def stats_as_channels(ctx: LoweringContext, *stats: TTensor) -> tuple[TTensor, ...]:
    """Per-row statistics ([..., 1], one value a row) viewed as one channel row [1, 1, 1, rows] (a RESHAPE, the
    same bytes) when the family's options ask for it (LoweringOptions.row_stats_channels), else as they are.

    Vela 5.2 runs an elementwise op on [16, 1] as sixteen 1x1 blocks (320 cycles each on U55-128, a layer
    norm's rsqrt chain has ~20 of them) and on [1, 16] as one (20 cycles): bench/perf_choices.md.
    """
    if not ctx.options.row_stats_channels or any(int(np.prod(t.shape)) > VELA_MAX_DIM for t in stats):
        return stats
    return tuple(reshape(ctx, t, (1, 1, 1, int(np.prod(t.shape))), (0, 1, 2, 3)) for t in stats)


def stats_back(ctx: LoweringContext, like: TTensor, *stats: TTensor) -> tuple[TTensor, ...]:
    """stats_as_channels undone: each per-row value back in the shape and layout of `like` (a [..., 1] tensor)."""
    return tuple(t if t.shape == like.shape else reshape(ctx, t, like.shape, like.perm) for t in stats)
