"""The int8 softmax in the integer ops Vela runs in the fewest full-size NPU passes.

Vela costs every op over the whole tensor (one NPU pass each, ~N/3 cycles
on U55-128) but ops on the per-row sums almost nothing, so this form keeps
the full-size ops to six: REDUCE_MAX; two SUB (x - max as the int8 index
d + 127), each read by one int8 TABLE only, so Vela runs each TABLE as the
LUT activation of its SUB (a standalone TABLE is its own pass plus a LUT
load); one ADD of the two table bytes (hi * 256 + lo, no zero points, so
Vela fuses both widening RESCALEs into it and writes exp in int16); a
REDUCE_SUM; one int16 MUL by the per-row reciprocal (the output scale
folded in); one rounding ARITHMETIC_RIGHT_SHIFT whose int8 output RESCALE
(unit scale, the output zero point) Vela fuses into it. The row ops (CLZ,
Newton-Raphson 1/sum, the shift amount) are the same as before.

exp keeps 15 bits (K = 32639 = 127 * 257 is the largest value whose high
byte still fits int8) and the reciprocal 15, so the result rounds once and
stays within float error of onnxruntime's QDQ softmax.
"""

from __future__ import annotations

import math

import numpy as np

from npubuild.lowering import intmath as im
from npubuild.lowering.context import LoweringContext, TTensor
from npubuild.lowering.emit import Op, rescale
from npubuild.lowering.ops_reduce import emit_reduce
from npubuild.lowering.quant import QParams
from npubuild.lowering.table import emit_table

EXP_ONE = 32639  # exp(0): 256 * 127 + 127, the largest value split into two int8 bytes hi * 256 + lo
RAW_Q = QParams(np.float64(1.0), np.int64(0), np.dtype(np.int8))  # a table byte stored as itself
MAX_SHIFT = 31  # TOSA ARITHMETIC_RIGHT_SHIFT on int32


def exp_bytes(scale: float) -> tuple[np.ndarray, np.ndarray]:
    """hi, lo int8 tables with round(exp(scale * d) * EXP_ONE) == 256 * hi + lo, index i = d + 127, d in [-255, 0]."""
    d = np.arange(-128, 128, dtype=np.float64) - 127
    v = np.round(np.exp(scale * d) * EXP_ONE).astype(np.int64)
    hi = (v + 128) // 256
    return hi.astype(np.int8), (v - 256 * hi).astype(np.int8)


def _index(ctx: LoweringContext, x: TTensor, mx: TTensor) -> TTensor:
    """d + 127 as int8, d = x - max(x) in [-255, 0]: one SUB with its rescales fused by Vela."""
    d = im.sub(ctx, im.widen(ctx, x), im.widen(ctx, mx))
    return im.narrow_exact(ctx, d, 127)


def _exp16(ctx: LoweringContext, x: TTensor, mx: TTensor) -> TTensor:
    """round(exp(s_x (x - max)) * EXP_ONE) as int16: two SUB+LUT passes and one ADD."""
    assert x.q is not None
    hi_t, lo_t = exp_bytes(x.q.s)
    hi = emit_table(ctx, _index(ctx, x, mx), hi_t, RAW_Q)  # separate SUBs: a LUT fuses only into a sole reader
    lo = emit_table(ctx, _index(ctx, x, mx), lo_t, RAW_Q)
    # scaled by 2**19 and 2**11: Vela's U55 ADD takes unequal input scales only when the larger is its fixed 2**19
    e = im.add(ctx, rescale(ctx, hi, 2.0**19, np.int32, 0, 0, None), rescale(ctx, lo, 2.0**11, np.int32, 0, 0, None))
    return rescale(ctx, e, 2.0**-11, np.int16, 0, 0, None)


def reciprocal_plan(n_elements: int, out_scale: float) -> tuple[int, int]:
    """(t, k): r16 = r / 2**t * (1/out_scale) fits int16, and out = e * r16 >> (k - clz(sum)) stays a legal shift.

    1/sum = r * 2**-(61 - n) with r in (2**29, 2**30] and n = clz(sum) in
    [clz(N * EXP_ONE), clz(EXP_ONE)]; out = e * r16 * 2**-(61 - t - n).
    """
    c = 1.0 / out_scale
    t = math.ceil(math.log2(2**30 * c)) - 15
    n_min = 32 - int(n_elements * EXP_ONE).bit_length()
    n_max = 32 - EXP_ONE.bit_length()
    t = max(t, 61 - MAX_SHIFT - n_min)  # very long rows: give up reciprocal bits so the shift stays <= 31
    if 61 - t - n_max < 0:
        raise ValueError(f"output scale {out_scale:g} too fine for the int16 reciprocal")
    return t, 61 - t


def lower_softmax_int(ctx: LoweringContext, x: TTensor, axis: int, out_q: QParams) -> TTensor:
    """int8 softmax over the last physical axis (see the module docstring); returns the int8 output."""
    count = x.shape[axis]
    if count * EXP_ONE >= 2**31:
        raise ctx.unsupported(f"softmax over {count} elements overflows the int32 sum")
    try:
        t, k = reciprocal_plan(count, out_q.s)
    except ValueError as err:
        raise ctx.unsupported(str(err)) from err
    mx = emit_reduce(ctx, Op.REDUCE_MAX, x, [axis])
    e = _exp16(ctx, x, mx)
    total = emit_reduce(ctx, Op.REDUCE_SUM, rescale(ctx, e, 1.0, np.int32, 0, 0, None), [axis])
    r, n = im.reciprocal(ctx, total)  # 1/total = r * 2**-(61 - n)
    r16 = rescale(ctx, r, 2.0**-t / out_q.s, np.int16, 0, 0, None)
    p = im.mul(ctx, e, r16, 0)  # out = p * 2**-(k - n) in output LSBs
    q = im.asr(ctx, p, im.sub(ctx, im.const_i32(ctx, k, n), n))
    return rescale(ctx, q, 1.0, out_q.dtype, 0, out_q.zp, out_q, output_of=ctx.current.output[0])
