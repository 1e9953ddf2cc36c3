"""Convolutions and fully connected layers: Conv, Gemm, MatMul with a constant weight.

Integer form: CONV2D / DEPTHWISE_CONV2D with an int32 accumulator, then one
per-channel RESCALE to the output's int8 parameters. Fully connected layers
are 1x1 CONV2Ds on an [N, 1, 1, K] view, which Vela compiles as its fastest
fully connected kernel and which needs no weight transpose at run time.

Numerics (issue 21, verify/node_errors): the accumulator is exact and rounds once (32-bit multiplier);
the QDQ model on onnxruntime sums dequantised floats in float32, so a value within ~1e-4 LSB of a rounding
boundary goes either way: 1 LSB on at most 0.1% of a conv's elements on the examples (mobilevit conv_11
0.098%, unet conv_19 0.047%), never more. Those flips, not any double rounding, are what deep models grow into several LSB.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import tosa_serializer as ts

from npubuild.lowering.context import NHWC, VELA_MAX_DIM, LoweringContext, TTensor, identity
from npubuild.lowering.convolution import (
    Bias,
    acc_type,
    channel_scales,
    conv_pads,
    emit_conv,
    exact_pads,
    int_conv,
    rescale_acc,
    slice_hw,
)
from npubuild.lowering.emit import Op, as_int16, attr, rescale, reshape, to_layout, transpose
from npubuild.lowering.fusion import epilogue
from npubuild.lowering.fusion.concat_copy import fits_max_copy, max_copy_rows
from npubuild.lowering.movement import phys_reshape
from npubuild.lowering.quant import QParams, accumulator
from npubuild.lowering.reduction import emit_reduce
from npubuild.lowering.registry import lowers
from npubuild.lowering.space_to_depth import column_blocks, fold_stride, patch_view
from npubuild.lowering.spatial import (
    CHANNELS_LAST_1D,
    Window,
    direct_output,
    from_nhwc,
    spatial_rank,
    window,
    window_input,
)


def widen_instead_of_slice(w: np.ndarray, in_hw: tuple[int, int], keep: tuple[int, int]) -> np.ndarray:
    """Zero taps after the kernel in place of slicing off the input rows/cols the stride never reaches.

    The same integers (a zero weight adds nothing), but the input keeps its full
    width: on U85 Vela then keeps the block input (read by the other branch of
    a ResNet downsampling block too) in its brick format and picks the better block.
    """
    extra = (in_hw[0] - keep[0], in_hw[1] - keep[1])
    return np.pad(w, [(0, 0), (0, 0), (0, extra[0]), (0, extra[1])])


def read_bias(ctx: LoweringContext, index: int | None, o: int) -> Bias:
    """Input `index` as a Bias of o entries (absent -> zeros; a scalar or [1, o] broadcasts)."""
    real = ctx.constant(index) if index is not None else None
    if real is None:
        if index is not None and ctx.has_input(index):
            raise ctx.unsupported("the bias must be a constant")
        return Bias(np.zeros(o))
    real = real.astype(np.float64).reshape(-1)
    if real.size not in (1, o):
        raise ctx.unsupported(f"a bias of {real.size} values does not broadcast to {o} output channels")
    real = np.broadcast_to(real, (o,)).copy()
    qb = ctx.qconst(index)
    if qb is not None and qb.data.dtype == np.int32 and qb.data.size == o:
        scale = np.broadcast_to(np.asarray(qb.q.scale, np.float64).reshape(-1), (o,)).copy()
        return Bias(real, qb.data.astype(np.int32).reshape(o), scale)
    return Bias(real)


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


def slice_channels(ctx: LoweringContext, x: TTensor, start: int, size: int) -> TTensor:
    """SLICE channels [start, start + size) of an NHWC tensor."""
    shape = (*x.shape[:3], size)
    out = ctx.new_tensor(shape, x.dtype, x.perm, x.q)
    ctx.op(Op.SLICE, [x.name, ctx.shape_const([0, 0, 0, start]), ctx.shape_const(list(shape))], [out.name],
           attr("Slice"))
    return out


def concat(ctx: LoweringContext, parts: list[TTensor], axis: int, output_name: str | None) -> TTensor:
    shape = list(parts[0].shape)
    shape[axis] = sum(p.shape[axis] for p in parts)
    out = ctx.new_tensor(tuple(shape), parts[0].dtype, parts[0].perm, parts[0].q, output_of=output_name)
    ctx.op(Op.CONCAT, [p.name for p in parts], [out.name], attr("Concat", axis))
    return out


def _copied_rows(ctx: LoweringContext, x: TTensor) -> TTensor:
    """x copied by a MAXIMUM of itself (the same integers) over its [N, H, 1, W * C] rows view: a Concat output
    Vela 5.2 leaves in DRAM is then read once in long bursts, and the conv's window reads hit the copy in SRAM.
    PP-OCRv4 det's 3x3 conv over its 40x40x96 FPN concat on U85-256: 1.26M cycles of DRAM reads at 10% MAC
    utilisation, against the copy's and the conv's ~0.3M (ethosu/measured.CONV_INPUT_COPY measures it per node)."""
    n, h, w, c = x.shape
    if not fits_max_copy(x) or x.perm != NHWC or w * c > VELA_MAX_DIM:
        return x
    return max_copy_rows(ctx, x)


@lowers("Conv")
def lower_conv(ctx: LoweringContext) -> None:
    """2-D convolutions, and 1-D ones as 2-D with H = 1 (spatial.py): a Conv1d stack stays channels-last."""
    phased = phase_view(ctx)
    if phased is not None:
        x, w, w_q, win = phased
        spatial = 1
    else:
        x, spatial = window_input(ctx, 0, "convolutions")
        w, w_q = _weights(ctx, 1)
        if w.ndim != spatial + 2:
            raise ctx.unsupported(f"weights of rank {w.ndim} for a {spatial}-D convolution")
        if spatial == 1:
            w = w[:, :, None, :]
        win = window(ctx, spatial, w.shape[2 + 2 - spatial:])
    group = int(ctx.attr("group", 1))
    if ctx.current.name in ctx.options.conv_input_copy_nodes:
        x = _copied_rows(ctx, x)
    c = x.shape[3]
    o = w.shape[0]
    kernel, stride, dilation = (w.shape[2], w.shape[3]), win.stride, win.dilation
    pads = conv_pads((x.shape[1], x.shape[2]), replace(win, kernel=kernel))
    blocked = column_blocks(ctx, x, w, pads, stride, dilation, ctx.options.column_block_min_stride) \
        if group == 1 and ctx.profile == "int" and (kernel != tuple(stride) or any(pads)) else None
    if blocked is not None:  # strided past 3 along W (an STFT as a conv): a stride-1 conv of its W-block view
        (x, w, pads), stride = blocked, (stride[0], 1)
    pads, keep = exact_pads((x.shape[1], x.shape[2]), (w.shape[2], w.shape[3]), stride, dilation, pads)
    if ctx.options.conv_stride_taps and dilation == (1, 1) and keep != (x.shape[1], x.shape[2]):
        w = widen_instead_of_slice(w, (x.shape[1], x.shape[2]), keep)
        keep = (x.shape[1], x.shape[2])
    x = slice_hw(ctx, x, keep)
    if ctx.options.dilation_taps and max(dilation) > MAX_HW_DILATION:
        w, dilation = taps_for_dilation(w, dilation)
    patched = patch_view(ctx, x, w, pads, stride, dilation, ctx.options.patch_conv_min_stride) \
        if group == 1 and ctx.profile == "int" and blocked is None else None
    if patched is not None:  # a patch embedding (kernel = stride > 3) as a 1x1 conv of its patch view
        (x, w), stride = patched, (1, 1)
    elif group == 1 and ctx.profile == "int" and ctx.options.space_to_depth_channels is not None:
        folded = fold_stride(ctx, x, w, pads, stride, dilation, ctx.options.space_to_depth_channels)
        if folded is not None:  # a narrow stride-2 conv on its 2x2 space-to-depth view (space_to_depth.py)
            (x, w, pads), stride = folded, (1, 1)
    bias = read_bias(ctx, 2, o)
    w_scale = channel_scales(w_q, o) if w_q is not None else None
    name = ctx.current.output[0]
    out_name = direct_output(spatial, name)
    if group == 1 or (group == c and w.shape[1] == 1):
        out = emit_conv(ctx, x, w, w_scale, bias, pads, stride, dilation, group != 1, out_name)
        ctx.set_output(0, from_nhwc(ctx, out, spatial, name))
        return
    if c % group or o % group:
        raise ctx.unsupported(f"group={group} does not divide {c} input and {o} output channels")
    cin, cout = c // group, o // group
    parts = []
    for g in range(group):
        sel = slice(g * cout, (g + 1) * cout)
        xg = slice_channels(ctx, x, g * cin, cin)
        parts.append(emit_conv(ctx, xg, w[sel], None if w_scale is None else w_scale[sel], bias.select(sel), pads,
                               stride, dilation, False, None))
    ctx.set_output(0, from_nhwc(ctx, concat(ctx, parts, 3, out_name), spatial, name))


def phase_view(ctx: LoweringContext) -> tuple[TTensor, np.ndarray, QParams | None, Window] | None:
    """A 1-D conv dilated by d >= LoweringOptions.dilation_phase_min, stride 1, as an undilated (k, 1) conv
    on its input's phase view [N, L / d, d, C] (context.RowImage; d divides L and both pads), or None.

    ONNX y[t] = sum_j w[j] x[t + j d - b]; with t = h d + p that is row h + j - b / d, column p of the view:
    a conv down the rows with pads b / d and e / d, the same integers with none of the zero taps a
    dilation past 2 otherwise needs (taps_for_dilation) and no per-phase split by Vela. Its output is in
    that view too, as is the next conv of a TCN block and its residual Add.
    """
    row = ctx.row(0)  # the option read only for a 1-D conv (the stage's Lowerings shares a 2-D model's graph)
    d_min = ctx.options.dilation_phase_min if row is not None else None
    if row is None or d_min is None:
        return None
    w, w_q = _weights(ctx, 1)
    if w.ndim != 3:
        return None
    win = window(ctx, 1, w.shape[2:])
    d, b, e = win.dilation[1], win.onnx_pads[1], win.onnx_pads[3]
    if d < d_min or win.stride != (1, 1) or win.auto_pad != "NOTSET" or row.length % d or b % d or e % d:
        return None
    return (ctx.row_view(row, d), w[:, :, :, None], w_q,
            Window((w.shape[2], 1), (1, 1), (1, 1), (b // d, 0, e // d, 0), "NOTSET"))


def _transpose_conv_pads(ctx: LoweringContext, in_hw, kernel, stride, spatial: int) -> list[int]:
    """ONNX ConvTranspose pads/output_padding/output_shape/auto_pad -> TOSA out_pad [top, bottom, left, right].

    A 1-D op is laid out along H (W = 1), see lower_conv_transpose; `kernel` is the dilated kernel.
    """
    def lift(values: list[int], fill: int) -> list[int]:
        return [*values, fill] if spatial == 1 else list(values)

    out_padding = lift(list(ctx.attr("output_padding", [0] * spatial)), 0)
    auto_pad = ctx.attr("auto_pad", b"NOTSET")
    auto_pad = auto_pad.decode() if isinstance(auto_pad, bytes) else auto_pad
    out_shape = ctx.attr("output_shape")
    if out_shape is not None or auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        target = lift(list(out_shape)[-spatial:], 1) if out_shape is not None else \
            [in_hw[i] * stride[i] for i in range(2)]
        pads = []
        for i in range(2):
            total = (in_hw[i] - 1) * stride[i] + out_padding[i] + kernel[i] - target[i]
            small, big = total // 2, total - total // 2
            pads.append((small, big) if auto_pad == "SAME_UPPER" else (big, small))
        p = [pads[0][0], pads[1][0], pads[0][1], pads[1][1]]
    elif auto_pad == "VALID":
        p = [0, 0, 0, 0]
    else:
        p = list(ctx.attr("pads", [0] * 2 * spatial))
        if spatial == 1:
            p = [p[0], 0, p[1], 0]
    return [-p[0], -p[2] + out_padding[0], -p[1], -p[3] + out_padding[1]]


def emit_transpose_conv(ctx: LoweringContext, x: TTensor, w_iohw: np.ndarray, w_scale: np.ndarray | None, bias: Bias,
                        out_pad: list[int], stride, output_name: str | None) -> TTensor:
    """TRANSPOSE_CONV2D (+ RESCALE in the integer profile) of an NHWC input; weights as ONNX's [C_in, C_out, kh, kw]."""
    o, kh, kw = w_iohw.shape[1], w_iohw.shape[2], w_iohw.shape[3]
    n, ih, iw, _ = x.shape
    oh = (ih - 1) * stride[0] + out_pad[0] + out_pad[1] + kh
    ow = (iw - 1) * stride[1] + out_pad[2] + out_pad[3] + kw
    weights = w_iohw.transpose(1, 2, 3, 0)  # OHWI
    if ctx.profile == "int":
        assert x.q is not None and w_scale is not None
        acc_scale = x.q.s * w_scale
        acc = int_conv(ctx, Op.TRANSPOSE_CONV2D, x, weights, bias, (n, oh, ow, o),
                       attr("TransposeConv2d", out_pad, list(stride), False, acc_type(x)), acc_scale)
        return rescale_acc(ctx, acc, acc_scale, output_name)
    out = ctx.new_tensor((n, oh, ow, o), np.float32, NHWC, output_of=output_name)
    ins = [x.name, ctx.const(weights.astype(np.float32), "weights"), ctx.const(bias.real.astype(np.float32), "bias"),
           ctx.zp(0, np.float32), ctx.zp(0, np.float32)]
    ctx.op(Op.TRANSPOSE_CONV2D, ins, [out.name], attr("TransposeConv2d", out_pad, list(stride), False, ts.DType.FP32))
    return out


