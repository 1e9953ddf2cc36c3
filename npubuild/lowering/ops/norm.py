"""Normalisations: BatchNormalization (not folded), LayerNormalization, InstanceNormalization,
RMSNormalization, GroupNormalization, LpNormalization, LRN (FP only).

BatchNormalization is a per-channel scale and shift: a 1x1 DEPTHWISE_CONV2D
in int8 (each channel's scale is one int8 weight of +-127 with its own
per-channel scale, so the only rounding is the output's), MUL + ADD in FP.

Layer normalisation in int8 (normalising the last axis) is norm_rows: an exact
centring and variance laid out so Vela fuses every RESCALE, then an int16
depthwise conv for gamma and beta. Instance normalisation in int8 (Ethos-U
has no division or rsqrt): with v = x - zp in int32 and K elements per row,
c = K v - sum(v) is exact; sum(c^2) (shifted to fit int32) gives the variance; 1/sqrt comes from the
Newton-Raphson rsqrt in intmath with a per-row CLZ exponent; the normalised
value is kept in int32 fixed point, multiplied by the quantized gamma, beta
added in the same units, and one RESCALE rounds to the output. FP uses
REDUCE_SUM, RSQRT, MUL, ADD directly.

Layer norm against onnxruntime's float32 one fed the same int8 input (verify/node_errors): 1 LSB on
0.11-0.26% of elements on the examples (transformer, transformer_torch, mobilevit), never more: the
Newton rsqrt's last bits and float32's against a rounding boundary (issue 21).
"""

from __future__ import annotations

import math

import numpy as np
import tosa_serializer as ts

from npubuild.lowering import intmath as im
from npubuild.lowering.context import NHWC, LoweringContext, TTensor, identity
from npubuild.lowering.convolution import Bias, emit_conv
from npubuild.lowering.emit import Op, attr, rescale, reshape, to_layout
from npubuild.lowering.fusion.norm_rows import fraction_bits, normalized_int16, normalized_int32
from npubuild.lowering.ops.elementwise import HEADROOM_BITS_16
from npubuild.lowering.quant import multiplier_shift
from npubuild.lowering.reduction import axis_last, emit_reduce
from npubuild.lowering.registry import lowers, quantize_also

quantize_also("RMSNormalization", "GroupNormalization", "LpNormalization")

GAMMA_BITS = 12  # gamma quantized here (when onnxruntime did not) to this many bits


# ---------------------------------------------------------------------------------------------- FP pieces


def _fp(ctx: LoweringContext, op, kind: str, ins: list[TTensor], output_of: str | None = None) -> TTensor:
    shape = tuple(max(dims) for dims in zip(*(t.shape for t in ins), strict=True))
    out = ctx.new_tensor(shape, np.float32, ins[0].perm, output_of=output_of)
    names = [t.name for t in ins] + ([ctx.const(np.zeros(1, np.int8), "shift")] if op == Op.MUL else [])
    ctx.op(op, names, [out.name], attr(kind))
    return out


def _fconst(ctx: LoweringContext, values: np.ndarray, like: TTensor) -> TTensor:
    arr = np.asarray(values, np.float32)
    return TTensor(ctx.const(arr, "f32"), arr.shape, arr.dtype, like.perm)


def _channel_shape(x: TTensor, axis: int, n: int) -> tuple[int, ...]:
    """[1, ..., n, ..., 1] with n at the physical axis `axis`."""
    return tuple(n if i == axis else 1 for i in range(len(x.shape)))


def _fp_normalize(ctx: LoweringContext, x: TTensor, axes: list[int], count: int, eps: float,
                  gamma: np.ndarray, beta: np.ndarray, output_of: str | None, center: bool = True) -> TTensor:
    """(x - mean) / sqrt(var + eps) * gamma + beta; gamma and beta already shaped for broadcasting.
    Without `center`, x / sqrt(mean(x^2) + eps) * gamma + beta (RMS normalisation)."""
    inv = _fconst(ctx, np.full((1,) * len(x.shape), 1.0 / count), x)
    if center:
        mean = _fp(ctx, Op.MUL, "Mul", [emit_reduce(ctx, Op.REDUCE_SUM, x, axes), inv])
        d = _fp(ctx, Op.SUB, "Sub", [x, mean])
    else:
        d = x
    var = _fp(ctx, Op.MUL, "Mul", [emit_reduce(ctx, Op.REDUCE_SUM, _fp(ctx, Op.MUL, "Mul", [d, d]), axes), inv])
    var = _fp(ctx, Op.ADD, "Add", [var, _fconst(ctx, np.full((1,) * len(x.shape), eps), x)])
    r = ctx.new_tensor(var.shape, np.float32, var.perm)
    ctx.op(Op.RSQRT, [var.name], [r.name], attr("Rsqrt"))
    y = _fp(ctx, Op.MUL, "Mul", [_fp(ctx, Op.MUL, "Mul", [d, r]), _fconst(ctx, gamma, x)])
    return _fp(ctx, Op.ADD, "Add", [y, _fconst(ctx, beta, x)], output_of=output_of)


