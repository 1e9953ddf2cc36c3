"""Pooling: MaxPool, AveragePool, GlobalAveragePool, GlobalMaxPool (NHWC, TOSA MAX_POOL2D / AVG_POOL2D).

1-D pools (rank-3 inputs) run as 2-D pools with H = 1 (lowering/spatial.py). Dilated windows, which TOSA
pools lack, become a stack of their kernel taps reduced by one (K, 1) pool (pooling.dilated_taps). 3-D
pools are refused with a reason (the host runs them).

Numerics (issue 21, verify/node_errors): max pools are exact; an average rounds once (pooling.avg_pool),
half up where onnxruntime's QuantizeLinear rounds the float mean half to even, so a mean that lands on an
exact tie (sum / 64 = k + 1/2) is 1 LSB higher: resnet8's 8x8 AveragePool 1 LSB on 0.59% of elements,
every one +1 (resnet8_torch 0.20%). The reference rounds differently; the lowering rounds once.
"""

from __future__ import annotations

import numpy as np
import tosa_serializer as ts

from npubuild.lowering.context import NHWC, LoweringContext, TTensor
from npubuild.lowering.emit import Op, attr, requantize, rescale, reshape
from npubuild.lowering.pooling import avg_pool, dilated_taps, pool_geometry, pool_out_hw
from npubuild.lowering.reduction import emit_reduce, int_sum
from npubuild.lowering.registry import lowers, quantize_also
from npubuild.lowering.spatial import Window, direct_output, from_nhwc, window, window_input

quantize_also("GlobalMaxPool")  # onnxruntime leaves it in float on its own


def _pool_input(ctx: LoweringContext) -> tuple[TTensor, int, Window]:
    x, spatial = window_input(ctx, 0, "pools")
    kernel = ctx.attr("kernel_shape")
    if kernel is None or len(kernel) != spatial:
        raise ctx.unsupported("kernel_shape must give one size per spatial axis")
    return x, spatial, window(ctx, spatial, kernel)


def _max_pool2d(ctx: LoweringContext, x: TTensor, kernel, stride, pads, output_of: str | None) -> TTensor:
    oh, ow = pool_out_hw(x, kernel, stride, pads)
    out = ctx.new_tensor((x.shape[0], oh, ow, x.shape[3]), x.dtype, NHWC, x.q, output_of=output_of)
    ctx.op(Op.MAX_POOL2D, [x.name], [out.name],
           attr("MaxPool2d", list(kernel), list(stride), list(pads), ts.NanPropagationMode.PROPAGATE))
    return out


@lowers("MaxPool")
def lower_maxpool(ctx: LoweringContext) -> None:
    if len(ctx.current.output) > 1 and ctx.current.output[1]:
        raise ctx.unsupported("MaxPool indices output is not supported")
    if int(ctx.attr("storage_order", 0)):
        raise ctx.unsupported("storage_order=1 only matters for the indices output, which is not supported")
    x, spatial, win = _pool_input(ctx)
    pads, stride, x, _ = pool_geometry(ctx, x, win)
    out_q = ctx.output_q() if ctx.profile == "int" else None
    direct = out_q is None or (x.q is not None and x.q.same_as(out_q))
    name = ctx.current.output[0]
    out_of = direct_output(spatial, name) if direct else None
    if win.dilation != (1, 1):
        taps, shape = dilated_taps(ctx, x, win, pads, -np.inf)
        out = reshape(ctx, _max_pool2d(ctx, taps, (taps.shape[1], 1), (1, 1), [0, 0, 0, 0], None), shape, NHWC,
                      output_of=out_of)
    else:
        out = _max_pool2d(ctx, x, win.kernel, stride, pads, out_of)
    if not direct:
        out = requantize(ctx, out, out_q, output_of=direct_output(spatial, name))
    ctx.set_output(0, from_nhwc(ctx, out, spatial, name))


