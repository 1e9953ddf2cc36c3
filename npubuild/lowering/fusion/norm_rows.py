"""Integer (x - mean) / sqrt(var + eps) along the last axis, shaped so Vela fuses every RESCALE.

Why this shape: Vela 5.2 folds a RESCALE into the op next to it only when that
op can take the scaling (regor graphir_optimiser FuseRescale with the U55/U85
SupportsQuantization rules): unit-scale int8 -> int32 widenings of *both*
inputs fuse into an ADD/SUB/MUL (its inputs must keep one type), any RESCALE
after a REDUCE_SUM fuses into it, and a power-of-two int32 -> int16 RESCALE
fuses into the ADD/SUB that produces it. A gain-K widening, or a RESCALE after
an ARITHMETIC_RIGHT_SHIFT, does not fuse and runs as a pass of its own (16x64
on U85: 2191 and 2944 of the layer norm's 11832 cycles). So, per row of K
int8 values x:

  m0 = round(sum(x) / K), the rounded mean, as an int8 (the REDUCE_SUM's fused output)
  c = x - m0 (one SUB of two int8 tensors, |c| <= 255);  t = sum(c), |t| <= K/2
  V = K sum(c^2) - t^2 = K^2 var / s^2 (exact: the fractional mean t / K is put back here)
  a = 1 / sqrt(V + eps') per row (seed TABLE + one Newton step)
  n = (K c - t) a = c (K a) - t a: one MUL by a per-row int32 and one SUB of a
      per-row int32, rounded to int16 by the SUB's fused shift.

Full-size passes: three reductions, SUB, MUL, MUL, SUB; the rest is per row
(each per-row op still costs a U55 ~300 cycles, hence the short rsqrt).
"""

from __future__ import annotations

import math

import numpy as np

from npubuild.lowering import intmath as im
from npubuild.lowering.context import LoweringContext, TTensor
from npubuild.lowering.emit import Op, rescale
from npubuild.lowering.quant import QParams
from npubuild.lowering.reduction import emit_reduce, stats_as_channels, stats_back
from npubuild.lowering.table import emit_table

SEED_Q = QParams(np.float64(2.0**-7), np.int64(-128), np.dtype(np.int8))  # seed w = q + 128, 1/sqrt(m) ~ w / 128
A0_MAX = 2.0**30.5 * 1.001  # bound of rsqrt_rows' a (y' < 2^15 sqrt(2) shifted left by at most 15)


def _as_i32(ctx: LoweringContext, t: TTensor) -> TTensor:
    """int8 -> int32 unchanged (zero points 0): Vela fuses it into the consumer when the other input is one too."""
    return rescale(ctx, t, 1.0, np.int32, 0, 0, None)


def variance_shift(count: int) -> int:
    """Even right shift that keeps K sum(c^2) <= 65025 K^2 within 2^30."""
    sh = max(0, math.ceil(math.log2(65025.0 * count * count)) - 30)
    return sh + (sh & 1)