# ---------------------------------------------------------------------------------------------- INT pieces


def _int_normalized(ctx: LoweringContext, x: TTensor, axes: list[int], count: int, eps: float,
                    center: bool = True) -> tuple[TTensor, float]:
    """(x - mean) / sqrt(var + eps) as int32 q with real value q * unit; returns (q, unit). Without `center`,
    x / sqrt(mean(x^2) + eps): c = K v instead of K v - sum(v), the rest the same."""
    assert x.q is not None
    s = x.q.s
    if center:
        v = im.widen(ctx, x)
        c = im.sub(ctx, im.widen(ctx, x, count), emit_reduce(ctx, Op.REDUCE_SUM, v, axes))  # K (v - mean), |c| <= 255 K
    else:
        c = im.widen(ctx, x, count)
    sh1 = max(0, math.ceil(math.log2(65025.0 * count**3)) - 30)
    var_sum = emit_reduce(ctx, Op.REDUCE_SUM, im.mul(ctx, c, c, sh1), axes)  # var = s^2 var_sum 2^sh1 / K^3
    eps_units = int(min(max(1, round(eps * count**3 / (s * s * 2**sh1))), 1 << 30))
    vt = im.add(ctx, var_sum, im.const_i32(ctx, eps_units, var_sum))
    y, h = im.rsqrt(ctx, vt)  # 1/sqrt(vt) = y 2^-29 2^(h - 15)
    sp = math.ceil(math.log2(255.0 * count + 1))
    p = im.mul(ctx, c, y, sp)
    q = im.asr(ctx, p, im.sub(ctx, im.const_i32(ctx, 15, h), h))  # c y 2^(h-15) = q 2^sp
    unit = 2.0 ** (sp - 29 - sh1 / 2) * math.sqrt(count)
    return q, unit


def _gamma_int(ctx: LoweringContext, index: int, n: int) -> tuple[np.ndarray, float]:
    """gamma as integers and one scale: onnxruntime's int8 values when per-tensor, else quantized here."""
    qg = ctx.qconst(index)
    if qg is not None and qg.q.is_per_tensor and qg.data.size == n and np.all(qg.q.zero_point == 0):
        return qg.data.astype(np.int64).reshape(-1), qg.q.s
    g = ctx.constant(index)
    g = np.ones(n) if g is None else np.broadcast_to(g.astype(np.float64).reshape(-1), (n,))
    gmax = float(np.max(np.abs(g))) or 1.0
    scale = gmax / (2 ** (GAMMA_BITS - 1) - 1)
    return np.round(g / scale).astype(np.int64), scale


def _int_affine(ctx: LoweringContext, q: TTensor, unit: float, count: int, gamma_q: np.ndarray, g_scale: float,
                beta: np.ndarray, shape: tuple[int, ...], output_of: str | None) -> TTensor:
    """q * unit * gamma + beta -> the int8 output, with one rounding; gamma/beta broadcast as `shape`."""
    out_q = ctx.require_output_q()
    gmax = float(np.max(np.abs(gamma_q))) * g_scale
    bmax = float(np.max(np.abs(beta))) if beta.size else 0.0
    budget = (math.sqrt(count) * gmax + bmax) / 2**29 or 1e-30  # the output unit that keeps |acc| < 2^29
    sg = max(0, int(np.max(np.abs(gamma_q))).bit_length())
    frac = sg + math.floor(math.log2(g_scale / budget))  # q_f = normalized * 2^frac
    acc_unit = g_scale * 2.0 ** (sg - frac)
    qf = rescale(ctx, q, unit * 2.0**frac, np.int32, 0, 0, None)
    g = im.mul(ctx, qf, im.const_i32(ctx, gamma_q.reshape(shape), qf), sg)
    b = np.clip(np.round(beta / acc_unit), -(2**30), 2**30).astype(np.int64)
    acc = im.add(ctx, g, im.const_i32(ctx, b.reshape(shape), g))
    return rescale(ctx, acc, acc_unit / out_q.s, out_q.dtype, 0, out_q.zp, out_q, output_of=output_of)


