"""Pooling: MaxPool, AveragePool, GlobalAveragePool, GlobalMaxPool (NHWC, TOSA MAX_POOL2D / AVG_POOL2D)."""

from __future__ import annotations

import numpy as np
import tosa_serializer as ts

from npubuild.lowering.context import NHWC, LoweringContext, TTensor
from npubuild.lowering.emit import Op, attr, requantize, rescale, to_layout
from npubuild.lowering.family_choices import takes
from npubuild.lowering.ops_conv import conv_pads, exact_pads, slice_hw
from npubuild.lowering.registry import lowers, quantize_also

quantize_also("GlobalMaxPool")  # onnxruntime leaves it in float on its own


def _pool_geometry(ctx: LoweringContext, x: TTensor, kernel) -> tuple[list[int], tuple, TTensor]:
    stride = tuple(ctx.attr("strides", [1, 1]))
    dilation = tuple(ctx.attr("dilations", [1, 1]))
    if dilation != (1, 1):
        raise ctx.unsupported("dilated pooling is not supported")
    pads = conv_pads(ctx, (x.shape[1], x.shape[2]), kernel, stride, (1, 1))
    if int(ctx.attr("ceil_mode", 0)):
        for i in range(2):
            span = x.shape[1 + i] + pads[2 * i] + pads[2 * i + 1] - kernel[i]
            pads[2 * i + 1] += (-span) % stride[i]
    pads, keep = exact_pads((x.shape[1], x.shape[2]), kernel, stride, (1, 1), pads)
    return pads, stride, slice_hw(ctx, x, keep)


def _out_hw(x: TTensor, kernel, stride, pads) -> tuple[int, int]:
    oh = (x.shape[1] + pads[0] + pads[1] - kernel[0]) // stride[0] + 1
    ow = (x.shape[2] + pads[2] + pads[3] - kernel[1]) // stride[1] + 1
    return oh, ow


@lowers("MaxPool")
def lower_maxpool(ctx: LoweringContext) -> None:
    if len(ctx.current.output) > 1 and ctx.current.output[1]:
        raise ctx.unsupported("MaxPool indices output is not supported")
    x = to_layout(ctx, ctx.tensor(0), NHWC)
    kernel = tuple(ctx.attr("kernel_shape"))
    pads, stride, x = _pool_geometry(ctx, x, kernel)
    oh, ow = _out_hw(x, kernel, stride, pads)
    out_q = ctx.output_q() if ctx.profile == "int" else None
    direct = out_q is None or (x.q is not None and x.q.same_as(out_q))
    out = ctx.new_tensor((x.shape[0], oh, ow, x.shape[3]), x.dtype, NHWC, x.q,
                         output_of=ctx.current.output[0] if direct else None)
    ctx.op(Op.MAX_POOL2D, [x.name], [out.name], attr("MaxPool2d", list(kernel), list(stride), pads, ts.NanPropagationMode.PROPAGATE))
    if not direct:
        out = requantize(ctx, out, out_q, output_of=ctx.current.output[0])
    ctx.set_output(0, out)


def avg_pool(ctx: LoweringContext, x: TTensor, kernel, stride, pads, count_include_pad: bool = False) -> None:
    """Average pooling; in int8 picks the form with a single rounding.

    TOSA AVG_POOL2D divides by the count of non-padded elements (ONNX
    count_include_pad=0) and keeps the input's scale; when the output scale
    differs, a second RESCALE would round twice and the error (up to 1 LSB)
    is then amplified by the layers after it. A depthwise convolution with
    all-ones weights sums exactly in int32 and rescales once instead, and pads
    with the zero point, which is count_include_pad=1.
    """
    oh, ow = _out_hw(x, kernel, stride, pads)
    shape = (x.shape[0], oh, ow, x.shape[3])
    out_name = ctx.current.output[0]
    if ctx.profile == "fp":
        if count_include_pad and any(pads):
            raise ctx.unsupported("count_include_pad=1 with padding is not supported in the FP profile yet")
        out = ctx.new_tensor(shape, np.float32, NHWC, output_of=out_name)
        ins = [x.name, ctx.zp(0, np.float32), ctx.zp(0, np.float32)]
        ctx.op(Op.AVG_POOL2D, ins, [out.name], attr("AvgPool2d", list(kernel), list(stride), pads, ts.DType.FP32))
        ctx.set_output(0, out)
        return
    out_q = ctx.require_output_q()
    assert x.q is not None
    same_scale = np.isclose(x.q.s, out_q.s, rtol=1e-6)
    if same_scale and not (count_include_pad and any(pads)):
        out = ctx.new_tensor(shape, x.dtype, NHWC, out_q, output_of=out_name)
        ins = [x.name, ctx.zp(x.q.zp, np.int8), ctx.zp(out_q.zp, np.int8)]
        ctx.op(Op.AVG_POOL2D, ins, [out.name], attr("AvgPool2d", list(kernel), list(stride), pads, ts.DType.INT32))
        ctx.set_output(0, out)
        return
    if any(pads) and not count_include_pad:
        out = ctx.new_tensor(shape, x.dtype, NHWC, x.q)
        ins = [x.name, ctx.zp(x.q.zp, np.int8), ctx.zp(x.q.zp, np.int8)]
        ctx.op(Op.AVG_POOL2D, ins, [out.name], attr("AvgPool2d", list(kernel), list(stride), pads, ts.DType.INT32))
        ctx.set_output(0, requantize(ctx, out, out_q, output_of=out_name))
        return
    c = x.shape[3]
    ones = np.ones((kernel[0], kernel[1], c, 1), np.int8)  # HWCM
    acc = ctx.new_tensor(shape, np.int32, NHWC)
    ins = [x.name, ctx.const(ones, "ones"), ctx.const(np.zeros(c, np.int32), "bias"), ctx.zp(x.q.zp, np.int8),
           ctx.zp(0, np.int8)]
    ctx.op(Op.DEPTHWISE_CONV2D, ins, [acc.name],
           attr("DepthwiseConv2d", pads, list(stride), [1, 1], False, ts.DType.INT32))
    scale = x.q.s / (kernel[0] * kernel[1] * out_q.s)
    ctx.set_output(0, rescale(ctx, acc, scale, out_q.dtype, 0, out_q.zp, out_q, output_of=out_name))