def phases_conv(ctx: LoweringContext, x: TTensor, w_iohw: np.ndarray, w_scale: np.ndarray, bias: Bias,
                output_name: str | None) -> TTensor:
    """An int8 transposed conv whose kernel equals its stride (no two taps meet) as one 1x1 CONV2D of every
    phase: output channel (i * kw + j) * C_out + co is out[kh h + i, kw w + j, co], the same int32 sum and the
    same per-channel rescale (which Vela fuses into the CONV2D), then the depth-to-space shuffle (RESHAPE,
    TRANSPOSE, RESHAPE) into place (LoweringOptions.transpose_conv_phases). Vela 5.2 leaves the RESCALE after
    a TRANSPOSE_CONV2D unfused: per channel an int32 MUL, 32 cycles an element on U55-128."""
    cin, cout, kh, kw = w_iohw.shape
    n, h, w, _ = x.shape
    assert x.q is not None
    phases = kh * kw
    weights = w_iohw.transpose(2, 3, 1, 0).reshape(phases * cout, 1, 1, cin)  # OHWI, o = (i * kw + j) * cout + co
    tiled = Bias(np.tile(bias.real, phases), None if bias.exact is None else np.tile(bias.exact, phases),
                 None if bias.exact_scale is None else np.tile(bias.exact_scale, phases))
    acc_scale = x.q.s * np.tile(np.broadcast_to(w_scale, (cout,)), phases)
    acc = int_conv(ctx, Op.CONV2D, x, weights, tiled, (n, h, w, phases * cout),
                   attr("Conv2d", [0, 0, 0, 0], [1, 1], [1, 1], False, acc_type(x)), acc_scale)
    y = rescale_acc(ctx, acc, acc_scale, None)
    rows = phys_reshape(ctx, y, (n * h, w, kh, kw * cout))
    shuffled = transpose(ctx, rows, (0, 2, 1, 3), (0, 1, 2, 3))
    return phys_reshape(ctx, shuffled, (n, h * kh, w * kw, cout), NHWC, output_of=output_name)