def _int_affine_channels_last(ctx: LoweringContext, x: TTensor, count: int, eps: float, gamma: np.ndarray,
                              beta: np.ndarray, output_of: str | None) -> TTensor:
    """Normalise int8 x along its last axis, then * gamma + beta: one int16 DEPTHWISE_CONV2D (+ RESCALE).

    The normalised value comes as int16 with as many fraction bits as fit
    (norm_rows); each channel's weight is +-127 with scale |gamma|/127 (exact,
    as in BatchNormalization) and beta is the int48 bias. Vela then reads 8-bit
    weights and one bias per channel instead of two int32 constants per
    element (MUL + ADD), which cost a third of a layer norm's cycles on U55.
    The int16 step costs accuracy only at rounding ties (measured: <1% of
    elements 1 LSB off instead of <0.05%).
    """
    out_q = ctx.require_output_q()
    k = x.shape[-1]
    # the normalised range that can still change an int8 output (beyond it the output saturates either way),
    # capped by sqrt(K), which no normalised value exceeds
    lo, hi = (out_q.qmin - out_q.zp) * out_q.s, (out_q.qmax - out_q.zp) * out_q.s
    live = gamma != 0
    reach = np.max((max(-lo, hi) + np.abs(beta[live])) / np.abs(gamma[live])) if live.any() else 1.0
    frac, _, _ = fraction_bits(count, math.floor(math.log2(32767.0 / (min(reach, math.sqrt(count)) * 1.01))))
    rows = int(np.prod(x.shape[:-1]))
    if not np.any(beta) and np.all(gamma == gamma[0]) and _uniform_fits(count, frac, gamma[0] / out_q.s):
        return _uniform_scale(ctx, x, count, eps, frac, float(gamma[0]), output_of)
    v16 = normalized_int16(ctx, x, count, eps, frac)
    w_scale = np.where(live, np.abs(gamma) / 127.0, 1.0)
    acc_unit = w_scale * 2.0**-frac
    # RESCALE of int48 takes 16-bit multipliers (scale32 is not allowed)
    mult16, shift16 = multiplier_shift(acc_unit / out_q.s, 16)
    if ctx.options.norm_affine_rescale and not np.any(beta) and np.all(gamma >= 0):
        return _affine_as_rescale(ctx, v16, x, np.where(live, 127 * mult16, 0), shift16, out_q, output_of)
    node = ctx.current.name if ctx.current is not None else None
    if ctx.options.norm_affine_vectors or node in ctx.options.norm_affine_vectors_nodes:
        return _affine_as_vectors(ctx, v16, x, frac, gamma, beta, output_of)
    if node in ctx.options.norm_affine_wide_beta_nodes:
        return _affine_as_vectors(ctx, v16, x, frac, gamma, beta, output_of, wide_beta=True)
    # the rows along W, not H: Vela's depthwise then reads them as one row of blocks (bench/perf_choices.md)
    view = reshape(ctx, v16, (1, 1, rows, k) if ctx.options.norm_affine_one_row else (1, rows, 1, k), NHWC)
    w = np.sign(gamma).astype(np.int8).reshape(1, 1, k, 1) * np.int8(127)  # HWCM
    bias = np.clip(np.round(beta / acc_unit), -(2**46), 2**46).astype(np.int64)
    bias_name = ctx.fresh("bias48")
    ctx.ser.addConst([k], ts.DType.INT48, bias, name=bias_name)
    acc_t = ctx.ser.addIntermediate(list(view.shape), ts.DType.INT48)
    acc = TTensor(acc_t.name, view.shape, np.dtype(np.int64), NHWC)
    ctx.op(Op.DEPTHWISE_CONV2D, [view.name, ctx.const(w, "weights"), bias_name, ctx.zp(0, np.int16), ctx.zp(0, np.int8)],
           [acc.name], attr("DepthwiseConv2d", [0, 0, 0, 0], [1, 1], [1, 1], False, ts.DType.INT48))
    acc_zp = ctx.fresh("zp48")
    ctx.ser.addConst([1], ts.DType.INT48, np.zeros(1, np.int64), name=acc_zp)
    y = ctx.new_tensor(view.shape, out_q.dtype, NHWC, out_q)
    ctx.op(Op.RESCALE, [acc.name, ctx.const(mult16.astype(np.int16), "multiplier"),
                        ctx.const(shift16.astype(np.int8), "shift"), acc_zp, ctx.zp(out_q.zp, out_q.dtype)], [y.name],
           attr("Rescale", False, ts.RoundingMode.SINGLE_ROUND, True, False, False))
    return reshape(ctx, y, x.shape, x.perm, output_of=output_of)


def _uniform_fits(count: int, frac: int, gain: float) -> bool:
    """Whether _uniform_scale takes this layer norm: a positive gamma, and an output step wider than two of the
    normalised value's int32 units (its RESCALE is then a right shift)."""
    _, e, _ = fraction_bits(count, frac)
    return 0 < gain * 2.0 ** -(frac + e) < 0.5


