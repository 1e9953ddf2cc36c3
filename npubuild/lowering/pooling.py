"""Pooling building blocks shared by the op lowerings: AVG_POOL2D with exact padding."""

from __future__ import annotations

import numpy as np
import tosa_serializer as ts

from npubuild.lowering.context import NHWC, LoweringContext, TTensor
from npubuild.lowering.convolution import conv_pads, exact_pads, slice_hw
from npubuild.lowering.emit import Op, attr, requantize, rescale


def pool_geometry(ctx: LoweringContext, x: TTensor, kernel) -> tuple[list[int], tuple, TTensor]:
    stride = tuple(ctx.attr("strides", [1, 1]))
    dilation = tuple(ctx.attr("dilations", [1, 1]))
    if dilation != (1, 1):
        raise ctx.unsupported("dilated pooling is not supported")
    pads = conv_pads(ctx, (x.shape[1], x.shape[2]), kernel, stride, (1, 1))
    if int(ctx.attr("ceil_mode", 0)):  # ONNX: ceil, but the last window must start inside the input or left pad
        for i in range(2):
            n, lo, k, s = x.shape[1 + i], pads[2 * i], kernel[i], stride[i]
            out = -(-(n + lo + pads[2 * i + 1] - k) // s) + 1
            if (out - 1) * s >= n + lo:
                out -= 1
            pads[2 * i + 1] = (out - 1) * s + k - n - lo  # < k: TOSA's limit on a pad
    pads, keep = exact_pads((x.shape[1], x.shape[2]), kernel, stride, (1, 1), pads)
    return pads, stride, slice_hw(ctx, x, keep)


def pool_out_hw(x: TTensor, kernel, stride, pads) -> tuple[int, int]:
    oh = (x.shape[1] + pads[0] + pads[1] - kernel[0]) // stride[0] + 1
    ow = (x.shape[2] + pads[2] + pads[3] - kernel[1]) // stride[1] + 1
    return oh, ow


def avg_pool(ctx: LoweringContext, x: TTensor, kernel, stride, pads, count_include_pad: bool = False) -> None:
    """Average pooling; in int8 picks the form with a single rounding.

    TOSA AVG_POOL2D divides by the count of non-padded elements (ONNX
    count_include_pad=0) and keeps the input's scale; when the output scale
    differs, a second RESCALE would round twice and the error (up to 1 LSB)
    is then amplified by the layers after it. A depthwise convolution with
    all-ones weights sums exactly in int32 and rescales once instead, and pads
    with the zero point, which is count_include_pad=1.
    """
    oh, ow = pool_out_hw(x, kernel, stride, pads)
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
