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
from dataclasses import dataclass

import numpy as np
import tosa_serializer as ts

from npubuild.lowering import intmath as im
from npubuild.lowering.context import LoweringContext, TTensor, identity
from npubuild.lowering.emit import Op, attr, rescale, reshape
from npubuild.lowering.ops_reduce import emit_reduce
from npubuild.lowering.quant import QParams, multiplier_shift
from npubuild.lowering.table import emit_table

EXP_ONE = 32639  # exp(0): 256 * 127 + 127, the largest value split into two int8 bytes hi * 256 + lo
RAW_Q = QParams(np.float64(1.0), np.int64(0), np.dtype(np.int8))  # a table byte stored as itself
MAX_SHIFT = 31  # TOSA ARITHMETIC_RIGHT_SHIFT on int32
POOL_WIDTHS = (32, 16, 8)  # U85: rows as the channels of a MAX_POOL2D, this many at a time (see _row_max)
POOL_MAX_KERNEL = 256  # Vela's pooling kernel height limit
U85_WIDE_ROW, U85_WIDE_MAX = 32, 512  # U85, rows up to 32 long, 512 elements: int32 exp and MUL (_normalise)


def exp_bytes(scale: float) -> tuple[np.ndarray, np.ndarray]:
    """hi, lo int8 tables with round(exp(scale * d) * EXP_ONE) == 256 * hi + lo, index i = d + 127, d in [-255, 0]."""
    d = np.arange(-128, 128, dtype=np.float64) - 127
    v = np.round(np.exp(scale * d) * EXP_ONE).astype(np.int64)
    hi = (v + 128) // 256
    return hi.astype(np.int8), (v - 256 * hi).astype(np.int8)