def _uniform_scale(ctx: LoweringContext, x: TTensor, count: int, eps: float, frac: int, gamma: float,
                   output_of: str | None) -> TTensor:
    """A layer norm with one positive gamma for every channel and no beta (torch's default 1 and 0): no affine step.

    The normalised value's full-size int32 SUB rounds once, straight to the int8 output: gamma / s_out's mantissa is
    multiplied into the per-row root (norm_rows.normalized_int32), so the RESCALE left is a power of two, which Vela
    fuses into the SUB. The general form rounds that SUB to int16 and its depthwise rounds again: one full-size pass
    more (U55-128 ~1500 cycles a [16, 64] layer norm; transformer_torch 203840 -> 198240 U55-128, 179398 -> 174437
    U65-256, 61713 -> 55997 U85-256) and, rounding twice, further from onnxruntime's layer norm (the example's TOSA
    SNR 39.71 -> 41.65 dB, max 3 -> 2 LSB). A general RESCALE after the SUB is a pass of its own on U55."""
    out_q = ctx.require_output_q()
    d, m = normalized_int32(ctx, x, count, eps, frac, gamma / out_q.s)
    y = rescale(ctx, d, 2.0**-m, out_q.dtype, 0, out_q.zp, out_q)
    return reshape(ctx, y, x.shape, x.perm, output_of=output_of)


def _affine_as_rescale(ctx: LoweringContext, v16: TTensor, x: TTensor, mult: np.ndarray, shift: np.ndarray, out_q,
                       output_of: str | None) -> TTensor:
    """The depthwise affine with no beta and no negative gamma as one RESCALE of the int16 normalised value.

    The depthwise's int48 sum is 127 v (weight 127, no bias) and its RESCALE rounds (127 v m16 + 2^(sh-1)) >> sh;
    a 32-bit RESCALE of v by 127 m16 (< 2^22) with the same shift rounds the very same product: the same integers
    for every input, without the depthwise's per-channel bias and scale (10 bytes a channel in Vela's weight
    stream) or its 8-bit weights. One multiplier when gamma is uniform (torch's default gamma = 1, beta = 0)."""
    uniform = bool(np.all(mult == mult[0]) and np.all(shift == shift[0]))
    if uniform:
        mult, shift = mult[:1], shift[:1]
    y = ctx.new_tensor(v16.shape, out_q.dtype, v16.perm, out_q)
    ctx.op(Op.RESCALE, [v16.name, ctx.const(mult.astype(np.int32), "multiplier"), ctx.const(shift.astype(np.int8), "shift"),
                        ctx.zp(0, np.int16), ctx.zp(out_q.zp, out_q.dtype)], [y.name],
           attr("Rescale", True, ts.RoundingMode.SINGLE_ROUND, not uniform, False, False))
    return reshape(ctx, y, x.shape, x.perm, output_of=output_of)


def _affine_as_vectors(ctx: LoweringContext, v16: TTensor, x: TTensor, frac: int, gamma: np.ndarray, beta: np.ndarray,
                       output_of: str | None, wide_beta: bool = False) -> TTensor:
    """The affine step as elementwise int16 vectors: an int16 MUL of the normalised value by gamma, then TFLite's
    16-bit ADD of beta, rounding once to the output; 4 bytes a channel of constants (gamma and beta, int16)
    where the depthwise's per-channel scale and bias take 10 a channel in Vela's weight stream, and no weights.

    v16 carries 2^frac; gamma has 15 bits (per tensor: |error| <= max|gamma| / 65534) and v16 gamma fits int32
    exactly. The product goes to int16 on a scale that still holds the output's whole range plus |beta| (a
    saturated term saturates the output either way), 1/512 of an output step fine: the ADD's two operands and
    its one rounding then give the depthwise's integers but where the sum lies within ~1/256 of a rounding
    boundary (not bit for bit: LoweringOptions.exact_only leaves it out, so the family's check holds it to the
    portable graph's error). Vela fuses the MUL's RESCALE into the MUL and the ADD's three into the ADD.

    `wide_beta`: beta as an int32 vector on the product's own scale, added to the int32 product with no
    RESCALE between (one rounding, to the output; 6 bytes a channel). |v16| < 2^15 and |gamma| < 2^15 steps, so
    the product is under 2^30; a beta on that scale under 2^30 too (|beta| <= |gamma| reach, reach 2^frac < 2^15,
    unless reach passed sqrt(K)) makes the sum fit int32, else the int16 ADD above is taken."""
    out_q = ctx.require_output_q()
    k = x.shape[-1]
    row = (1,) * (len(v16.shape) - 1) + (k,)
    int16 = np.dtype(np.int16)
    top = np.iinfo(np.int16).max
    s_g = (float(np.max(np.abs(gamma))) or 1.0) / top
    g16 = TTensor(ctx.const(np.round(gamma / s_g).astype(np.int16).reshape(row), "gamma"), row, int16, v16.perm)
    product = ctx.new_tensor(v16.shape, np.int32, v16.perm)
    ctx.op(Op.MUL, [v16.name, g16.name, ctx.const(np.zeros([1], np.int8), "shift")], [product.name], attr("Mul"))
    unit = 2.0**-frac * s_g  # the product's real value per step
    b_steps = np.round(beta / unit)
    if wide_beta and np.any(beta) and np.max(np.abs(b_steps)) < 2**30:
        b32 = b_steps.astype(np.int32).reshape(row)
        acc = ctx.new_tensor(v16.shape, np.int32, v16.perm)
        ctx.op(Op.ADD, [product.name, ctx.const(b32, "beta")], [acc.name], attr("Add"))
        y = rescale(ctx, acc, unit / out_q.s, out_q.dtype, 0, out_q.zp, out_q)
        return reshape(ctx, y, x.shape, x.perm, output_of=output_of)
    if not np.any(beta):
        y = rescale(ctx, product, unit / out_q.s, out_q.dtype, 0, out_q.zp, out_q)
        return reshape(ctx, y, x.shape, x.perm, output_of=output_of)
    reach = max(out_q.qmax - out_q.zp, out_q.zp - out_q.qmin) * out_q.s
    b_max = float(np.max(np.abs(beta)))
    s_t = (reach + b_max) * 1.01 / top
    s_b = b_max / top
    t16 = rescale(ctx, product, unit / s_t, np.int16, 0, 0, None)
    b16 = TTensor(ctx.const(np.round(beta / s_b).astype(np.int16).reshape(row), "beta"), row, int16, v16.perm)
    twice_max = 2.0 * max(s_t, s_b)
    bits = HEADROOM_BITS_16
    a32 = rescale(ctx, t16, s_t / twice_max * (1 << bits), np.int32, 0, 0, None)
    b32 = rescale(ctx, b16, s_b / twice_max * (1 << bits), np.int32, 0, 0, None)
    acc = ctx.new_tensor(v16.shape, np.int32, v16.perm)
    ctx.op(Op.ADD, [a32.name, b32.name], [acc.name], attr("Add"))
    y = rescale(ctx, acc, twice_max / ((1 << bits) * out_q.s), out_q.dtype, 0, out_q.zp, out_q)
    return reshape(ctx, y, x.shape, x.perm, output_of=output_of)


