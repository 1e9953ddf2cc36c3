"""The int8 softmax in the integer ops Vela runs in the fewest and cheapest NPU passes.

Vela runs every TOSA op over the whole tensor as one NPU pass, but ops on
per-row values cost almost nothing, so the full-size work is kept to:

- the row max as a tree of MAXIMUMs over the two (overlapping) halves of the
  row: one pass on half the data per level, the int8 <-> int32 RESCALEs fused
  (REDUCE_MAX over channels is 3-4x slower on U55 and U85, a TRANSPOSE +
  MAX_POOL2D over the rows like Vela's own softmax 1.1-1.4x slower on U85);
- two SUB (x - max as the int8 index d + 127), each read by one int8 TABLE
  only, so Vela runs each TABLE as the LUT activation of its SUB (a
  standalone TABLE is its own pass plus a LUT load);
- one ADD of the two exp bytes (hi * 256 + lo): scaled by 2**19 and 2**11,
  the only unequal input scales Vela's U55 ADD takes, its RESCALEs fuse;
- REDUCE_SUM, with the output scale folded into its fused RESCALE;
- one MUL by the per-row Newton-Raphson reciprocal and one rounding
  ARITHMETIC_RIGHT_SHIFT into which Vela fuses the int8 output RESCALE.

exp keeps 15 bits (EXP_ONE = 32639 is the largest value whose high byte
still fits int8) and the reciprocal 15, so the result rounds once and stays
within float error of onnxruntime's QDQ softmax.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import tosa_serializer as ts

from npubuild.lowering import intmath as im
from npubuild.lowering.context import LoweringContext, TTensor
from npubuild.lowering.emit import Op, attr, rescale
from npubuild.lowering.quant import QParams, multiplier_shift
from npubuild.lowering.reduction import emit_reduce, stats_as_channels, stats_back
from npubuild.lowering.table import KNOT_STEP, build_table16, emit_table

EXP_ONE = 32639  # exp(0): 256 * 127 + 127, the largest value split into two int8 bytes hi * 256 + lo
RAW_Q = QParams(np.float64(1.0), np.int64(0), np.dtype(np.int8))  # a table byte stored as itself
MAX_SHIFT = 31  # TOSA ARITHMETIC_RIGHT_SHIFT on int32


def exp_bytes(scale: float) -> tuple[np.ndarray, np.ndarray]:
    """hi, lo int8 tables with round(exp(scale * d) * EXP_ONE) == 256 * hi + lo, index i = d + 127, d in [-255, 0]."""
    d = np.arange(-128, 128, dtype=np.float64) - 127
    v = np.round(np.exp(scale * d) * EXP_ONE).astype(np.int64)
    hi = (v + 128) // 256
    return hi.astype(np.int8), (v - 256 * hi).astype(np.int8)


@dataclass(frozen=True)
class Plan:
    """Fixed-point exponents of one softmax: sum' = sum * 2**a * s_out, r = 2**(61 - n) / sum' (n = clz(sum')),
    r >> t the int16 (or, with t = 15, the rounded int32 product's) reciprocal, out = e * (r >> t) >> (k - n); no
    row's n is above n_high."""

    a: int
    t: int
    k: int
    n_high: int


def reciprocal_plan(n_elements: int, out_scale: float, exp_one: int = EXP_ONE) -> Plan:
    """The widest sum' that fits int32 for n_elements rows of exp <= exp_one, and a legal final shift.

    Folding the output scale into sum' costs nothing (Vela fuses the RESCALE
    into REDUCE_SUM) and leaves no constant multiply on the reciprocal. The product e * r >> t must fit
    int32 (r < 2**30): t is at least the bits of exp_one.
    """
    a = math.floor(math.log2(2**31 / (n_elements * exp_one * out_scale))) - 1
    # TOSA's RESCALE needs |value| < 2**(shift - 1): a large scale has a short shift
    while multiplier_shift(2.0**a * out_scale, 32)[1][0] <= (n_elements * exp_one).bit_length():
        a -= 1
    n_min = 32 - int(n_elements * exp_one * out_scale * 2.0**a).bit_length()
    n_max = 32 - max(int(exp_one * out_scale * 2.0**a), 1).bit_length()
    t = max(int(exp_one).bit_length(), 61 - MAX_SHIFT - a - n_min)  # very long rows: fewer reciprocal bits
    k = 61 - t - a
    if k - n_max < 0 or exp_one * out_scale * 2.0**a < 2**12:
        raise ValueError(f"output scale {out_scale:g} out of the integer softmax's range")
    return Plan(a, t, k, n_max)


def _channels(ctx: LoweringContext, x: TTensor, start: int, size: int) -> TTensor:
    """SLICE [start, start + size) of the last axis (Vela reads it in place)."""
    shape = (*x.shape[:-1], size)
    out = ctx.new_tensor(shape, x.dtype, x.perm, x.q)
    begin = [0] * (len(shape) - 1) + [start]
    ctx.op(Op.SLICE, [x.name, ctx.shape_const(begin), ctx.shape_const(list(shape))], [out.name], attr("Slice"))
    return out


def row_max(ctx: LoweringContext, x: TTensor) -> TTensor:
    """max over the last axis, kept as size 1: MAXIMUM of the two halves (overlapping by one if odd) until one is left.

    Vela 5.2 cycles, tree / REDUCE_MAX: [4, 16, 16] U55-128 ~1060 / 4295; the
    example transformer's softmax on U85-256 5826 / 6101 with a TRANSPOSE +
    MAX_POOL2D max; [4, 1000] U55 32191 / 50228, U85 12666 / 31419 (whole
    softmax).
    """
    assert x.q is not None
    while x.shape[-1] > 1:
        c = x.shape[-1]
        half = (c + 1) // 2
        lo, hi = _channels(ctx, x, 0, half), _channels(ctx, x, c - half, half)
        m = ctx.new_tensor((*x.shape[:-1], half), np.int32, x.perm)
        ctx.op(Op.MAXIMUM, [im.widen(ctx, lo).name, im.widen(ctx, hi).name], [m.name],
               attr("Maximum", ts.NanPropagationMode.PROPAGATE))
        x = rescale(ctx, m, 1.0, x.dtype, 0, x.q.zp, x.q)
    return x


def _index(ctx: LoweringContext, x: TTensor, mx: TTensor) -> TTensor:
    """d + 127 as int8, d = x - max(x) in [-255, 0]: one SUB with its rescales fused by Vela."""
    d = im.sub(ctx, im.widen(ctx, x), im.widen(ctx, mx))
    return im.narrow_exact(ctx, d, 127)


def _exp(ctx: LoweringContext, x: TTensor, mx: TTensor, dtype: type) -> TTensor:
    """round(exp(s_x (x - max)) * EXP_ONE) as int16 or int32: two SUB+LUT passes and one ADD."""
    assert x.q is not None
    hi_t, lo_t = exp_bytes(x.q.s)
    hi = emit_table(ctx, _index(ctx, x, mx), hi_t, RAW_Q)  # separate SUBs: a LUT fuses only into a sole reader
    lo = emit_table(ctx, _index(ctx, x, mx), lo_t, RAW_Q)
    # scaled by 2**19 and 2**11: Vela's U55 ADD takes unequal input scales only when the larger is its fixed 2**19
    e = im.add(ctx, rescale(ctx, hi, 2.0**19, np.int32, 0, 0, None), rescale(ctx, lo, 2.0**11, np.int32, 0, 0, None))
    return rescale(ctx, e, 2.0**-11, dtype, 0, 0, None)


def lower_softmax_int(ctx: LoweringContext, x: TTensor, axis: int, out_q: QParams) -> TTensor:
    """int8 softmax over the last physical axis (see the module docstring); returns the int8 output."""
    count = x.shape[axis]
    if x.dtype == np.int16 or out_q.dtype == np.int16:
        return lower_softmax_int16(ctx, x, count, out_q)
    if count * EXP_ONE >= 2**31:
        raise ctx.unsupported(f"softmax over {count} elements overflows the int32 sum")
    try:
        plan = reciprocal_plan(count, out_q.s)
    except ValueError as err:
        raise ctx.unsupported(str(err)) from err
    return _normalise(ctx, x, row_max(ctx, x), plan, out_q, ctx.current.output[0])


def _normalise(ctx: LoweringContext, x: TTensor, mx: TTensor, plan: Plan, out_q: QParams,
               output_of: str | None) -> TTensor:
    """exp(x - max) / sum in the output's int8 quantisation."""
    # U85-256, Vela 5.2, whole softmax: int32 for [1, 10] 590 -> 525 cycles, [16, 16] 4198 -> 3665, [4, 32]
    # 1201 -> 1065, but [4, 16, 16] 6812 -> 7028, [1, 64] 649 -> 746, [2, 100] 1285 -> 1624 (int32 MUL costs more)
    wide = ctx.options.softmax_row_is_wide(x.shape)
    if not wide and ctx.options.softmax_shift_mul:
        return _divide_shift_mul(ctx, _exp(ctx, x, mx, np.int16), plan, out_q, output_of)
    e = _exp(ctx, x, mx, np.int32 if wide else np.int16)
    return _divide(ctx, e, plan, out_q, output_of, wide)


def _reciprocal_rows(ctx: LoweringContext, e: TTensor, plan: Plan, out_q: QParams) -> tuple[TTensor, TTensor, TTensor]:
    """(rows, r, n): the row sums of e scaled to sum' ([..., 1]), and 1/sum' = r 2**-(61 - n) on stats_as_channels'
    view of them."""
    total = emit_reduce(ctx, Op.REDUCE_SUM, e if e.dtype == np.int32 else rescale(ctx, e, 1.0, np.int32, 0, 0, None),
                        [len(e.shape) - 1])
    rows = rescale(ctx, total, 2.0**plan.a * out_q.s, np.int32, 0, 0, None)
    (total,) = stats_as_channels(ctx, rows)
    r, n = im.reciprocal(ctx, total)
    return rows, r, n


def _divide_shift_mul(ctx: LoweringContext, e: TTensor, plan: Plan, out_q: QParams, output_of: str | None) -> TTensor:
    """_divide's int16 form without its full-size ARITHMETIC_RIGHT_SHIFT (LoweringOptions.softmax_shift_mul): one
    int16 MUL by a per-row int16 reciprocal, rounded to the output by the MUL's own fused RESCALE (a constant shift).

    _divide rounds e * (r >> t) by a per-row k - n bits. Here that per-row part goes into the reciprocal,
    R = round(r / 2**(t + n_high - n)), and out = round(e R / 2**(k - n_high)). A row with a larger sum keeps fewer
    bits of R (as many fewer as its sum is larger than one exp(0)), so the product moves by up to
    EXP_ONE / 2**(k - n_high + 1) of an output step (1/128 on the example transformer's rows of 16): the result is
    _divide's but near a rounding tie, where it is 1 LSB apart (not bit for bit: exact_only leaves it out)."""
    rows, r, n = _reciprocal_rows(ctx, e, plan, out_q)
    shifted = im.asr(ctx, r, im.sub(ctx, im.const_i32(ctx, plan.t + plan.n_high, n), n))
    (r16,) = stats_back(ctx, rows, rescale(ctx, shifted, 1.0, np.int16, 0, 0, None))  # 2**15 saturates, as _divide's
    p = ctx.new_tensor(e.shape, np.int32, e.perm)
    ctx.op(Op.MUL, [e.name, r16.name, ctx.const(np.zeros([1], np.int8), "shift")], [p.name], attr("Mul"))
    return rescale(ctx, p, 2.0 ** -(plan.k - plan.n_high), out_q.dtype, 0, out_q.zp, out_q, output_of=output_of)


def _divide(ctx: LoweringContext, e: TTensor, plan: Plan, out_q: QParams, output_of: str | None,
            wide: bool) -> TTensor:
    """e / sum(e) over the last axis in the output's quantisation (e int16, or int32 when `wide`)."""
    rows, r, n = _reciprocal_rows(ctx, e, plan, out_q)  # 1/total = r * 2**-(61 - n)
    (r,) = stats_back(ctx, rows, r)
    if not wide:  # U85's int32 -> int16 RESCALE costs ~150 cycles, more than a short int32 MUL
        r = rescale(ctx, r, 2.0**-plan.t, np.int16, 0, 0, None)
    p = im.mul(ctx, e, r, plan.t if wide else 0)
    q = im.asr(ctx, p, *stats_back(ctx, rows, im.sub(ctx, im.const_i32(ctx, plan.k, n), n)))  # p * 2**-(k - n)
    return rescale(ctx, q, 1.0, out_q.dtype, 0, out_q.zp, out_q, output_of=output_of)


EXP16_SPAN = math.log(2 * 32767)  # exp(-d) below half an LSB of a [0, 1] int16 output: d past it is 0


def _exp16(ctx: LoweringContext, x: TTensor, mx: TTensor) -> tuple[TTensor, int]:
    """exp(s_x (x - max)) as int32 in units of 1/E (returned; E ~ 2**22): x - max spread over the whole int16 range
    of an interpolating int16 TABLE (saturating where exp is below half an output LSB), whose int32 result keeps
    the 7 bits of its interpolation."""
    assert x.q is not None
    d = im.sub(ctx, im.widen(ctx, x), im.widen(ctx, mx))  # <= 0
    span = min(65535 * x.q.s, EXP16_SPAN)
    idx_q = QParams(np.float64(span / 65535), np.int64(32767), np.dtype(np.int16))  # code 32767 is d = 0
    t = im.add(ctx, rescale(ctx, d, x.q.s / idx_q.s, np.int32, 0, 0, None), im.const_i32(ctx, 32767, d))
    idx = rescale(ctx, t, 1.0, np.int16, 0, 0, None)  # saturates at -32768: exp(-span) there
    table, t_scale = build_table16(np.exp, idx_q)
    e = ctx.new_tensor(idx.shape, np.int32, idx.perm)
    ctx.op(Op.TABLE, [idx.name, ctx.const(table, "table")], [e.name], attr("Table"))
    return e, int(round(KNOT_STEP / t_scale))


def lower_softmax_int16(ctx: LoweringContext, x: TTensor, count: int, out_q: QParams) -> TTensor:
    """Softmax with an int16 input or output (16x8): the int16 exp table (_exp16), its int32 row sums and the
    int8 softmax's reciprocal and product, rounding once to the output."""
    e, exp_one = _exp16(ctx, x, row_max(ctx, x))
    if count * exp_one >= 2**31:
        raise ctx.unsupported(f"softmax over {count} elements overflows the int32 sum")
    try:
        plan = reciprocal_plan(count, out_q.s, exp_one)
    except ValueError as err:
        raise ctx.unsupported(str(err)) from err
    return _divide(ctx, e, plan, out_q, ctx.current.output[0], wide=True)


LOG_FRAC_BITS = 12  # log softmax: int32 values in 2**-12 output LSBs, so the output RESCALE is a shift Vela fuses


def ln_mantissa_table() -> tuple[np.ndarray, QParams]:
    """ln(m) at the midpoint of each of 256 mantissa bins m in [0.5, 1), as int8 with its QParams."""
    m = (np.arange(-128, 128, dtype=np.float64) + 384.5) / 512
    q = QParams(np.float64(np.log(2) / 255), np.int64(127), np.dtype(np.int8))
    return q.quantize(np.log(m)), q


def _ln_sum(ctx: LoweringContext, total: TTensor, unit: float) -> TTensor:
    """ln(total / EXP_ONE) per row in int32 units of `unit`: total = m 2**(32 - n), m in [0.5, 1), ln m by TABLE."""
    n = im.clz(ctx, total)
    m = im.shl(ctx, total, im.sub(ctx, n, im.const_i32(ctx, 1, n)))
    idx = im.narrow_exact(ctx, im.sub(ctx, im.asr(ctx, m, im.const_i32(ctx, 22, m)), im.const_i32(ctx, 384, m)), 0)
    table, tq = ln_mantissa_table()
    ln_m = rescale(ctx, emit_table(ctx, idx, table, tq), tq.s / unit, np.int32, tq.zp, 0, None)
    ln2 = np.log(2) / unit
    rest = im.add(ctx, ln_m, im.const_i32(ctx, round(32 * ln2 - np.log(EXP_ONE) / unit), ln_m))
    return im.sub(ctx, rest, im.mul(ctx, n, im.const_i32(ctx, round(ln2), n), 0))


def lower_log_softmax_int(ctx: LoweringContext, x: TTensor, axis: int, out_q: QParams) -> TTensor:
    """int8 log softmax over the last physical axis: s_x (x - max) - ln(sum exp), one rounding at the end.

    The exp and its sum are the softmax's (tree max, SUB+LUT pairs, one ADD);
    ln(sum) is per row, so the full-size tail is one SUB for x - max, its
    RESCALE to 2**-12 output LSBs, and one SUB whose shift to int8 Vela fuses.
    """
    assert x.q is not None
    count = x.shape[axis]
    unit = out_q.s * 2.0**-LOG_FRAC_BITS
    if count * EXP_ONE >= 2**31 or 256 * x.q.s / unit >= 2**30 or 40 * np.log(2) / unit >= 2**30:
        raise ctx.unsupported(f"log softmax over {count} elements with these scales overflows int32")
    mx = row_max(ctx, x)
    e = _exp(ctx, x, mx, np.int16)
    total = emit_reduce(ctx, Op.REDUCE_SUM, rescale(ctx, e, 1.0, np.int32, 0, 0, None), [axis])
    a = rescale(ctx, im.sub(ctx, im.widen(ctx, x), im.widen(ctx, mx)), x.q.s / unit, np.int32, 0, 0, None)
    y = im.sub(ctx, a, _ln_sum(ctx, total, unit))
    return rescale(ctx, y, 2.0**-LOG_FRAC_BITS, out_q.dtype, 0, out_q.zp, out_q, output_of=ctx.current.output[0])


def log_sum_exp_int(ctx: LoweringContext, x: TTensor, out_q: QParams, output_of: str | None) -> TTensor:
    """int8 log(sum(exp(x))) over the last physical axis (kept as size 1): s_x (max - zp) + ln(sum exp(x - max)),
    the log softmax's pieces (tree max, SUB+LUT exp, REDUCE_SUM, CLZ + TABLE ln) and one rounding at the end."""
    assert x.q is not None
    count = x.shape[-1]
    unit = out_q.s * 2.0**-LOG_FRAC_BITS
    if count * EXP_ONE >= 2**31 or 256 * x.q.s / unit >= 2**30 or 40 * np.log(2) / unit >= 2**30:
        raise ctx.unsupported(f"log-sum-exp over {count} elements with these scales overflows int32")
    mx = row_max(ctx, x)
    e = _exp(ctx, x, mx, np.int16)
    total = emit_reduce(ctx, Op.REDUCE_SUM, rescale(ctx, e, 1.0, np.int32, 0, 0, None), [len(x.shape) - 1])
    top = rescale(ctx, mx, x.q.s / unit, np.int32, x.q.zp, 0, None)
    y = im.add(ctx, top, _ln_sum(ctx, total, unit))
    return rescale(ctx, y, 2.0**-LOG_FRAC_BITS, out_q.dtype, 0, out_q.zp, out_q, output_of=output_of)


def ln_int32(ctx: LoweringContext, total: TTensor, unit: float) -> TTensor:
    """ln(total) of a positive int32 tensor, in int32 units of `unit` (CLZ, and a TABLE on the mantissa)."""
    if 40 * np.log(2) / unit >= 2**30:
        raise ctx.unsupported("the logarithm's output scale is too fine for int32")
    return im.add(ctx, _ln_sum(ctx, total, unit), im.const_i32(ctx, round(np.log(EXP_ONE) / unit), total))