def _phases_apply(ctx: LoweringContext, spatial: int, group: int, kernel: tuple[int, int], stride,
                  out_pad: list[int], dilation) -> bool:
    """Whether this transposed conv takes the phases form (phases_conv)."""
    return (ctx.options.transpose_conv_phases and ctx.profile == "int" and spatial == 2 and group == 1
            and tuple(kernel) == tuple(stride) and not any(out_pad) and tuple(dilation) == (1, 1))


MAX_HW_DILATION = 2  # the dilation Ethos-U convolves with; Vela splits a larger one into per-phase convs
MAX_TAPS_EXTENT = 64  # Vela's largest kernel height / width


def taps_for_dilation(w: np.ndarray, dilation: tuple[int, int]) -> tuple[np.ndarray, tuple[int, int]]:
    """A conv kernel with dilation past MAX_HW_DILATION as a wider kernel of zeros between taps, convolved at
    dilation 2 (an even dilation d: taps d / 2 apart) or 1 (odd): the same sums, one conv instead of Vela's d
    phase convs (LoweringOptions.dilation_taps; TCN d = 4, 8 on U55-128: 4 x 1850 -> 3924 cycles for d = 8)."""
    spread = tuple(d // 2 if d % 2 == 0 else d for d in dilation)
    hw = tuple(2 if d % 2 == 0 else 1 for d in dilation)
    extent = [(k - 1) * s + 1 for k, s in zip(w.shape[2:], spread, strict=True)]
    if max(extent) > MAX_TAPS_EXTENT:
        return w, dilation
    return dilate_kernel(w, spread), hw  # type: ignore[arg-type]


def dilate_kernel(w: np.ndarray, dilation: tuple[int, int]) -> np.ndarray:
    """A [.., .., kh, kw] kernel with dilation - 1 zeros between its taps: the same transposed convolution
    (TOSA's has no dilation; the zeros add nothing)."""
    if dilation == (1, 1):
        return w
    kh, kw = w.shape[2], w.shape[3]
    out = np.zeros((*w.shape[:2], (kh - 1) * dilation[0] + 1, (kw - 1) * dilation[1] + 1), w.dtype)
    out[:, :, ::dilation[0], ::dilation[1]] = w
    return out


def _as_column(ctx: LoweringContext, x: TTensor) -> TTensor:
    """A rank-3 [N, C, L] tensor as the NHWC view [N, L, 1, C] (free from its channels-last layout)."""
    x = to_layout(ctx, x, CHANNELS_LAST_1D)
    n, length, c = x.shape
    return reshape(ctx, x, (n, length, 1, c), NHWC)


@lowers("ConvTranspose")
def lower_conv_transpose(ctx: LoweringContext) -> None:
    """TRANSPOSE_CONV2D: TOSA scatters like ONNX (no kernel flip); ONNX pads crop, so out_pad is negative.

    Groups become one TRANSPOSE_CONV2D with block-diagonal weights (group times
    the MACs of the grouped op; transposed convolutions with groups are rare). Dilation spreads the
    kernel's taps with zeros (dilate_kernel). A 1-D op runs along H of an [N, L, 1, C] view with the
    stride on both axes (W = 1, so the W stride reads nothing): Ethos-U55/U65 run TRANSPOSE_CONV2D only
    at stride 1x1 or 2x2 (support rule u55-transpose-conv-stride), so an H = 1 view with stride 1x2 would
    not run there.
    """
    x = ctx.tensor(0)
    spatial = spatial_rank(ctx, x, "transposed convolutions")
    x = to_layout(ctx, x, NHWC) if spatial == 2 else _as_column(ctx, x)
    w, w_q = _weights(ctx, 1)  # [C_in, C_out / group, kh, kw]
    if w.ndim != spatial + 2:
        raise ctx.unsupported(f"weights of rank {w.ndim} for a {spatial}-D transposed convolution")
    if spatial == 1:
        w = w[:, :, :, None]
    dilations = [int(d) for d in ctx.attr("dilations", [1] * spatial)]
    strides = [int(s) for s in ctx.attr("strides", [1] * spatial)]
    dilation = (dilations[0], 1) if spatial == 1 else tuple(dilations)
    stride = (strides[0], strides[0]) if spatial == 1 else tuple(strides)
    w = dilate_kernel(w, dilation)
    group = int(ctx.attr("group", 1))
    c = x.shape[3]
    cout_g, kh, kw = w.shape[1], w.shape[2], w.shape[3]
    o = cout_g * group
    if c % group or w.shape[0] != c:
        raise ctx.unsupported(f"group={group} does not divide {c} input channels")
    out_pad = _transpose_conv_pads(ctx, (x.shape[1], x.shape[2]), (kh, kw), stride, spatial)
    if out_pad[0] <= -kh or out_pad[1] <= -kh or out_pad[2] <= -kw or out_pad[3] <= -kw:
        raise ctx.unsupported("padding of a whole kernel or more is not supported")
    bias = read_bias(ctx, 2, o)
    w_scale = channel_scales(w_q, o) if w_q is not None else None
    name = ctx.current.output[0]
    if _phases_apply(ctx, spatial, group, (kh, kw), stride, out_pad, dilation):
        assert w_scale is not None
        ctx.set_output(0, phases_conv(ctx, x, w, w_scale, bias, name))
        return
    if group > 1:  # block-diagonal weights: exact, one op (per-group SLICEs were not bit-exact on npu-sim)
        full = np.zeros((c, o, kh, kw), w.dtype)
        cin = c // group
        for g in range(group):
            full[g * cin:(g + 1) * cin, g * cout_g:(g + 1) * cout_g] = w[g * cin:(g + 1) * cin]
        w = full
    y = emit_transpose_conv(ctx, x, w, w_scale, bias, out_pad, stride, name if spatial == 2 else None)
    if spatial == 1:
        n, length, _, oc = y.shape
        y = reshape(ctx, y, (n, length, oc), CHANNELS_LAST_1D, output_of=name)
    ctx.set_output(0, y)


def fc_view(lshape: tuple[int, ...]) -> tuple[int, ...]:
    """The NHWC shape a fully connected layer's input [..., K] is viewed as: the leading dims padded to
    [1, H, W] on the left, as Vela pads the rank of the tensors around it. The conv's output then has the
    shape the next op reads (a TABLE or elementwise op after a RESHAPE to [..., O]), so Vela fuses it;
    [1, M, 1, K] left a reshape between them that blocks its fusing of GELU's TABLE into the conv."""
    lead = tuple(int(d) for d in lshape[:-1])
    if len(lead) > 3 or (len(lead) == 3 and lead[0] != 1):
        lead = (int(np.prod(lead)),)
    return (*(1,) * (3 - len(lead)), *lead, int(lshape[-1]))


def unshared(ctx: LoweringContext, x: TTensor) -> TTensor:
    """x, or a SLICE of all of it when other nodes read the current node's input 0 too.

    Vela drops a RESHAPE by aliasing its input, unless that input has other readers and a
    different shape: then it inserts a MemoryCopy (a transformer's LayerNorm output read by the
    next projection and the residual Add: 1520 cycles on U55-128, 731 on U85-256 per 16x64 block).
    A whole-tensor SLICE gives the RESHAPE an input of its own, which Vela reads in place (no layer).
    """
    if len(ctx.index.uses(ctx.index.source(ctx.current.input[0]), [])) <= 1:
        return x
    out = ctx.new_tensor(x.shape, x.dtype, x.perm, x.q)
    ctx.op(Op.SLICE, [x.name, ctx.shape_const([0] * len(x.shape)), ctx.shape_const(list(x.shape))], [out.name],
           attr("Slice"))
    return out


def _fully_connected(ctx: LoweringContext, x: TTensor, w_ok: np.ndarray, w_scale: np.ndarray | None, bias: Bias) -> None:
    """x [..., K] times w^T, w as [O, K]: a 1x1 CONV2D over an NHWC view of x (fc_view).

    A following bias Add / positive scalar Mul chain is folded into the conv's bias and rescale (epilogue.py).
    """
    lshape = x.logical_shape
    x = to_layout(ctx, x, identity(len(lshape)))
    k = lshape[-1]
    view = reshape(ctx, unshared(ctx, x) if len(x.shape) != 4 else x, fc_view(lshape), NHWC)
    o = w_ok.shape[0]
    w4 = w_ok.reshape(o, k, 1, 1)
    out_name = ctx.current.output[0]
    ep = epilogue.follow(ctx, o, len(lshape))
    out_q = None
    if ep is not None:
        if w_scale is not None:
            w_scale = w_scale * ep.gain
        else:
            w4 = w4 * ep.gain
        exact = ep.exact if ep.exact is not None and not np.any(bias.real) else (None, None)
        bias = Bias(bias.real * ep.gain + ep.bias, *exact)  # exact: the QDQ model's int32 bias (qdq_linear.py)
        out_name, out_q = ep.out_name, ep.out_q
    if ctx.profile == "int" and o % 2 == 0 and ctx.current is not None and \
            ctx.current.name in ctx.options.fc_halves_nodes:
        # two halves of the output channels on the output's one quantisation: each channel's integers as one conv's
        q = out_q or ctx.require_output_q()
        halves = [slice(0, o // 2), slice(o // 2, o)]
        y = concat(ctx, [emit_conv(ctx, view, w4[h], None if w_scale is None else w_scale[h], bias.select(h),
                                   [0, 0, 0, 0], (1, 1), (1, 1), False, output_name=None, out_q=q) for h in halves],
                   3, None)
    else:
        y = emit_conv(ctx, view, w4, w_scale, bias, [0, 0, 0, 0], (1, 1), (1, 1), False, output_name=None, out_q=out_q)
    out_shape = (*lshape[:-1], o)
    ctx.values[out_name] = reshape(ctx, y, out_shape, identity(len(out_shape)), output_of=out_name)
    if ep is not None:
        ep.commit(ctx)


def _transposed(x: TTensor) -> TTensor:
    """The same physical tensor seen as its 2-D logical transpose (no op: only the layout changes)."""
    return TTensor(x.name, x.shape, x.dtype, tuple(1 - p for p in x.perm), x.q)


@lowers("Gemm")
def lower_gemm(ctx: LoweringContext) -> None:
    """alpha folds into the weight scale (or the float weights), beta into the bias."""
    alpha, beta = float(ctx.attr("alpha", 1.0)), float(ctx.attr("beta", 1.0))
    x = ctx.tensor(0)
    if len(x.shape) != 2:
        raise ctx.unsupported(f"Gemm input must be 2-D, got shape {list(x.logical_shape)}")
    if int(ctx.attr("transA", 0)):
        x = _transposed(x)
    if alpha == 0:
        raise ctx.unsupported("alpha=0 is not supported")
    if ctx.qconst(1) is None and ctx.constant(1) is None:
        if ctx.has_input(2) and beta != 0:
            raise ctx.unsupported("Gemm with an activation B operand and a C input is not supported")
        if alpha < 0:
            raise ctx.unsupported("Gemm with an activation B operand and a negative alpha is not supported")
        b = ctx.tensor(1)
        matmul(ctx, x, _transposed(b) if int(ctx.attr("transB", 0)) else b, None, alpha)
        return
    w, w_q = _weights(ctx, 1)
    if not int(ctx.attr("transB", 0)):
        w = w.T
    o = w.shape[0]
    w_scale = channel_scales(w_q, o) if w_q is not None else None
    if alpha < 0:
        w = -w if ctx.profile == "fp" else np.clip(-w.astype(np.int32), -w_q.qmax, w_q.qmax).astype(w.dtype)
    if ctx.profile == "fp":
        w = w * abs(alpha)
    elif w_scale is not None:
        w_scale = w_scale * abs(alpha)
    bias = read_bias(ctx, 2, o) if beta != 0 else Bias(np.zeros(o))
    _fully_connected(ctx, x, w, w_scale, bias.scaled(beta))


@lowers("MatMul")
def lower_matmul(ctx: LoweringContext) -> None:
    """Constant 2-D weight: a fully connected layer. Otherwise TOSA MATMUL on [N, H, C] x [N, C, W]."""
    const = ctx.qconst(1) is not None or ctx.constant(1) is not None
    if const:
        w, w_q = _weights(ctx, 1)
        if w.ndim == 2:
            o = w.shape[1]
            w_scale = channel_scales(w_q, o) if w_q is not None else None
            _fully_connected(ctx, ctx.tensor(0), w.T, w_scale, Bias(np.zeros(o)))
            return
    requantized = _per_column_weights(ctx)
    b, b_cols = requantized if requantized is not None else (ctx.tensor(1), None)
    matmul(ctx, ctx.tensor(0), b, b_cols)


def _as_rank3(ctx: LoweringContext, x: TTensor, batch: int, rows: int | None = None) -> TTensor:
    """A logical [..., r, c] operand as a physical [batch, rows (default r), c] tensor."""
    ls = x.logical_shape
    x = to_layout(ctx, x, identity(len(ls)))
    return reshape(ctx, x, (batch, rows or ls[-2], ls[-1]), (0, 1, 2))


def _per_column_weights(ctx: LoweringContext) -> tuple[TTensor, np.ndarray] | None:
    """A constant B quantized per channel on another axis than its last: requantize per column.

    onnxruntime quantizes a 3-D MatMul weight per slice of axis 1 (the reduced
    axis), which no integer MATMUL can use; per-column scales become a
    per-channel RESCALE of the result instead. Returns (B tensor, column scales).
    """
    qc = ctx.qconst(1)
    if qc is None or qc.q.is_per_tensor:
        return None
    data = qc.data.astype(np.float64)
    axis = qc.q.axis if qc.q.axis is not None and qc.q.axis >= 0 else data.ndim + (qc.q.axis or 0)
    shape = [1] * data.ndim
    shape[axis] = -1
    real = (data - qc.q.zero_point.reshape(shape)) * qc.q.scale.reshape(shape)
    cols = np.max(np.abs(real.reshape(-1, real.shape[-1])), axis=0) / 127.0
    cols = np.where(cols > 0, cols, 1.0)
    q = np.clip(np.round(real / cols), -127, 127).astype(np.int8)
    t = ctx.materialize_const(q, QParams(np.float64(1.0), np.int64(0), np.dtype(np.int8)), hint="weights")
    return TTensor(t.name, t.shape, t.dtype, identity(q.ndim), t.q), cols


def _tiled(ctx: LoweringContext, x: TTensor, batch: tuple[int, ...]) -> TTensor:
    """A [..., r, c] operand TILEd along its (left-padded) batch dims to `batch`."""
    ls = x.logical_shape
    full = (1,) * (len(batch) + 2 - len(ls)) + tuple(ls)
    x = reshape(ctx, to_layout(ctx, x, identity(len(ls))), full, identity(len(full)))
    repeats = [b // d for b, d in zip(batch, full[:-2], strict=True)] + [1, 1]
    if all(r == 1 for r in repeats):
        return x
    out = ctx.new_tensor(tuple(d * r for d, r in zip(full, repeats, strict=True)), x.dtype, x.perm, x.q)
    ctx.op(Op.TILE, [x.name, ctx.shape_const(repeats)], [out.name], attr("Tile"))
    return out


def _as_matrix(ctx: LoweringContext, x: TTensor, shape: tuple[int, ...]) -> TTensor:
    """A 1-D operand as the 2-D matrix ONNX MatMul treats it as."""
    return reshape(ctx, to_layout(ctx, x, (0,)), shape, (0, 1))


MAX_PRODUCTS = 1 << 18  # int32 elements of the products tensor (1 MiB): beyond it the form cannot pay


def _products_pay(ctx: LoweringContext, a3: TTensor, b3: TTensor, b_cols: np.ndarray | None) -> bool:
    """Whether this MatMul of two feature maps takes the products form (LoweringOptions.matmul_products)."""
    named = ctx.current is not None and ctx.current.name in ctx.options.matmul_products_nodes
    if not (ctx.options.matmul_products or named) or b_cols is not None or a3.shape[0] != b3.shape[0]:
        return False
    return a3.shape[0] * a3.shape[1] * a3.shape[2] * b3.shape[2] <= MAX_PRODUCTS


def _matmul_products(ctx: LoweringContext, a3: TTensor, b3: TTensor) -> TTensor:
    """The int32 MATMUL result of [B, M, K] x [B, K, N] as every product (a - za)(b - zb) in one broadcast int16
    MUL to [B, M, N, K] and a REDUCE_SUM over K (the channel axis): the same sums. Vela 5.2 runs a MATMUL of two
    feature maps on U55 / U65 as a long command sequence (the transformer's [4, 16, 16] products: 36.9k cycles
    each on U65-256, 16k of them command cycles); as two elementwise-sized ops it is one pass each."""
    batch, m, k = a3.shape
    n = b3.shape[2]
    a4 = reshape(ctx, a3, (batch, m, 1, k), (0, 1, 2, 3))
    bt = transpose(ctx, b3, (0, 2, 1), (0, 1, 2))  # [B, N, K]
    b4 = reshape(ctx, bt, (batch, 1, n, k), (0, 1, 2, 3))
    a16 = rescale(ctx, a4, 1.0, np.int16, int(a3.q.zp), 0, None)
    b16 = rescale(ctx, b4, 1.0, np.int16, int(b3.q.zp), 0, None)
    prod = ctx.new_tensor((batch, m, n, k), np.int32, (0, 1, 2, 3))
    ctx.op(Op.MUL, [a16.name, b16.name, ctx.const(np.zeros(1, np.int8), "shift")], [prod.name], attr("Mul"))
    total = emit_reduce(ctx, Op.REDUCE_SUM, prod, [3])
    return reshape(ctx, total, (batch, m, n), (0, 1, 2))


def matmul(ctx: LoweringContext, a: TTensor, b: TTensor, b_cols: np.ndarray | None = None, gain: float = 1.0) -> None:
    """gain * a @ b with numpy batch broadcasting, as TOSA MATMUL on rank 3 (b_cols: B's per-column scales)."""
    la, lb = a.logical_shape, b.logical_shape
    if not la or not lb:
        raise ctx.unsupported("scalar MatMul operands are not supported")
    drop = [len(la) == 1, len(lb) == 1]
    if drop[0]:
        a, la = _as_matrix(ctx, a, (1, la[0])), (1, la[0])
    if drop[1]:
        b, lb = _as_matrix(ctx, b, (lb[0], 1)), (lb[0], 1)
    ba, bb = tuple(la[:-2]), tuple(lb[:-2])
    try:
        out_batch = tuple(int(d) for d in np.broadcast_shapes(ba, bb))
    except ValueError:
        raise ctx.unsupported(f"MatMul batch dims {list(ba)} and {list(bb)} do not broadcast") from None
    na, nb, total = int(np.prod(ba)), int(np.prod(bb)), int(np.prod(out_batch))
    m, n = la[-2], lb[-1]
    if nb == 1:  # one B for every batch of A: fold A's batches into its rows
        a3, b3, batch, rows = _as_rank3(ctx, a, 1, na * m), _as_rank3(ctx, b, 1), 1, na * m
    elif na == total and nb == total:
        a3, b3, batch, rows = _as_rank3(ctx, a, na), _as_rank3(ctx, b, nb), na, m
    elif na == 1:  # one A for every batch of B: TILE it
        a1 = _as_rank3(ctx, a, 1)
        a3 = ctx.new_tensor((nb, m, la[-1]), a1.dtype, (0, 1, 2), a1.q)
        ctx.op(Op.TILE, [a1.name, ctx.shape_const([nb, 1, 1])], [a3.name], attr("Tile"))
        b3, batch, rows = _as_rank3(ctx, b, nb), nb, m
    else:  # each broadcasts only partly (e.g. [2, 1] and [1, 5]): TILE both to the full batch
        a3, b3 = _as_rank3(ctx, _tiled(ctx, a, out_batch), total), _as_rank3(ctx, _tiled(ctx, b, out_batch), total)
        batch, rows = total, m
    out_shape = [*out_batch, m, n]
    if drop[1]:
        out_shape.pop(-1)
    if drop[0]:
        out_shape.pop(-2 if not drop[1] else -1)
    out_name = ctx.current.output[0]
    ep = epilogue.follow(ctx, n, len(out_shape), allow_add=False)  # e.g. attention's 1/sqrt(d) into the rescale
    out_q = None
    if ep is not None:
        gain, out_name, out_q = gain * ep.gain, ep.out_name, ep.out_q
    if ctx.profile == "int":
        if a3.q is None or b3.q is None:
            raise ctx.unsupported("both MatMul operands must be quantized")
        if not b3.q.is_per_tensor:
            raise ctx.unsupported("per-channel quantized B is only supported for constant weights")
        if a3.dtype != b3.dtype:  # TOSA MATMUL takes int8 x int8 or int16 x int16: the int8 one widened, exactly
            a3, b3 = as_int16(ctx, a3), as_int16(ctx, b3)
        if a3.dtype == np.int8 and _products_pay(ctx, a3, b3, b_cols):
            acc = _matmul_products(ctx, a3, b3)
        else:
            acc = ctx.new_tensor((batch, rows, n), accumulator(a3.dtype), (0, 1, 2))
            ctx.op(Op.MATMUL, [a3.name, b3.name, ctx.zp(a3.q.zp, a3.dtype), ctx.zp(b3.q.zp, b3.dtype)], [acc.name],
                   attr("MatMul"))
        b_scale = b_cols if b_cols is not None else np.array([b3.q.s])
        y = rescale_acc(ctx, acc, gain * a3.q.s * b_scale, None, out_q)
    else:
        y = ctx.new_tensor((batch, rows, n), np.float32, (0, 1, 2))
        ctx.op(Op.MATMUL, [a3.name, b3.name, ctx.zp(0, np.float32), ctx.zp(0, np.float32)], [y.name], attr("MatMul"))
        if gain != 1.0:
            g = ctx.const(np.full((1, 1, 1), gain, np.float32), "gain")
            scaled = ctx.new_tensor(y.shape, np.float32, y.perm)
            ctx.op(Op.MUL, [y.name, g, ctx.const(np.zeros(1, np.int8), "shift")], [scaled.name], attr("Mul"))
            y = scaled
    out_shape = tuple(out_shape)
    ctx.values[out_name] = reshape(ctx, y, out_shape, identity(len(out_shape)), output_of=out_name)
    if ep is not None:
        ep.commit(ctx)