def _affine_values(ctx: LoweringContext, n: int) -> tuple[np.ndarray, np.ndarray]:
    g = ctx.constant(1)
    b = ctx.constant(2)
    if (g is None and ctx.has_input(1)) or (b is None and ctx.has_input(2)):
        raise ctx.unsupported("scale and bias must be constants")
    gamma = np.ones(n) if g is None else np.broadcast_to(g.astype(np.float64).reshape(-1), (n,))
    beta = np.zeros(n) if b is None else np.broadcast_to(b.astype(np.float64).reshape(-1), (n,))
    return gamma, beta


def _normalize(ctx: LoweringContext, x: TTensor, axes: list[int], count: int, chan_axis: int, n: int,
               output_of: str | None) -> TTensor:
    """Normalise x over physical `axes`, then scale/shift per entry of physical axis `chan_axis` (n entries)."""
    eps = float(ctx.attr("epsilon", 1e-5))
    shape = _channel_shape(x, chan_axis, n)
    if ctx.profile == "fp":
        gamma, beta = _affine_values(ctx, n)
        return _fp_normalize(ctx, x, axes, count, eps, gamma.reshape(shape), beta.reshape(shape), output_of)
    if x.q is None or x.dtype != np.int8:
        raise ctx.unsupported("the integer normalisation needs an int8 input")
    if chan_axis == len(x.shape) - 1 and axes == [chan_axis]:
        gamma, beta = _affine_values(ctx, n)
        return _int_affine_channels_last(ctx, x, count, eps, gamma, beta, output_of)
    q, unit = _int_normalized(ctx, x, axes, count, eps)
    gamma_q, g_scale = _gamma_int(ctx, 1, n)
    _, beta = _affine_values(ctx, n)
    return _int_affine(ctx, q, unit, count, gamma_q, g_scale, beta, shape, output_of)


# ---------------------------------------------------------------------------------------------- ops


@lowers("LayerNormalization")
def lower_layer_norm(ctx: LoweringContext) -> None:
    """Rows of the trailing dims from `axis`: a [rows, K] view, normalised along K."""
    if any(o for o in ctx.current.output[1:]):
        raise ctx.unsupported("the Mean and InvStdDev outputs are not supported")
    x = ctx.tensor(0)
    shape = x.logical_shape
    axis = int(ctx.attr("axis", -1))
    axis = axis + len(shape) if axis < 0 else axis
    k = int(np.prod(shape[axis:]))
    rows = int(np.prod(shape[:axis]))
    x = to_layout(ctx, x, identity(len(shape)))
    view = reshape(ctx, x, (rows, k), (0, 1))
    out_name = ctx.current.output[0]
    y = _normalize(ctx, view, [1], k, 1, k, None)
    ctx.set_output(0, reshape(ctx, y, tuple(shape), identity(len(shape)), output_of=out_name))