@lowers("AveragePool")
def lower_avgpool(ctx: LoweringContext) -> None:
    x = to_layout(ctx, ctx.tensor(0), NHWC)
    kernel = tuple(ctx.attr("kernel_shape"))
    pads, stride, x = _pool_geometry(ctx, x, kernel)
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
        from npubuild.lowering.ops_reduce import int_sum

        ctx.set_output(0, int_sum(ctx, x, [1, 2], kernel[0] * kernel[1], ctx.current.output[0]))
        return
    if ctx.profile == "int" and takes(ctx.family, "plane_sum") and _sum_beats_pool(ctx.family, x):
        ctx.set_output(0, _raw_mean(ctx, x, kernel[0] * kernel[1]))
        return
    avg_pool(ctx, x, kernel, (1, 1), [0, 0, 0, 0])


# per family, where REDUCE_SUM beats AVG_POOL2D: the smallest window and the channel range (a family with
# no entry, which takes the sum only when a test forces it, has U65's)
SUM_MIN_COUNT = {"u55": 16, "u65": 64}  # from 4x4 / 8x8
SUM_CHANNELS = {"u55": (16, 96), "u65": (32, 1 << 30)}


def _sum_beats_pool(family: str, x: TTensor) -> bool:
    """Whether a whole-plane mean at the same scale is cheaper as REDUCE_SUM than as AVG_POOL2D on U55/U65.

    Vela's U55 pooling steps kernel element by kernel element over every channel micro-block,
    its REDUCE_SUM is a transpose and a sum (the RESCALE fused): ResNet-8's 8x8x64 head 3152
    -> 2662 cycles on U55-128. Measured over 2x2..16x16 windows and 8..256 channels, the sum
    wins on U55-128 from a 4x4 window for 16..96 channels (up to 5%), loses on smaller windows
    and 8 channels (2x2: +11-65%) and from 128 channels (+1-15%; misses: 96 at 16x16 +1.3%, 128
    at 5x5 -5%; U55-64/256 win from 128 too, U55-32 loses everywhere); on U65-256 it wins from an
    8x8 window and 32 channels. Only counts where it is bit-identical to the pool (see _raw_mean).
    U85 keeps the pool: there the sum's transpose alone costs more (3392 vs 1480 cycles).
    """
    count = x.shape[1] * x.shape[2]
    exact = count % 2 == 1 or count & (count - 1) == 0
    (lo, hi), least = SUM_CHANNELS.get(family, SUM_CHANNELS["u65"]), SUM_MIN_COUNT.get(family, SUM_MIN_COUNT["u65"])
    return x.dtype == np.int8 and exact and count >= least and lo <= x.shape[3] <= hi


def _raw_mean(ctx: LoweringContext, x: TTensor, count: int) -> TTensor:
    """round(mean(x)) over H and W for an int8 x whose output keeps x's scale and zero point.

    round(sum(x - zp) / n) + zp = round(sum(x) / n) for an integer zp, so the stored int8
    values are summed as they are: no zero-point term for Vela to subtract (a Sub and its
    constant fewer). Bit-identical to the pool when 1/n is exact (n a power of two) or no
    sum lands on a rounding tie (n odd); other counts keep the pool.
    """
    from npubuild.lowering.ops_reduce import emit_reduce

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
        from npubuild.lowering.ops_reduce import emit_reduce

        out = emit_reduce(ctx, Op.REDUCE_MAX, x, [1, 2])
    if not direct:
        out = requantize(ctx, out, out_q, output_of=ctx.current.output[0])
    ctx.set_output(0, out)