def fraction_bits(count: int, frac: int) -> tuple[int, int, int]:
    """(frac, e, a_sh): the int16 result's fraction bits (lowered if int32 cannot hold them), the extra
    bits kept before its rounding, and the shift that keeps K a within int32."""
    sh = variance_shift(count)
    a_sh = max(0, math.ceil(math.log2(count * A0_MAX)) - 31)
    frac = min(frac, 29 + sh // 2 - a_sh)  # the per-element MUL needs a right shift of at least 1
    e = max(0, min(30 - math.ceil(math.log2(math.sqrt(count))) - frac, 29 + sh // 2 - a_sh - frac))
    return frac, e, a_sh


def seed_table() -> np.ndarray:
    """round(128 / sqrt(m)) - 128 for the mantissa bucket m = (i + 128) / 128 of each index i (m in [0.5, 2))."""
    m = np.clip((np.arange(-128, 128) + 128) / 128.0, 0.5, 2.0)
    return np.clip(np.round(128.0 / np.sqrt(m)) - 128, -128, 127).astype(np.int8)


def _w_for_product(ctx: LoweringContext, seed: TTensor, w: TTensor) -> TTensor:
    """The widened seed as an operand next to an int32 one. U55/U65 run a lone int8 -> int32 RESCALE as two
    ops, w + 0 with both int8 operands widened as one ADD; on U85 the RESCALE is cheaper (and needs no
    constant)."""
    if not ctx.options.norm_widen_add:
        return w
    zero = TTensor(ctx.const(np.zeros((1,) * len(seed.shape), np.int8), "zero"), (1,) * len(seed.shape),
                   np.dtype(np.int8), seed.perm)
    return im.add(ctx, w, _as_i32(ctx, zero))


def rsqrt_rows(ctx: LoweringContext, v: TTensor) -> TTensor:
    """a with 1/sqrt(v) ~= a * 2**-30, for int32 v >= 1 (relative error within -8e-5..+2e-5).

    v = m 2^(30 - 2h) with m in [2^29, 2^31); an int8 TABLE on m's top bits
    gives w ~ 128 / sqrt(m) within 0.64%, and one Newton step y = w (3 - r) / 2,
    r = m w^2, brings that to 8e-5 (all m evaluated). Measured, the layer norm's output
    is as close to onnxruntime's as with a third-order step (four per-row ops
    more, 960 U55 cycles) or two Newton steps; the seed's widening fuses into
    the w^2 MUL.
    """
    n = im.clz(ctx, v)
    h = im.asr_const(ctx, im.sub_const(ctx, n, 2), 1)  # floor((n - 1) / 2)
    m = im.shl(ctx, v, im.add(ctx, h, h))  # Q30, in [2^29, 2^31)
    if ctx.options.norm_index_rescale:  # round(m / 2^23) - 128 as one RESCALE: one op less on U55/U65, 450 cycles more on U85
        index = rescale(ctx, m, 2.0**-23, np.int8, 0, -128, None)
    else:
        index = im.narrow_exact(ctx, im.sub(ctx, im.asr(ctx, m, im.const_i32(ctx, 23, m)), im.const_i32(ctx, 128, m)), 0)
    seed = emit_table(ctx, index, seed_table(), SEED_Q)

    def w() -> TTensor:  # one widening per reader, so Vela can fuse each into its reader
        return rescale(ctx, seed, 1.0, np.int32, -128, 0, None)

    r = im.mul(ctx, m, im.mul(ctx, w(), w(), 0), 16)  # r 2^28 (m w^2 = r 2^44)
    step = im.sub(ctx, im.const_i32(ctx, 3 << 28, r), r)  # (3 - r) 2^28
    y = im.mul(ctx, _w_for_product(ctx, seed, w()), step, 21)  # 2^15 / sqrt(m), >= 2^14.5
    return im.shl(ctx, y, h)


def normalized_int16(ctx: LoweringContext, x: TTensor, count: int, eps: float, frac: int) -> TTensor:
    """round((x - mean) / sqrt(var + eps) * 2**frac) as int16 (saturating), x int8 reduced along its last axis.

    `frac` must come from `fraction_bits` (the caller scales the result with it).
    """
    d, e = normalized_int32(ctx, x, count, eps, frac)
    return rescale(ctx, d, 2.0**-e, np.int16, 0, 0, None)


GAIN_BITS = 15  # the mantissa of normalized_int32's gain, as a per-row multiplier of the reciprocal root


def normalized_int32(ctx: LoweringContext, x: TTensor, count: int, eps: float, frac: int,
                     gain: float | None = None) -> tuple[TTensor, int]:
    """(d, e): normalized_int16's value before its last rounding, (x - mean) / sqrt(var + eps) = d 2**-(frac + e),
    d in int32. With `gain`, (x - mean) / sqrt(var + eps) * gain = d 2**-e instead: the gain's GAIN_BITS mantissa
    is multiplied into the per-row root and its exponent goes into e, so only a power-of-two RESCALE follows the
    full-size SUB (Vela fuses that one into it; a general RESCALE is a pass of its own)."""
    assert x.q is not None and x.dtype == np.int8
    axis = len(x.shape) - 1
    s_rows = emit_reduce(ctx, Op.REDUCE_SUM, _as_i32(ctx, x), [axis])
    sh = variance_shift(count)
    if sh == 0 and ctx.options.norm_raw_squares:
        # K sum(x^2) - s^2 == K sum(c^2) - t^2 and t == s - K m0: the same integers from int8 squares (a cheaper
        # MUL) and no REDUCE_SUM of c; K sum(x^2) <= K^2 2^14 fits int32 while sh == 0 (K <= 128)
        sq_rows = emit_reduce(ctx, Op.REDUCE_SUM, im.mul(ctx, _as_i32(ctx, x), _as_i32(ctx, x), 0), [axis])
        s, sq = stats_as_channels(ctx, s_rows, sq_rows)
        m0_stat = rescale(ctx, s, 1.0 / count, np.int8, 0, 0, None)  # round(mean of x), within int8 as x is
        (m0,) = stats_back(ctx, s_rows, m0_stat)
        c = im.sub(ctx, _as_i32(ctx, x), _as_i32(ctx, m0))
        t = im.sub(ctx, s, rescale(ctx, m0_stat, float(count), np.int32, 0, 0, None))
        var = im.sub(ctx, rescale(ctx, sq, float(count), np.int32, 0, 0, None), im.mul(ctx, s, s, 0))
        t_rows = s_rows
    else:
        m0 = rescale(ctx, s_rows, 1.0 / count, np.int8, 0, 0, None)  # round(mean of x), within int8 as x is
        c = im.sub(ctx, _as_i32(ctx, x), _as_i32(ctx, m0))
        t_rows = emit_reduce(ctx, Op.REDUCE_SUM, c, [axis])
        t, sq = stats_as_channels(ctx, t_rows, emit_reduce(ctx, Op.REDUCE_SUM, im.mul(ctx, c, c, 0), [axis]))
        ksq = rescale(ctx, sq, count / 2.0**sh, np.int32, 0, 0, None)  # exact for sh = 0; fused into the REDUCE_SUM
        var = im.sub(ctx, ksq, im.mul(ctx, t, t, sh))
    # var = K^2 sum((v - mean)^2) / (K 2^sh) in x's LSB^2; eps in the same units. With sh > 0 the two
    # roundings can leave var at -1, so eps' >= 2 keeps the rsqrt's input positive.
    s2 = float(x.q.s) ** 2
    eps_units = int(min(max(2 if sh else 1, round(eps * count * count / (s2 * 2**sh))), (1 << 30) - 1))
    a0 = rsqrt_rows(ctx, im.add(ctx, var, im.const_i32(ctx, eps_units, var)))  # 1/sqrt(V + eps') = a0 2^-30
    frac, e, a_sh = fraction_bits(count, frac)
    sp = 30 + sh // 2 - a_sh - frac - e
    if gain is not None:  # gain 2^-(frac + e) = f 2^-m with f in [0.5, 1): a0 f keeps a0's bound
        m = -math.floor(math.log2(gain * 2.0 ** -(frac + e))) - 1
        f = round(gain * 2.0 ** (m - frac - e + GAIN_BITS))
        a0 = im.mul(ctx, a0, im.const_i32(ctx, f, a0), GAIN_BITS)
        e = m
    a = im.mul(ctx, a0, im.const_i32(ctx, count, a0), a_sh)
    b = im.mul(ctx, t, a0, a_sh + sp)
    a, b = stats_back(ctx, t_rows, a, b)
    p = im.mul(ctx, c, a, sp)
    return im.sub(ctx, p, b), e  # n 2^(frac + e)