def channels_last_view(ctx: LoweringContext, x: TTensor) -> tuple[TTensor, tuple[int, ...], tuple[int, ...]]:
    """A rank-2/3/4 tensor with channels at logical axis 1 as an NHWC tensor (N, H, W, C).

    Returns (view, physical shape, layout) to reshape the result back to: rank 4
    stays NHWC; [N, C] becomes [1, N, 1, C]; [N, C, L] becomes [N, L, 1, C] (a
    TRANSPOSE only if both C and L exceed 1).
    """
    logical = x.logical_shape
    if len(logical) == 4:
        x = to_layout(ctx, x, NHWC)
        return x, x.shape, NHWC
    if len(logical) == 2:
        x = to_layout(ctx, x, (0, 1))
        return reshape(ctx, x, (1, logical[0], 1, logical[1]), NHWC), x.shape, (0, 1)
    if len(logical) == 3:
        x = to_layout(ctx, x, (0, 2, 1))
        n, length, c = x.shape
        return reshape(ctx, x, (n, length, 1, c), NHWC), x.shape, (0, 2, 1)
    raise ctx.unsupported(f"rank {len(logical)} is not supported")


def _back(ctx: LoweringContext, y: TTensor, shape: tuple[int, ...], layout: tuple[int, ...], out_name: str) -> TTensor:
    if layout == NHWC:
        return y
    return reshape(ctx, y, shape, layout, output_of=out_name)


@lowers("InstanceNormalization")
def lower_instance_norm(ctx: LoweringContext) -> None:
    """Per image and channel over the spatial axes.

    FP reduces H and W of the NHWC view. INT reduces along the last physical
    axis only (see reduction.axis_last): NCHW order viewed as [N, C, H*W],
    one int8 TRANSPOSE in (and the result stays NCHW until an op needs NHWC).
    """
    x = ctx.tensor(0)
    if len(x.shape) == 2:
        raise ctx.unsupported("InstanceNormalization needs a spatial axis")
    out_name = ctx.current.output[0]
    if ctx.profile == "fp":
        view, shape, layout = channels_last_view(ctx, x)
        _, h, w, c = view.shape
        y = _normalize(ctx, view, [1, 2], h * w, 3, c, out_name if layout == NHWC else None)
        ctx.set_output(0, _back(ctx, y, shape, layout, out_name))
        return
    logical = x.logical_shape
    n, c, spatial = logical[0], logical[1], int(np.prod(logical[2:]))
    x = to_layout(ctx, x, identity(len(logical)))
    view = reshape(ctx, x, (n, c, spatial), (0, 1, 2))
    y = _normalize(ctx, view, [2], spatial, 1, c, None)
    ctx.set_output(0, reshape(ctx, y, tuple(logical), identity(len(logical)), output_of=out_name))


@lowers("BatchNormalization")
def lower_batch_norm(ctx: LoweringContext) -> None:
    """y = a x + b per channel (a = scale / sqrt(var + eps), b = B - mean a)."""
    if any(o for o in ctx.current.output[1:]) or int(ctx.attr("training_mode", 0)):
        raise ctx.unsupported("training-mode BatchNormalization is not supported")
    vals = [ctx.constant(i) for i in range(1, 5)]
    if any(v is None for v in vals):
        raise ctx.unsupported("scale, B, mean and var must be constants")
    scale, bias, mean, var = (v.astype(np.float64).reshape(-1) for v in vals)
    a = scale / np.sqrt(var + float(ctx.attr("epsilon", 1e-5)))
    b = bias - mean * a
    x = ctx.tensor(0)
    out_name = ctx.current.output[0]
    logical = x.logical_shape
    if len(logical) < 2 or logical[1] != a.size:
        raise ctx.unsupported(f"channel axis 1 of {list(logical)} does not match {a.size} BatchNorm channels")
    if ctx.profile == "fp":
        chan = x.perm.index(1)
        shape = _channel_shape(x, chan, a.size)
        y = _fp(ctx, Op.MUL, "Mul", [x, _fconst(ctx, a.reshape(shape), x)])
        ctx.set_output(0, _fp(ctx, Op.ADD, "Add", [y, _fconst(ctx, b.reshape(shape), x)], output_of=out_name))
        return
    view, shape, layout = channels_last_view(ctx, x)
    w = np.where(a < 0, -127, 127).astype(np.int8).reshape(-1, 1, 1, 1)
    w_scale = np.where(a != 0, np.abs(a) / 127.0, 1.0)
    w = np.where(a.reshape(-1, 1, 1, 1) == 0, 0, w).astype(np.int8)
    y = emit_conv(ctx, view, w, w_scale, Bias(b), [0, 0, 0, 0], (1, 1), (1, 1), True,
                  out_name if layout == NHWC else None)
    ctx.set_output(0, _back(ctx, y, shape, layout, out_name))


# ---------------------------------------------------------------------------------------------- RMS, group, Lp, LRN


