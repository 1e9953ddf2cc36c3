"""Pooling building blocks shared by the op lowerings: window geometry, AVG_POOL2D with exact padding, and
dilated windows (which TOSA pools do not have) as a stack of their taps."""

from __future__ import annotations

import numpy as np
import tosa_serializer as ts

from npubuild.lowering import intmath as im
from npubuild.lowering.context import NHWC, LoweringContext, TTensor
from npubuild.lowering.convolution import acc_type, conv_pads, exact_pads, int_conv, slice_hw
from npubuild.lowering.emit import Op, attr, rescale, reshape
from npubuild.lowering.movement import concat_phys, decimate, pad_phys
from npubuild.lowering.quant import INT48, accumulator
from npubuild.lowering.spatial import Window


def pool_geometry(ctx: LoweringContext, x: TTensor, win: Window) -> tuple[list[int], tuple[int, int], TTensor, bool]:
    """(TOSA pads, stride, the input sliced to the rows the windows read, whether ceil_mode added padding).

    ceil_mode follows ONNX (and torch): the output size rounds up, but a last window that would start
    in the end padding is dropped; the end padding is then whatever makes that many windows exact,
    which is always less than the kernel (TOSA's limit). Padding ceil_mode adds is never counted by an
    average, whatever count_include_pad says.
    """
    hw = (x.shape[1], x.shape[2])
    pads = conv_pads(hw, win)
    extra = False
    if int(ctx.attr("ceil_mode", 0)):
        for i in range(2):
            span = (win.kernel[i] - 1) * win.dilation[i] + 1
            size = hw[i] + pads[2 * i] + pads[2 * i + 1]
            out = -(-(size - span) // win.stride[i]) + 1
            if (out - 1) * win.stride[i] >= hw[i] + pads[2 * i]:
                out -= 1
            need = (out - 1) * win.stride[i] + span - hw[i] - pads[2 * i]
            if need > pads[2 * i + 1]:
                pads[2 * i + 1] = need
                extra = True
    pads, keep = exact_pads(hw, win.kernel, win.stride, win.dilation, pads)
    return pads, win.stride, slice_hw(ctx, x, keep), extra


def pool_out_hw(x: TTensor, kernel, stride, pads, dilation=(1, 1)) -> tuple[int, int]:
    oh = (x.shape[1] + pads[0] + pads[1] - (kernel[0] - 1) * dilation[0] - 1) // stride[0] + 1
    ow = (x.shape[2] + pads[2] + pads[3] - (kernel[1] - 1) * dilation[1] - 1) // stride[1] + 1
    return oh, ow


def dilated_taps(ctx: LoweringContext, x: TTensor, win: Window, pads: list[int], pad_value: float
                 ) -> tuple[TTensor, tuple[int, int, int, int]]:
    """The K = kh * kw taps of a dilated window, stacked as [1, K, N*oh*ow, C] (one (K, 1) pool reduces them).

    Each tap is the input (padded with `pad_value`) read at a fixed kernel offset with the window's
    stride: one strided slice per tap. Returns the stack and the NHWC output shape.
    """
    n, _, _, c = x.shape
    oh, ow = pool_out_hw(x, win.kernel, win.stride, pads, win.dilation)
    if any(pads):
        x = pad_phys(ctx, x, [0, pads[0], pads[2], 0], [0, pads[1], pads[3], 0], pad_value)
    taps = []
    for jh in range(win.kernel[0]):
        rows = decimate(ctx, x, 2, jh * win.dilation[0], win.stride[0], oh)  # logical axis 2 is H (NHWC perm)
        for jw in range(win.kernel[1]):
            tap = decimate(ctx, rows, 3, jw * win.dilation[1], win.stride[1], ow)
            taps.append(reshape(ctx, tap, (1, 1, n * oh * ow, c), NHWC))
    return concat_phys(ctx, taps, 1), (n, oh, ow, c)


def avg_pool(ctx: LoweringContext, x: TTensor, kernel, stride, pads, count_include_pad: bool = False,
             output_of: str | None = None) -> TTensor:
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
    if ctx.profile == "fp":
        if count_include_pad and any(pads):  # the padding counts: pad with zeros, then a pool with none
            x = pad_phys(ctx, x, [0, pads[0], pads[2], 0], [0, pads[1], pads[3], 0], 0.0)
            pads = [0, 0, 0, 0]
        out = ctx.new_tensor(shape, np.float32, NHWC, output_of=output_of)
        ins = [x.name, ctx.zp(0, np.float32), ctx.zp(0, np.float32)]
        ctx.op(Op.AVG_POOL2D, ins, [out.name], attr("AvgPool2d", list(kernel), list(stride), pads, ts.DType.FP32))
        return out
    out_q = ctx.require_output_q()
    assert x.q is not None
    same_scale = np.isclose(x.q.s, out_q.s, rtol=1e-6, atol=0.0)  # scales are ~1e-3: no absolute slack
    if same_scale and not (count_include_pad and any(pads)):
        out = ctx.new_tensor(shape, x.dtype, NHWC, out_q, output_of=output_of)
        ins = [x.name, ctx.zp(x.q.zp, x.dtype), ctx.zp(out_q.zp, out_q.dtype)]
        ctx.op(Op.AVG_POOL2D, ins, [out.name], attr("AvgPool2d", list(kernel), list(stride), pads, ts.DType.INT32))
        return out
    c = x.shape[3]
    ones = np.ones((kernel[0], kernel[1], c, 1), np.int8)  # HWCM
    acc = int_conv(ctx, Op.DEPTHWISE_CONV2D, x, ones, np.zeros(c, accumulator(x.dtype)), shape,
                   attr("DepthwiseConv2d", pads, list(stride), [1, 1], False, acc_type(x)))
    if any(pads) and not count_include_pad:
        return _unpadded_mean(ctx, acc, (x.shape[1], x.shape[2]), kernel, stride, pads, x.q.s, out_q, output_of)
    scale = x.q.s / (kernel[0] * kernel[1] * out_q.s)
    return rescale(ctx, acc, scale, out_q.dtype, 0, out_q.zp, out_q, output_of=output_of)


RECIPROCAL_BITS = 30  # 1/count as a Q30 int32: relative error below 2^-25
MEAN_FRACTION_BITS = 20  # the mean keeps 20 fraction bits before the one RESCALE (|mean| <= 255: fits int32)
MEAN_FRACTION_BITS_16 = 15  # an int16 mean (|mean| <= 2**15) keeps 15


def window_counts(in_hw: tuple[int, int], kernel, stride, pads, out_hw: tuple[int, int]) -> np.ndarray:
    """(oh, ow) number of unpadded input elements each window covers (ONNX count_include_pad=0)."""
    def axis(n: int, k: int, s: int, before: int, out: int) -> np.ndarray:
        start = np.arange(out) * s - before
        return np.minimum(start + k, n) - np.maximum(start, 0)
    return np.outer(axis(in_hw[0], kernel[0], stride[0], pads[0], out_hw[0]),
                    axis(in_hw[1], kernel[1], stride[1], pads[2], out_hw[1]))


def _unpadded_mean(ctx: LoweringContext, acc: TTensor, in_hw: tuple[int, int], kernel, stride, pads, in_scale: float,
                   out_q, output_of: str | None) -> TTensor:
    """sum / count at a new scale, rounding once: the exact int32 window sums times each position's Q30
    1/count (an int32 MUL keeping 20 fraction bits), then one RESCALE to the output. AVG_POOL2D rounds to
    the input's grid first and a requantise rounds again: 2 LSB on 63% of elements for an output scale a
    third of the input's (issue 21; tests/lowering/test_residual_numerics.py)."""
    _, oh, ow, _ = acc.shape
    fraction = MEAN_FRACTION_BITS
    if acc.dtype == INT48:  # a 16-bit input's window sums: exact in int32 (a RESCALE by 1), a mean of 16 bits
        acc, fraction = rescale(ctx, acc, 1.0, np.int32, 0, 0, None), MEAN_FRACTION_BITS_16
    counts = window_counts(in_hw, kernel, stride, pads, (oh, ow))
    recip = np.round(2.0**RECIPROCAL_BITS / counts).astype(np.int64).reshape(1, oh, ow, 1)
    mean = im.mul(ctx, acc, im.const_i32(ctx, recip, acc), RECIPROCAL_BITS - fraction)
    scale = in_scale / (out_q.s * 2.0**fraction)
    return rescale(ctx, mean, scale, out_q.dtype, 0, out_q.zp, out_q, output_of=output_of)
