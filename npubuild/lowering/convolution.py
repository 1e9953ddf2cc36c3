"""Convolution building blocks shared by the op lowerings: padding, bias, the integer conv + RESCALE emitter.

An int8 activation accumulates in int32, an int16 one (EXT-INT16, 16x8) in int48 with an int48 bias and a
RESCALE of 16-bit multipliers after it; weights are int8, or int4 (EXT-INT4, 8x4) under an int8 activation.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import tosa_serializer as ts

from npubuild.lowering.context import NHWC, LoweringContext, TTensor
from npubuild.lowering.emit import Op, attr, rescale
from npubuild.lowering.quant import INT4, INT48, INT48_MAX, INT48_MIN, QParams, accumulator
from npubuild.lowering.spatial import Window


def conv_pads(in_hw: tuple[int, int], win: Window) -> list[int]:
    """ONNX pads/auto_pad -> TOSA [top, bottom, left, right]."""
    if win.auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        pads = []
        for i in range(2):
            out = -(-in_hw[i] // win.stride[i])
            total = max(0, (out - 1) * win.stride[i] + (win.kernel[i] - 1) * win.dilation[i] + 1 - in_hw[i])
            small, big = total // 2, total - total // 2
            pads.append((small, big) if win.auto_pad == "SAME_UPPER" else (big, small))
        return [pads[0][0], pads[0][1], pads[1][0], pads[1][1]]
    if win.auto_pad == "VALID":
        return [0, 0, 0, 0]
    p = win.onnx_pads
    return [p[0], p[2], p[1], p[3]]


def exact_pads(in_hw, kernel, stride, dilation, pads: list[int]) -> tuple[list[int], tuple[int, int]]:
    """TOSA requires (in - 1 + pads - (k - 1) * d) to divide by the stride; ONNX floors.

    Trim the rows/columns the floor never reads: first from the end padding, then
    from the input itself (returned as the number of input rows/cols to keep).
    """
    pads = list(pads)
    keep = list(in_hw)
    for i in range(2):
        span = in_hw[i] - 1 + pads[2 * i] + pads[2 * i + 1] - (kernel[i] - 1) * dilation[i]
        extra = span % stride[i]
        cut = min(extra, pads[2 * i + 1])
        pads[2 * i + 1] -= cut
        keep[i] -= extra - cut
    return pads, (keep[0], keep[1])


def slice_hw(ctx: LoweringContext, x: TTensor, keep: tuple[int, int]) -> TTensor:
    if (x.shape[1], x.shape[2]) == keep:
        return x
    shape = (x.shape[0], keep[0], keep[1], x.shape[3])
    out = ctx.new_tensor(shape, x.dtype, x.perm, x.q)
    ctx.op(Op.SLICE, [x.name, ctx.shape_const([0, 0, 0, 0]), ctx.shape_const(list(shape))], [out.name], attr("Slice"))
    return out


@dataclass
class Bias:
    """A layer's bias: real values, plus the int32 values and scale onnxruntime quantized it to, if any.

    Keeping onnxruntime's int32 bias when its scale is the accumulator's makes
    the integer result bit-exact with the QDQ reference.
    """

    real: np.ndarray  # float64 [o]
    exact: np.ndarray | None = None  # int32 [o]
    exact_scale: np.ndarray | None = None  # float64 [o]

    def select(self, sel: slice) -> Bias:
        return Bias(self.real[sel], None if self.exact is None else self.exact[sel],
                    None if self.exact_scale is None else self.exact_scale[sel])

    def scaled(self, gain: float) -> Bias:
        return self if gain == 1.0 else Bias(self.real * gain)

    def int32(self, acc_scale: np.ndarray) -> np.ndarray:
        # relative only: at accumulator scales of ~1e-7 numpy's default atol (1e-8) took a bias quantised
        # before the input's scale moved (qdq_concat shares a Concat's scale after onnxruntime quantised the
        # bias: 0.7% off in unet_torch) for exact, 2 LSB on 36% of node_Conv_158's elements (issue 21)
        if self.exact is not None and np.allclose(self.exact_scale, acc_scale, rtol=1e-6, atol=0.0):
            return self.exact
        return np.clip(np.round(self.real / acc_scale), -(2**31), 2**31 - 1).astype(np.int32)

    def for_accumulator(self, acc_scale: np.ndarray, acc: np.dtype) -> np.ndarray:
        """The bias in the accumulator's type: int32, or int48 for a 16-bit activation (whose scale is 2**8 finer
        than an int8 one's, so an int32 bias would overflow where the QDQ model's float bias does not)."""
        if np.dtype(acc) != INT48:
            return self.int32(acc_scale)
        if self.exact is not None and np.allclose(self.exact_scale, acc_scale, rtol=1e-6, atol=0.0):
            return self.exact.astype(INT48)
        return np.clip(np.round(self.real / acc_scale), INT48_MIN, INT48_MAX).astype(INT48)


def channel_scales(w_q: QParams, o: int, sel: slice = slice(None)) -> np.ndarray:
    """Per-output-channel weight scales (a per-tensor scale repeated), entries `sel`."""
    return np.broadcast_to(np.asarray(w_q.scale, np.float64).reshape(-1), (o,))[sel].copy()


def rescale_acc(ctx: LoweringContext, acc: TTensor, acc_scale: np.ndarray, output_name: str | None,
                out_q: QParams | None = None) -> TTensor:
    """int32 accumulator -> the node's int8 output (or `out_q`), per channel unless all scales agree."""
    out_q = out_q or ctx.require_output_q()
    scale = np.atleast_1d(acc_scale / out_q.s)
    if np.all(scale == scale[0]):
        scale = scale[:1]
    return rescale(ctx, acc, scale, out_q.dtype, 0, out_q.zp, out_q, output_of=output_name)