def _quantized_gamma(gamma: np.ndarray) -> tuple[np.ndarray, float]:
    """Real gamma values (any shape) as GAMMA_BITS integers and one scale."""
    gmax = float(np.max(np.abs(gamma))) or 1.0
    scale = gmax / (2 ** (GAMMA_BITS - 1) - 1)
    return np.round(gamma / scale).astype(np.int64), scale


def _rows_normalize(ctx: LoweringContext, view: TTensor, count: int, eps: float, gamma: np.ndarray, beta: np.ndarray,
                    center: bool, output_of: str | None) -> TTensor:
    """Normalise an identity-layout view along its last axis, then * gamma + beta (arrays shaped like one row
    or broadcastable to the view), FP or INT."""
    last = len(view.shape) - 1
    if ctx.profile == "fp":
        return _fp_normalize(ctx, view, [last], count, eps, gamma, beta, output_of, center=center)
    if view.q is None or view.dtype != np.int8:
        raise ctx.unsupported("the integer normalisation needs an int8 input")
    q, unit = _int_normalized(ctx, view, [last], count, eps, center=center)
    gamma_q, g_scale = _quantized_gamma(gamma)
    return _int_affine(ctx, q, unit, count, gamma_q.reshape(-1), g_scale, beta.reshape(-1), gamma.shape, output_of)


def _trailing_rows(ctx: LoweringContext, axis_default: int) -> tuple[TTensor, tuple[int, ...], int, int]:
    """Input 0 as an identity-layout [rows, K] view over the trailing axes from `axis`; (view, shape, rows, K)."""
    x = ctx.tensor(0)
    shape = x.logical_shape
    axis = int(ctx.attr("axis", axis_default))
    axis = axis + len(shape) if axis < 0 else axis
    k, rows = int(np.prod(shape[axis:])), int(np.prod(shape[:axis]))
    x = to_layout(ctx, x, identity(len(shape)))
    return reshape(ctx, x, (rows, k), (0, 1)), tuple(shape), rows, k


def _row_constant(ctx: LoweringContext, index: int, k: int, default: float) -> np.ndarray:
    """Input `index` (broadcastable to the normalised trailing shape) as a [1, K] row, or `default`."""
    v = ctx.constant(index)
    if v is None:
        return np.full((1, k), default)
    v = np.asarray(v, np.float64)
    x_shape = ctx.tensor(0).logical_shape
    axis = int(ctx.attr("axis", -1))
    axis = axis + len(x_shape) if axis < 0 else axis
    return np.broadcast_to(v, x_shape[axis:]).reshape(1, k).copy()


@lowers("RMSNormalization")
def lower_rms_norm(ctx: LoweringContext) -> None:
    """x / sqrt(mean(x^2) + eps) * scale over the trailing axes from `axis` (the layer norm's form, uncentred)."""
    view, shape, _, k = _trailing_rows(ctx, -1)
    eps = float(ctx.attr("epsilon", 1e-5))
    y = _rows_normalize(ctx, view, k, eps, _row_constant(ctx, 1, k, 1.0), np.zeros((1, k)), False, None)
    ctx.set_output(0, reshape(ctx, y, shape, identity(len(shape)), output_of=ctx.current.output[0]))