@lowers("AveragePool")
def lower_avgpool(ctx: LoweringContext) -> None:
    x, spatial, win = _pool_input(ctx)
    pads, stride, x, ceil_padded = pool_geometry(ctx, x, win)
    include_pad = bool(int(ctx.attr("count_include_pad", 0)))
    name = ctx.current.output[0]
    out_of = direct_output(spatial, name)
    if include_pad and ceil_padded:
        raise ctx.unsupported("ceil_mode padding with count_include_pad=1 is not supported (the last windows "
                              "count fewer elements)")
    if win.dilation != (1, 1):
        if any(pads) and not include_pad:
            raise ctx.unsupported("a dilated AveragePool with count_include_pad=0 and padding is not supported")
        taps, shape = dilated_taps(ctx, x, win, pads, 0.0)
        y = avg_pool(ctx, taps, (taps.shape[1], 1), (1, 1), [0, 0, 0, 0], False, None)
        y = reshape(ctx, y, shape, NHWC, output_of=out_of)
    elif win.kernel == (x.shape[1], x.shape[2]) and not any(pads):  # one window over the whole plane
        y = _global_avg(ctx, x, out_of)
    else:
        y = avg_pool(ctx, x, win.kernel, stride, pads, include_pad, out_of)
    ctx.set_output(0, from_nhwc(ctx, y, spatial, name))


@lowers("GlobalAveragePool")
def lower_global_avgpool(ctx: LoweringContext) -> None:
    x, spatial = window_input(ctx, 0, "pools", any_view=True)
    name = ctx.current.output[0]
    ctx.set_output(0, from_nhwc(ctx, _global_avg(ctx, x, direct_output(spatial, name)),
                                spatial, name))


def _global_avg(ctx: LoweringContext, x: TTensor, output_of: str | None) -> TTensor:
    """AVG_POOL2D when the scale is kept (exact); else an exact int32 REDUCE_SUM (half the cycles of a conv)."""
    kernel = (x.shape[1], x.shape[2])
    if ctx.profile == "int" and x.q is not None and not x.q.same_as(ctx.require_output_q()):
        return int_sum(ctx, x, [1, 2], kernel[0] * kernel[1], output_of)
    if ctx.profile == "int" and ctx.options.plane_sum_pays(x):
        return _raw_mean(ctx, x, kernel[0] * kernel[1], output_of)
    return avg_pool(ctx, x, kernel, (1, 1), [0, 0, 0, 0], output_of=output_of)


def _raw_mean(ctx: LoweringContext, x: TTensor, count: int, output_of: str | None) -> TTensor:
    """round(mean(x)) over H and W for an int8 x whose output keeps x's scale and zero point.

    round(sum(x - zp) / n) + zp = round(sum(x) / n) for an integer zp, so the stored int8
    values are summed as they are: no zero-point term for Vela to subtract (a Sub and its
    constant fewer). Bit-identical to the pool only where LoweringOptions.plane_sum_pays
    takes it (n odd, or a power of two at the int8 minimum zero point): the pool's
    rounding of a tie differs from round half up below the zero point.
    """
    out_q = ctx.require_output_q()
    wide = rescale(ctx, x, 1.0, np.int32, 0, 0, None)
    total = emit_reduce(ctx, Op.REDUCE_SUM, wide, [1, 2])
    return rescale(ctx, total, 1.0 / count, out_q.dtype, 0, 0, out_q, output_of=output_of)


@lowers("GlobalMaxPool")
def lower_global_maxpool(ctx: LoweringContext) -> None:
    """One MAX_POOL2D over the whole plane where Vela's kernel limits allow, else REDUCE_MAX over H then W."""
    x, spatial = window_input(ctx, 0, "pools")
    h, w = x.shape[1], x.shape[2]
    out_q = ctx.output_q() if ctx.profile == "int" else None
    direct = out_q is None or (x.q is not None and x.q.same_as(out_q))
    name = ctx.current.output[0]
    out_name = direct_output(spatial, name) if direct else None
    if h <= 256 and h * w <= 65536:
        out = _max_pool2d(ctx, x, (h, w), (1, 1), [0, 0, 0, 0], out_name)
    else:
        out = emit_reduce(ctx, Op.REDUCE_MAX, x, [1, 2])
    if not direct:
        out = requantize(ctx, out, out_q, output_of=direct_output(spatial, name))
    ctx.set_output(0, from_nhwc(ctx, out, spatial, name))
