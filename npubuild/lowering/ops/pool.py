"""Pooling: MaxPool, AveragePool, GlobalAveragePool, GlobalMaxPool (NHWC, TOSA MAX_POOL2D / AVG_POOL2D)."""

from __future__ import annotations

import numpy as np
import tosa_serializer as ts

from npubuild.lowering.context import NHWC, LoweringContext, TTensor
from npubuild.lowering.emit import Op, attr, requantize, rescale, to_layout
from npubuild.lowering.pooling import avg_pool, pool_geometry, pool_out_hw
from npubuild.lowering.reduction import emit_reduce, int_sum
from npubuild.lowering.registry import lowers, quantize_also

quantize_also("GlobalMaxPool")  # onnxruntime leaves it in float on its own






@lowers("MaxPool")
def lower_maxpool(ctx: LoweringContext) -> None:
    if len(ctx.current.output) > 1 and ctx.current.output[1]:
        raise ctx.unsupported("MaxPool indices output is not supported")
    x = to_layout(ctx, ctx.tensor(0), NHWC)
    kernel = tuple(ctx.attr("kernel_shape"))
    pads, stride, x = pool_geometry(ctx, x, kernel)
    oh, ow = pool_out_hw(x, kernel, stride, pads)
    out_q = ctx.output_q() if ctx.profile == "int" else None
    direct = out_q is None or (x.q is not None and x.q.same_as(out_q))
    out = ctx.new_tensor((x.shape[0], oh, ow, x.shape[3]), x.dtype, NHWC, x.q,
                         output_of=ctx.current.output[0] if direct else None)
    ctx.op(Op.MAX_POOL2D, [x.name], [out.name], attr("MaxPool2d", list(kernel), list(stride), pads, ts.NanPropagationMode.PROPAGATE))
    if not direct:
        out = requantize(ctx, out, out_q, output_of=ctx.current.output[0])
    ctx.set_output(0, out)




@lowers("AveragePool")
def lower_avgpool(ctx: LoweringContext) -> None:
    x = to_layout(ctx, ctx.tensor(0), NHWC)
    kernel = tuple(ctx.attr("kernel_shape"))
    pads, stride, x = pool_geometry(ctx, x, kernel)
    if tuple(kernel) == (x.shape[1], x.shape[2]) and not any(pads):  # one window over the whole plane
        _global_avg(ctx, x)
        return
    avg_pool(ctx, x, kernel, stride, pads, bool(int(ctx.attr("count_include_pad", 0))))


@lowers("GlobalAveragePool")
def lower_global_avgpool(ctx: LoweringContext) -> None:
    _global_avg(ctx, to_layout(ctx, ctx.tensor(0), NHWC))


def _global_avg(ctx: LoweringContext, x: TTensor) -> None:
    """AVG_POOL2D when the scale is kept (exact); else an exact int32 REDUCE_SUM (half the cycles of a conv)."""
    kernel = (x.shape[1], x.shape[2])
    if ctx.profile == "int" and x.q is not None and not x.q.same_as(ctx.require_output_q()):
        ctx.set_output(0, int_sum(ctx, x, [1, 2], kernel[0] * kernel[1], ctx.current.output[0]))
        return
    if ctx.profile == "int" and ctx.options.plane_sum_pays(x):
        ctx.set_output(0, _raw_mean(ctx, x, kernel[0] * kernel[1]))
        return
    avg_pool(ctx, x, kernel, (1, 1), [0, 0, 0, 0])


def _raw_mean(ctx: LoweringContext, x: TTensor, count: int) -> TTensor:
    """round(mean(x)) over H and W for an int8 x whose output keeps x's scale and zero point.

    round(sum(x - zp) / n) + zp = round(sum(x) / n) for an integer zp, so the stored int8
    values are summed as they are: no zero-point term for Vela to subtract (a Sub and its
    constant fewer). Bit-identical to the pool when 1/n is exact (n a power of two) or no
    sum lands on a rounding tie (n odd); other counts keep the pool.
    """
    out_q = ctx.require_output_q()
    wide = rescale(ctx, x, 1.0, np.int32, 0, 0, None)
    total = emit_reduce(ctx, Op.REDUCE_SUM, wide, [1, 2])
    return rescale(ctx, total, 1.0 / count, out_q.dtype, 0, 0, out_q, output_of=ctx.current.output[0])


@lowers("GlobalMaxPool")
def lower_global_maxpool(ctx: LoweringContext) -> None:
    """One MAX_POOL2D over the whole plane where Vela's kernel limits allow, else REDUCE_MAX over H then W."""
    x = to_layout(ctx, ctx.tensor(0), NHWC)
    h, w = x.shape[1], x.shape[2]
    out_q = ctx.output_q() if ctx.profile == "int" else None
    direct = out_q is None or (x.q is not None and x.q.same_as(out_q))
    out_name = ctx.current.output[0] if direct else None
    if h <= 256 and h * w <= 65536:
        out = ctx.new_tensor((x.shape[0], 1, 1, x.shape[3]), x.dtype, NHWC, x.q, output_of=out_name)
        ctx.op(Op.MAX_POOL2D, [x.name], [out.name],
               attr("MaxPool2d", [h, w], [1, 1], [0, 0, 0, 0], ts.NanPropagationMode.PROPAGATE))
    else:
        out = emit_reduce(ctx, Op.REDUCE_MAX, x, [1, 2])
    if not direct:
        out = requantize(ctx, out, out_q, output_of=ctx.current.output[0])
    ctx.set_output(0, out)
