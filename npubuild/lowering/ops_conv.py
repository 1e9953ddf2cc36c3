"""Convolutions and fully connected layers: Conv, Gemm, MatMul with a constant weight.

Integer form: CONV2D / DEPTHWISE_CONV2D with an int32 accumulator, then one
per-channel RESCALE to the output's int8 parameters. Fully connected layers
are 1x1 CONV2Ds on an [N, 1, 1, K] view, which Vela compiles as its fastest
fully connected kernel and which needs no weight transpose at run time.
"""

from __future__ import annotations

import numpy as np
import tosa_serializer as ts

from npubuild.lowering.context import NHWC, LoweringContext, TTensor
from npubuild.lowering.emit import Op, attr, rescale, reshape, to_layout
from npubuild.lowering.quant import QParams
from npubuild.lowering.registry import lowers


def conv_pads(ctx: LoweringContext, in_hw: tuple[int, int], kernel: tuple[int, int], stride, dilation) -> list[int]:
    """ONNX pads/auto_pad -> TOSA [top, bottom, left, right]."""
    auto_pad = ctx.attr("auto_pad", b"NOTSET")
    auto_pad = auto_pad.decode() if isinstance(auto_pad, bytes) else auto_pad
    if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        pads = []
        for i in range(2):
            out = -(-in_hw[i] // stride[i])
            total = max(0, (out - 1) * stride[i] + (kernel[i] - 1) * dilation[i] + 1 - in_hw[i])
            small, big = total // 2, total - total // 2
            pads.append((small, big) if auto_pad == "SAME_UPPER" else (big, small))
        return [pads[0][0], pads[0][1], pads[1][0], pads[1][1]]
    if auto_pad == "VALID":
        return [0, 0, 0, 0]
    p = list(ctx.attr("pads", [0, 0, 0, 0]))
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


def _bias_int32(ctx: LoweringContext, index: int, acc_scale: np.ndarray, n: int) -> np.ndarray:
    """The bias as int32 in accumulator units (scale = input_scale * weight_scale)."""
    qb = ctx.qconst(index)
    if qb is not None and qb.data.dtype == np.int32 and np.allclose(qb.q.scale, acc_scale, rtol=1e-4):
        return qb.data.astype(np.int32).reshape(n)
    real = ctx.constant(index)
    if real is None:
        return np.zeros(n, np.int32)
    return np.clip(np.round(real.reshape(n) / acc_scale), -(2**31), 2**31 - 1).astype(np.int32)


def _weights(ctx: LoweringContext, index: int) -> tuple[np.ndarray, QParams | None]:
    qw = ctx.qconst(index)
    if ctx.profile == "int":
        if qw is None:
            raise ctx.unsupported("weights are not quantized (no DequantizeLinear of an int8 initializer)")
        if np.any(qw.q.zero_point != 0):
            raise ctx.unsupported("weights must be quantized symmetrically (zero point 0)")
        return qw.data, qw.q
    w = ctx.constant(index)
    if w is None:
        raise ctx.unsupported("weights must be a constant")
    return w.astype(np.float32), None


def emit_conv(
    ctx: LoweringContext,
    x: TTensor,
    w_oihw: np.ndarray,
    w_q: QParams | None,
    bias_index: int | None,
    pads: list[int],
    stride,
    dilation,
    depthwise: bool,
    output_name: str,
) -> TTensor:
    """CONV2D or DEPTHWISE_CONV2D (+ RESCALE in the integer profile) on an NHWC input."""
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
        assert x.q is not None and w_q is not None
        w_scale = np.broadcast_to(w_q.scale.reshape(-1), (o,)).astype(np.float64)
        acc_scale = x.q.s * w_scale
        bias = _bias_int32(ctx, bias_index, acc_scale, o) if bias_index is not None else np.zeros(o, np.int32)
        acc = ctx.new_tensor((n, oh, ow, o), np.int32, NHWC)
        inputs = [x.name, ctx.const(weights.astype(np.int8), "weights"), ctx.const(bias, "bias"),
                  ctx.zp(x.q.zp, np.int8), ctx.zp(0, np.int8)]
        ctx.op(op, inputs, [acc.name], attr(kind, pads, list(stride), list(dilation), False, ts.DType.INT32))
        out_q = ctx.require_output_q()
        scale = acc_scale / out_q.s
        if np.allclose(scale, scale[0], rtol=0, atol=0):
            scale = scale[:1]
        return rescale(ctx, acc, scale, out_q.dtype, 0, out_q.zp, out_q, output_of=output_name)
    bias = ctx.constant(bias_index) if bias_index is not None else None
    bias = np.zeros(o, np.float32) if bias is None else bias.astype(np.float32).reshape(o)
    out = ctx.new_tensor((n, oh, ow, o), np.float32, NHWC, output_of=output_name)
    inputs = [x.name, ctx.const(weights.astype(np.float32), "weights"), ctx.const(bias, "bias"),
              ctx.zp(0, np.float32), ctx.zp(0, np.float32)]
    ctx.op(op, inputs, [out.name], attr(kind, pads, list(stride), list(dilation), False, ts.DType.FP32))
    return out


@lowers("Conv")
def lower_conv(ctx: LoweringContext) -> None:
    x = ctx.tensor(0)
    if len(x.shape) != 4:
        raise ctx.unsupported(f"only 2-D convolutions are supported (input rank {len(x.shape)})")
    x = to_layout(ctx, x, NHWC)
    w, w_q = _weights(ctx, 1)
    group = int(ctx.attr("group", 1))
    c = x.shape[3]
    kernel = (w.shape[2], w.shape[3])
    stride = tuple(ctx.attr("strides", [1, 1]))
    dilation = tuple(ctx.attr("dilations", [1, 1]))
    pads = conv_pads(ctx, (x.shape[1], x.shape[2]), kernel, stride, dilation)
    pads, keep = exact_pads((x.shape[1], x.shape[2]), kernel, stride, dilation, pads)
    x = slice_hw(ctx, x, keep)
    bias_index = 2 if ctx.has_input(2) else None
    if group == 1:
        depthwise = False
    elif group == c and w.shape[1] == 1:
        depthwise = True
    else:
        raise ctx.unsupported(f"grouped convolution (group={group}) is not supported yet")
    out = emit_conv(ctx, x, w, w_q, bias_index, pads, stride, dilation, depthwise, ctx.current.output[0])
    ctx.set_output(0, out)


def _fully_connected(ctx: LoweringContext, x: TTensor, w_ok: np.ndarray, w_q: QParams | None, bias_index: int | None) -> None:
    """x [M, K] (identity layout) times w^T, w as [O, K]: a 1x1 CONV2D over an [1, M, 1, K] view."""
    lshape = x.logical_shape
    if len(lshape) != 2:
        raise ctx.unsupported(f"fully connected input must be 2-D, got shape {list(lshape)}")
    x = to_layout(ctx, x, (0, 1))
    m, k = x.shape
    view = reshape(ctx, x, (1, m, 1, k), NHWC)
    o = w_ok.shape[0]
    w4 = w_ok.reshape(o, k, 1, 1)
    out_name = ctx.current.output[0]
    y = emit_conv(ctx, view, w4, w_q, bias_index, [0, 0, 0, 0], (1, 1), (1, 1), False, output_name=None)
    ctx.set_output(0, reshape(ctx, y, (m, o), (0, 1), output_of=out_name))


@lowers("Gemm")
def lower_gemm(ctx: LoweringContext) -> None:
    if int(ctx.attr("transA", 0)):
        raise ctx.unsupported("transA=1 is not supported yet")
    alpha, beta = float(ctx.attr("alpha", 1.0)), float(ctx.attr("beta", 1.0))
    if alpha != 1.0 or beta != 1.0:
        raise ctx.unsupported("alpha/beta other than 1 are not supported yet")
    w, w_q = _weights(ctx, 1)
    if not int(ctx.attr("transB", 0)):
        w = w.T
        if w_q is not None and w_q.axis is not None:
            w_q = QParams(w_q.scale, w_q.zero_point, w_q.dtype, 0)
    _fully_connected(ctx, ctx.tensor(0), w, w_q, 2 if ctx.has_input(2) else None)


@lowers("MatMul")
def lower_matmul(ctx: LoweringContext) -> None:
    if ctx.qconst(1) is None and ctx.constant(1) is None:
        raise ctx.unsupported("MatMul with two activation operands is not supported yet")
    w, w_q = _weights(ctx, 1)
    if w.ndim != 2:
        raise ctx.unsupported("MatMul weight must be 2-D")
    _fully_connected(ctx, ctx.tensor(0), w.T, w_q, None)