def pool_view(family: str | None, shape: tuple[int, ...]) -> tuple[int, int, int, int] | None:
    """On U85, the [1, rows / W, W, count] view whose max runs as TRANSPOSE + MAX_POOL2D; None: REDUCE_MAX.

    U85 runs REDUCE_MAX over channels slowly (5276 cycles for 64 rows of 16
    in the example transformer). Moved by one int8 TRANSPOSE to [1, count,
    rows / W, W], a MAX_POOL2D down the softmax axis takes 881 (Vela's own
    softmax does the same). Measured on U85-256 for 16..128 rows of 16 and
    32: W in {32, 16, 8} with at least two rows of W is within 2% of the best
    view (one row of W is 2-3x slower). U55 has no fast transpose, and a few
    rows gain nothing: REDUCE_MAX there.
    """
    rows, count = int(np.prod(shape[:-1])), shape[-1]
    w = next((w for w in POOL_WIDTHS if rows % w == 0 and rows >= 2 * w), None)
    if family != "u85" or w is None or count > POOL_MAX_KERNEL:
        return None
    return (1, rows // w, w, count)


def _pooled_max(ctx: LoweringContext, x: TTensor) -> TTensor:
    """max over the last axis of a [1, H, W, C] view: TRANSPOSE to [1, C, H, W], MAX_POOL2D with a [C, 1] kernel."""
    _, h, w, c = x.shape
    cols = ctx.new_tensor((1, c, h, w), x.dtype, identity(4), x.q)
    ctx.op(Op.TRANSPOSE, [x.name], [cols.name], attr("Transpose", [0, 3, 1, 2]))
    pooled = ctx.new_tensor((1, 1, h, w), x.dtype, identity(4), x.q)
    ctx.op(Op.MAX_POOL2D, [cols.name], [pooled.name],
           attr("MaxPool2d", [c, 1], [1, 1], [0, 0, 0, 0], ts.NanPropagationMode.PROPAGATE))
    return reshape(ctx, pooled, (1, h, w, 1), identity(4))


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


@dataclass(frozen=True)
class Plan:
    """Fixed-point exponents of one softmax: sum' = sum * 2**a * s_out, r = 2**(61 - n) / sum' (n = clz(sum')),
    r >> t the int16 (or, with t = 15, the rounded int32 product's) reciprocal, out = e * (r >> t) >> (k - n)."""

    a: int
    t: int
    k: int


def reciprocal_plan(n_elements: int, out_scale: float) -> Plan:
    """The widest sum' that fits int32 for n_elements rows of exp <= EXP_ONE, and a legal final shift.

    Folding the output scale into sum' costs nothing (Vela fuses the RESCALE
    into REDUCE_SUM) and leaves no constant multiply on the reciprocal.
    """
    a = math.floor(math.log2(2**31 / (n_elements * EXP_ONE * out_scale))) - 1
    # TOSA's RESCALE needs |value| < 2**(shift - 1): a large scale has a short shift
    while multiplier_shift(2.0**a * out_scale, 32)[1][0] <= (n_elements * EXP_ONE).bit_length():
        a -= 1
    n_min = 32 - int(n_elements * EXP_ONE * out_scale * 2.0**a).bit_length()
    n_max = 32 - max(int(EXP_ONE * out_scale * 2.0**a), 1).bit_length()
    t = max(15, 61 - MAX_SHIFT - a - n_min)  # very long rows: give up reciprocal bits so the shift stays <= 31
    k = 61 - t - a
    if k - n_max < 0 or EXP_ONE * out_scale * 2.0**a < 2**12:
        raise ValueError(f"output scale {out_scale:g} out of the integer softmax's range")
    return Plan(a, t, k)


def lower_softmax_int(ctx: LoweringContext, x: TTensor, axis: int, out_q: QParams) -> TTensor:
    """int8 softmax over the last physical axis (see the module docstring); returns the int8 output."""
    count = x.shape[axis]
    if count * EXP_ONE >= 2**31:
        raise ctx.unsupported(f"softmax over {count} elements overflows the int32 sum")
    try:
        plan = reciprocal_plan(count, out_q.s)
    except ValueError as err:
        raise ctx.unsupported(str(err)) from err
    out_name = ctx.current.output[0]
    view = pool_view(ctx.family, x.shape)
    if view is None:
        mx = emit_reduce(ctx, Op.REDUCE_MAX, x, [axis])
        return _normalise(ctx, x, mx, plan, out_q, out_name)
    # every reader of x takes the view: Vela copies a tensor reshaped for one of several readers
    x4 = reshape(ctx, x, view, identity(4))
    y = _normalise(ctx, x4, _pooled_max(ctx, x4), plan, out_q, None)
    return reshape(ctx, y, x.shape, x.perm, output_of=out_name)


def _normalise(ctx: LoweringContext, x: TTensor, mx: TTensor, plan: Plan, out_q: QParams,
               output_of: str | None) -> TTensor:
    """exp(x - max) / sum in the output's int8 quantisation."""
    # U85-256, Vela 5.2: int32 for [1, 10] 1375 -> 1318 cycles, [16, 16] 5498 -> 5093, [4, 32] 2544 -> 2440,
    # but [64, 16] 6101 -> 6349, [1, 64] 1708 -> 1813, [2, 100] 2859 -> 3214 (the full-size int32 MUL costs more)
    wide = ctx.family == "u85" and x.shape[-1] <= U85_WIDE_ROW and int(np.prod(x.shape)) <= U85_WIDE_MAX
    e = _exp(ctx, x, mx, np.int32 if wide else np.int16)
    axis = len(x.shape) - 1
    total = emit_reduce(ctx, Op.REDUCE_SUM, e if wide else rescale(ctx, e, 1.0, np.int32, 0, 0, None), [axis])
    total = rescale(ctx, total, 2.0**plan.a * out_q.s, np.int32, 0, 0, None)
    r, n = im.reciprocal(ctx, total)  # 1/total = r * 2**-(61 - n)
    if wide:  # U85's int32 -> int16 RESCALE costs ~150 cycles, more than a short int32 MUL
        p = im.mul(ctx, e, r, plan.t)
    else:
        p = im.mul(ctx, e, rescale(ctx, r, 2.0**-plan.t, np.int16, 0, 0, None), 0)
    q = im.asr(ctx, p, im.sub(ctx, im.const_i32(ctx, plan.k, n), n))  # p * 2**-(k - n): output LSBs
    return rescale(ctx, q, 1.0, out_q.dtype, 0, out_q.zp, out_q, output_of=output_of)