def acc_type(x: TTensor) -> ts.DType:
    """The accumulator type attribute of a conv-like op reading x: INT32 for int8, INT48 for int16 (EXT-INT16)."""
    return ts.DType.INT48 if accumulator(x.dtype) == INT48 else ts.DType.INT32


def weight_type(x: TTensor, weights: np.ndarray) -> np.dtype:
    """The weights' storage: int4 (EXT-INT4) only under an int8 activation (TOSA and Vela have no 16x4 form, so
    4-bit weights under a 16-bit activation are stored as the same integers in int8) and within [-7, 7] (the
    serializer refuses -8, which onnxruntime's symmetric QInt4 gives a channel's most negative weight: such
    weights are stored in int8 too), else int8."""
    if weights.dtype != INT4 or x.dtype != np.int8 or weights.size == 0:
        return np.dtype(np.int8)
    return INT4 if int(weights.astype(np.int8).min()) >= -7 else np.dtype(np.int8)


def int_conv(ctx: LoweringContext, op, x: TTensor, weights: np.ndarray, bias: Bias | np.ndarray,
             shape: tuple[int, ...], attribute, acc_scale: np.ndarray | None = None) -> TTensor:
    """An integer convolution-like op (TOSA 1.0 operand order) into a fresh NHWC accumulator: int32 for an int8
    x, int48 for an int16 one (its bias int48 too). `bias` is a Bias (with `acc_scale`) or its integers."""
    assert x.q is not None
    acc = accumulator(x.dtype)
    values = bias.for_accumulator(acc_scale, acc) if isinstance(bias, Bias) else np.asarray(bias)
    wt = weight_type(x, weights)
    ins = [x.name, ctx.const(weights.astype(np.int64).astype(wt), "weights"),
           ctx.const(values.astype(acc), "bias", int48=acc == INT48), ctx.zp(x.q.zp, x.dtype), ctx.zp(0, wt)]
    out = ctx.new_tensor(shape, acc, NHWC)
    ctx.op(op, ins, [out.name], attribute)
    return out


def emit_conv(
    ctx: LoweringContext,
    x: TTensor,
    w_oihw: np.ndarray,
    w_scale: np.ndarray | None,
    bias: Bias,
    pads: list[int],
    stride,
    dilation,
    depthwise: bool,
    output_name: str | None,
    out_q: QParams | None = None,
) -> TTensor:
    """CONV2D or DEPTHWISE_CONV2D (+ RESCALE in the integer profile) on an NHWC input.

    `w_scale` are the per-output-channel weight scales (int profile only).
    """
    o = w_oihw.shape[0]
    kh, kw = w_oihw.shape[2], w_oihw.shape[3]
    n, ih, iw, c = x.shape
    oh = (ih - 1 + pads[0] + pads[1] - (kh - 1) * dilation[0]) // stride[0] + 1
    ow = (iw - 1 + pads[2] + pads[3] - (kw - 1) * dilation[1]) // stride[1] + 1
    if depthwise:
        m = o // c
        weights = w_oihw.reshape(c, m, kh, kw).transpose(2, 3, 0, 1)  # HWCM
        op, kind = Op.DEPTHWISE_CONV2D, "DepthwiseConv2d"
    else:
        weights = w_oihw.transpose(0, 2, 3, 1)  # OHWI
        op, kind = Op.CONV2D, "Conv2d"
    if ctx.profile == "int":
        assert x.q is not None and w_scale is not None
        acc_scale = x.q.s * w_scale
        acc = int_conv(ctx, op, x, weights, bias, (n, oh, ow, o),
                       attr(kind, pads, list(stride), list(dilation), False, acc_type(x)), acc_scale)
        return rescale_acc(ctx, acc, acc_scale, output_name, out_q)
    out = ctx.new_tensor((n, oh, ow, o), np.float32, NHWC, output_of=output_name)
    inputs = [x.name, ctx.const(weights.astype(np.float32), "weights"), ctx.const(bias.real.astype(np.float32), "bias"),
              ctx.zp(0, np.float32), ctx.zp(0, np.float32)]
    ctx.op(op, inputs, [out.name], attr(kind, pads, list(stride), list(dilation), False, ts.DType.FP32))
    return out