@lowers("GroupNormalization")
def lower_group_norm(ctx: LoweringContext) -> None:
    """Per image and group of C / G channels over those channels and the spatial axes: a [N, G, K] view
    normalised along K, then the per-channel (opset 21) or per-group (opset 18) scale and bias."""
    x = ctx.tensor(0)
    shape = x.logical_shape
    groups = int(ctx.attr("num_groups"))
    n, c = shape[0], shape[1]
    if c % groups:
        raise ctx.unsupported(f"{groups} groups do not divide {c} channels")
    spatial = int(np.prod(shape[2:]))
    k = c // groups * spatial
    params = []
    for index, default in ((1, 1.0), (2, 0.0)):
        v = ctx.constant(index)
        v = np.full(c, default) if v is None else np.asarray(v, np.float64).reshape(-1)
        if v.size == groups:
            v = np.repeat(v, c // groups)
        if v.size != c:
            raise ctx.unsupported(f"scale/bias of {v.size} values for {c} channels in {groups} groups")
        params.append(np.repeat(v, spatial).reshape(1, groups, k))  # channel j * S + s of group g
    view = reshape(ctx, to_layout(ctx, x, identity(len(shape))), (n, groups, k), (0, 1, 2))
    y = _rows_normalize(ctx, view, k, float(ctx.attr("epsilon", 1e-5)), params[0], params[1], True, None)
    ctx.set_output(0, reshape(ctx, y, tuple(shape), identity(len(shape)), output_of=ctx.current.output[0]))


@lowers("LpNormalization")
def lower_lp_norm(ctx: LoweringContext) -> None:
    """x / ||x||_p along one axis. p = 2: the RMS normalisation (no epsilon) times 1 / sqrt(K); p = 1 in int8:
    the exact int32 sum of |x - zp|, its Newton-Raphson reciprocal, one product and one RESCALE."""
    p = int(ctx.attr("p", 2))
    if p not in (1, 2):
        raise ctx.unsupported(f"p = {p} (1 and 2 are defined)")
    x = ctx.tensor(0)
    shape = x.logical_shape
    axis = int(ctx.attr("axis", -1))
    axis = axis + len(shape) if axis < 0 else axis
    x = axis_last(ctx, x, [axis])
    k = shape[axis]
    name = ctx.current.output[0]
    last = len(x.shape) - 1
    if p == 2:
        gamma = np.full((1,) * last + (k,), 1.0 / math.sqrt(k))
        y = _rows_normalize(ctx, x, k, 1e-30, gamma, np.zeros_like(gamma), False, None)
    elif ctx.profile == "fp":
        total = emit_reduce(ctx, Op.REDUCE_SUM, _fp_abs(ctx, x), [last])
        r = ctx.new_tensor(total.shape, np.float32, total.perm)
        ctx.op(Op.RECIPROCAL, [total.name], [r.name], attr("Reciprocal"))
        y = _fp(ctx, Op.MUL, "Mul", [x, r])
    else:
        y = _int_l1_normalize(ctx, x)
    ctx.set_output(0, reshape(ctx, y, y.shape, y.perm, output_of=name))


def _fp_abs(ctx: LoweringContext, x: TTensor) -> TTensor:
    out = ctx.new_tensor(x.shape, np.float32, x.perm)
    ctx.op(Op.ABS, [x.name], [out.name], attr("Abs"))
    return out


L1_FRAC_BITS = 14  # x / sum|x| is within [-1, 1]: kept in 2^-14 before the output RESCALE


def _int_l1_normalize(ctx: LoweringContext, x: TTensor) -> TTensor:
    """(x - zp) / max(sum |x - zp|, 1) along the last axis: reciprocal r ~ 2^(61 - n) / a, so
    v * r * 2^-16 * 2^(n - 31) = y 2^14 by one rounding shift per row."""
    out_q = ctx.require_output_q()
    if x.q is None or x.dtype != np.int8:
        raise ctx.unsupported("the integer normalisation needs an int8 input")
    last = len(x.shape) - 1
    v = im.widen(ctx, x)
    a_abs = ctx.new_tensor(v.shape, np.int32, v.perm)
    ctx.op(Op.ABS, [v.name], [a_abs.name], attr("Abs"))
    total = emit_reduce(ctx, Op.REDUCE_SUM, a_abs, [last])
    positive = ctx.new_tensor(total.shape, np.int32, total.perm)
    ctx.op(Op.MAXIMUM, [total.name, im.const_i32(ctx, 1, total).name], [positive.name],
           attr("Maximum", ts.NanPropagationMode.PROPAGATE))
    r, n = im.reciprocal(ctx, positive)
    prod = im.mul(ctx, v, r, 16)
    q = im.asr(ctx, prod, im.sub(ctx, im.const_i32(ctx, 31, n), n))
    return rescale(ctx, q, 2.0**-L1_FRAC_BITS / out_q.s, out_q.dtype, 0, out_q.zp, out_q)


@lowers("LRN")
def lower_lrn(ctx: LoweringContext) -> None:
    """x / (bias + alpha / size * sum of x^2 over a window of channels)^beta, FP only: the window sum is a 1x1
    CONV2D with banded weights; the int8 form (a power of an int32 sum) is left to the host."""
    if ctx.profile == "int":
        raise ctx.unsupported("LRN is lowered in the FP profile only")
    x = to_layout(ctx, ctx.tensor(0), NHWC) if len(ctx.tensor(0).shape) == 4 else None
    if x is None:
        raise ctx.unsupported("LRN needs a 4-D input")
    size = int(ctx.attr("size"))
    alpha, beta, bias = float(ctx.attr("alpha", 1e-4)), float(ctx.attr("beta", 0.75)), float(ctx.attr("bias", 1.0))
    c = x.shape[3]
    lo, hi = (size - 1) // 2, -(-(size - 1) // 2)
    band = np.array([[1.0 if -lo <= i - o <= hi else 0.0 for i in range(c)] for o in range(c)], np.float32)
    sq = _fp(ctx, Op.MUL, "Mul", [x, x])
    window = emit_conv(ctx, sq, (band * (alpha / size)).reshape(c, c, 1, 1), None, Bias(np.full(c, bias)),
                       [0, 0, 0, 0], (1, 1), (1, 1), False, None)
    powered = _fp(ctx, Op.POW, "Pow", [window, _fconst(ctx, np.full((1, 1, 1, 1), -beta), window)])
    ctx.set_output(0, _fp(ctx, Op.MUL, "Mul", [x, powered], output_of=ctx.current.output[0]))
