"""Elementwise arithmetic: Add, Sub, Mul, Div, Min, Max, and the variadic Sum and Mean.

Integer Add/Sub follow the scheme every int8 runtime uses: both operands are
rescaled to int32 on a common scale with 20 bits of headroom, added or
subtracted, and rescaled to the output; Vela fuses the three into one NPU
elementwise op.

Integer Mul: a positive constant per tensor or per channel is folded into one
(per-channel) RESCALE, any other scalar into one TABLE; otherwise both
operands are re-centred to int32 (x - zp), multiplied exactly (MUL, shift 0)
and the product rescaled by sa*sb/so. Div by a constant is Mul by its
reciprocal (kept at 23 bits as an int32 constant when it is not a RESCALE);
general Div reads the divisor's reciprocal as a 15-bit mantissa (two int8 TABLEs, high and low byte)
and an exponent (a third TABLE), multiplies in int32 and shifts per element.
Min/Max rescale each operand to int32 on the output's scale (monotonic, so the
order is kept), take MINIMUM/MAXIMUM and rescale to int8; against a scalar
constant they are a CLAMP.
Sum and Mean of n inputs follow Add: every operand rescaled to int32 on one common scale with headroom,
n - 1 ADDs, one RESCALE to the output (Mean's 1/n folded into it), so the result rounds once.
"""

from __future__ import annotations

import numpy as np
import tosa_serializer as ts

from npubuild.frontend.qdq_add_ratio import STEPS, weights
from npubuild.lowering import fp
from npubuild.lowering.broadcast import (
    CONST_BITS,
    broadcast_operands,
    broadcast_pair,
    operand,
    operand_rank,
)
from npubuild.lowering.context import LoweringContext, QConst, RowImage, TTensor
from npubuild.lowering.emit import Op, as_int16, attr, clamp, requantize, rescale, reshape
from npubuild.lowering.fusion.patterns import fusable
from npubuild.lowering.quant import QParams
from npubuild.lowering.registry import lowers, quantize_also
from npubuild.lowering.table import build_table, emit_table

HEADROOM_BITS = 20  # int8 operands (|x - zp| <= 255) widened by 2**20: a sum of two stays below 2**30
# int16 operands (|x| <= 2**15) times at most 1/2 (each operand's scale over twice the larger) widened by 2**15: a
# sum of two stays below 2**30. It is TFLite's 16-bit ADD (left shift 15), the one form Vela 5.2 fuses into one U55
# elementwise op (2**13: six ops, 67584 vs 12288 cycles for a 16x16x32 ADD on U55-128)
HEADROOM_BITS_16 = 15


def headroom(*xs: TTensor) -> int:
    return HEADROOM_BITS_16 if any(x.dtype == np.int16 for x in xs) else HEADROOM_BITS


def const_bits(x: TTensor) -> int:
    """Bits of an int32 constant multiplied by x - zp so that the product stays below 2**31."""
    return CONST_BITS if x.dtype == np.int8 else CONST_BITS - 8

quantize_also("Sub", "Div", "Min", "Max", "Sum", "Mean")


def _out_shape(a: TTensor, b: TTensor) -> tuple[int, ...]:
    return tuple(int(max(p, q)) for p, q in zip(a.shape, b.shape, strict=True))


def same_width(ctx: LoweringContext, *xs: TTensor) -> tuple[TTensor, ...]:
    """int8 operands beside an int16 one moved onto the int16 grid first (one exact RESCALE each): Vela 5.2
    compiles an ADD of an int8 and an int16 operand on U55 into an op whose result npu-sim does not reproduce
    (mp_face_detection's residual Add of a channel-padded int8 input and an int16 conv output, 1851/36864
    elements off), and runs the int16 + int16 form bit-exactly."""
    if len({x.dtype for x in xs}) < 2:
        return xs
    return tuple(as_int16(ctx, x) for x in xs)


def _quantized(ctx: LoweringContext, *xs: TTensor) -> None:
    if any(x.q is None or x.dtype not in (np.int8, np.int16) for x in xs):
        raise ctx.unsupported("operands must be int8- or int16-quantized")


# ---------------------------------------------------------------------------------------------- Add, Sub


def row_images(ctx: LoweringContext) -> tuple[TTensor, TTensor] | None:
    """Inputs 0 and 1 as NHWC images in one view when both are 1-D activations held so (context.RowImage)
    of one shape and the output reaches no graph output: a residual Add of a TCN then stays rank 4."""
    ra, rb = ctx.row(0), ctx.row(1)
    if ra is None or rb is None or ra.length != rb.length or ra.image.shape[3] != rb.image.shape[3] or \
            ctx.index.reaches_output(ctx.current.output[0]):
        return None
    # one view for both (elementwise ops do not care which): one they both have, else input 1's
    views = [rb.image.shape[1:3], ra.image.shape[1:3]]
    both = [hw for hw in views if hw in (ra.image.shape[1:3], *ra.views) and hw in (rb.image.shape[1:3], *rb.views)]
    width = (both[0] if both else views[0])[1]
    return ctx.row_view(ra, width), ctx.row_view(rb, width)


def _add_sub(ctx: LoweringContext, op, kind: str) -> None:
    rows = row_images(ctx)
    a, b = rows if rows is not None else broadcast_operands(ctx)
    out_name = ctx.current.output[0]
    out_of = None if rows is not None else out_name
    if ctx.profile == "fp":
        y = fp.binary(ctx, op, kind, a, b, output_of=out_of)
        ctx.set_output(0, RowImage(y) if rows is not None else y)
        return
    out_q = ctx.require_output_q()
    _quantized(ctx, a, b)
    a, b = same_width(ctx, a, b)
    swapped = kind == "Add" and ctx.options.add_operands_swapped  # a + b == b + a in int32: only the order moves
    steps = _steps(a, b)
    if steps is not None and _depthwise_pays(ctx, a, b):
        y = _depthwise_sum(ctx, a, b, steps, kind, swapped, out_q, out_of)
        ctx.set_output(0, RowImage(y) if rows is not None else y)
        return
    twice_max = 2.0 * max(a.q.s, b.q.s)
    bits = headroom(a, b)
    if steps is not None:  # the exact integers of that ratio, not its float32 scales' near miss
        scale_a, scale_b = (float(w << (bits - STEPS.bit_length())) for w in steps)  # 64 -> 2**(bits - 1)
    else:
        scale_a, scale_b = a.q.s / twice_max * (1 << bits), b.q.s / twice_max * (1 << bits)
    a32 = rescale(ctx, a, scale_a, np.int32, a.q.zp, 0, None)
    b32 = rescale(ctx, b, scale_b, np.int32, b.q.zp, 0, None)
    acc = ctx.new_tensor(_out_shape(a, b), np.int32, a.perm)
    ctx.op(op, [b32.name, a32.name] if swapped else [a32.name, b32.name], [acc.name], attr(kind))
    out_scale = twice_max / ((1 << bits) * out_q.s)
    y = rescale(ctx, acc, out_scale, out_q.dtype, 0, out_q.zp, out_q, output_of=out_of)
    ctx.set_output(0, RowImage(y) if rows is not None else y)


def _steps(a: TTensor, b: TTensor) -> tuple[int, int] | None:
    """(w_a, w_b) = (64, p) or (p, 64): int8 operands whose smaller scale is p / 64 of the larger
    (frontend/qdq_add_ratio.py makes that so for a residual Add), or None."""
    if a.dtype != np.int8 or b.dtype != np.int8 or not (a.q.is_per_tensor and b.q.is_per_tensor):
        return None
    return weights(a.q.s, b.q.s)


def _depthwise_pays(ctx: LoweringContext, a: TTensor, b: TTensor) -> bool:
    """Whether the family runs this sum as one depthwise conv (LoweringOptions.add_as_depthwise): two batch-1
    rank-4 int8 operands of one shape and layout, no broadcast, each read by this node alone. An operand read
    elsewhere too (an identity shortcut) Vela 5.2 copies into the CONCAT (ResNet-8's first stage: a 16640-cycle
    copy and the 8896-cycle conv against the ADD's 24576; the TCN's four blocks 30712 -> 35560)."""
    return (ctx.options.add_as_depthwise and len(a.shape) == 4 and a.shape == b.shape and a.perm == b.perm
            and a.shape[0] == 1 and all(_only_reader(ctx, i) for i in (0, 1)))


def _only_reader(ctx: LoweringContext, i: int) -> bool:
    """Whether the current node is the one reader of input i's value (through its Q/DQ copies) and that value
    is no graph output."""
    source = ctx.index.source(ctx.current.input[i])
    return [n.name for n in ctx.index.uses(source, [])] == [ctx.current.name] and not ctx.index.reaches_output(source)


def _depthwise_sum(ctx: LoweringContext, a: TTensor, b: TTensor, steps: tuple[int, int], kind: str,
                   swapped: bool, out_q: QParams, out_of: str | None) -> TTensor:
    """w_a (a - z_a) +- w_b (b - z_b), then the one RESCALE: the ADD's integers above (its sum is 2**13 times
    this one, its final scale 2**-13 times this one's: the same multiplier, the shift 13 less), as a
    CONCAT of the operands along channels, its free [1, H, 2W, C] view (each pixel's two values side by side)
    and a 1x2 stride-(1, 2) DEPTHWISE_CONV2D of weights (w_a, +-w_b). The conv reads every value at a's zero
    point; b's own zero point comes back through the bias. Vela 5.2 on U55-128: 16384 elements 24576 -> 8896
    cycles (bench/u55_add_dw.md)."""
    n, h, w, c = a.shape
    wa, wb = steps[0], steps[1] if kind == "Add" else -steps[1]
    first, second, w_first, w_second = (b, a, wb, wa) if swapped else (a, b, wa, wb)
    pair = ctx.new_tensor((n, h, w, 2 * c), np.int8, a.perm)
    ctx.op(Op.CONCAT, [first.name, second.name], [pair.name], attr("Concat", 3))
    side_by_side = reshape(ctx, pair, (n, h, 2 * w, c), a.perm)
    kernel = np.stack([np.full(c, w_first), np.full(c, w_second)]).reshape(1, 2, c, 1).astype(np.int8)
    bias = np.full(c, wb * (a.q.zp - b.q.zp), np.int32)
    acc = ctx.new_tensor((n, h, w, c), np.int32, a.perm)
    ins = [side_by_side.name, ctx.const(kernel, "weights"), ctx.const(bias, "bias"), ctx.zp(a.q.zp, np.int8),
           ctx.zp(0, np.int8)]
    ctx.op(Op.DEPTHWISE_CONV2D, ins, [acc.name],
           attr("DepthwiseConv2d", [0, 0, 0, 0], [1, 2], [1, 1], False, ts.DType.INT32))
    return rescale(ctx, acc, max(a.q.s, b.q.s) / (STEPS * out_q.s), out_q.dtype, 0, out_q.zp, out_q, output_of=out_of)


@lowers("Add")
@fusable
def lower_add(ctx: LoweringContext) -> None:
    _add_sub(ctx, Op.ADD, "Add")


@lowers("Sub")
@fusable
def lower_sub(ctx: LoweringContext) -> None:
    _add_sub(ctx, Op.SUB, "Sub")


def _sum_mean(ctx: LoweringContext, mean: bool) -> None:
    idx = [i for i in range(len(ctx.current.input)) if ctx.has_input(i)]
    rank = max(operand_rank(ctx, i) for i in idx)
    xs = [operand(ctx, i, rank) for i in idx]
    out_name = ctx.current.output[0]
    n = len(xs)
    if ctx.profile == "fp":
        acc = xs[0] if n > 1 else fp.add_scalar(ctx, xs[0], 0.0, output_of=None if mean else out_name)
        for j, x in enumerate(xs[1:], start=2):
            a, b = broadcast_pair(ctx, acc, x)
            acc = fp.add(ctx, a, b, output_of=out_name if j == n and not mean else None)
        ctx.set_output(0, fp.mul_scalar(ctx, acc, 1.0 / n, output_of=out_name) if mean else acc)
        return
    out_q = ctx.require_output_q()
    _quantized(ctx, *xs)
    xs = list(same_width(ctx, *xs))
    top = max(x.q.s for x in xs)
    bits = headroom(*xs) - int(np.ceil(np.log2(n)))  # n operands of up to 255 (int16: 2**15) LSB of `top` each
    wide = [rescale(ctx, x, x.q.s / top * (1 << bits), np.int32, x.q.zp, 0, None) for x in xs]
    acc = wide[0]
    for x in wide[1:]:
        a, b = broadcast_pair(ctx, acc, x)
        out = ctx.new_tensor(_out_shape(a, b), np.int32, a.perm if a.shape == _out_shape(a, b) else b.perm)
        ctx.op(Op.ADD, [a.name, b.name], [out.name], attr("Add"))
        acc = out
    scale = top / ((1 << bits) * out_q.s) / (n if mean else 1)
    ctx.set_output(0, rescale(ctx, acc, scale, out_q.dtype, 0, out_q.zp, out_q, output_of=out_name))


@lowers("Sum")
def lower_sum(ctx: LoweringContext) -> None:
    _sum_mean(ctx, mean=False)


@lowers("Mean")
def lower_mean(ctx: LoweringContext) -> None:
    _sum_mean(ctx, mean=True)


# ---------------------------------------------------------------------------------------------- Mul, Div


def _int_sub(ctx: LoweringContext, a: TTensor, b: TTensor) -> TTensor:
    a, b = broadcast_pair(ctx, a, b)
    out = ctx.new_tensor(_out_shape(a, b), np.int32, b.perm if b.shape == _out_shape(a, b) else a.perm)
    ctx.op(Op.SUB, [a.name, b.name], [out.name], attr("Sub"))
    return out


def _int_mul32(ctx: LoweringContext, a32: TTensor, b32: TTensor, scale: float, out_q: QParams) -> TTensor:
    """a*b exact in int32 (int32 or int16 operands), then one RESCALE by `scale` to the output."""
    a32, b32 = broadcast_pair(ctx, a32, b32)
    acc = ctx.new_tensor(_out_shape(a32, b32), np.int32, a32.perm if a32.shape == _out_shape(a32, b32) else b32.perm)
    ctx.op(Op.MUL, [a32.name, b32.name, ctx.const(np.zeros([1], np.int8), "shift")], [acc.name], attr("Mul"))
    return rescale(ctx, acc, scale, out_q.dtype, 0, out_q.zp, out_q, output_of=ctx.current.output[0])


def _centred32(ctx: LoweringContext, x: TTensor) -> TTensor:
    """int8 or int16 x -> int32 (x - zp), exactly (a product of two fits int32). An int16 x (zero point 0) by a
    CAST (a multiplication by an int32 constant: two int16 operands multiply as they are, `_mul_int`)."""
    if x.dtype == np.int16 and int(np.max(np.abs(x.q.zp))) == 0:
        out = ctx.new_tensor(x.shape, np.int32, x.perm)
        ctx.op(Op.CAST, [x.name], [out.name], attr("Cast"))
        return out
    return rescale(ctx, x, 1.0, np.int32, x.q.zp, 0, None)


def _mul_int(ctx: LoweringContext, a: TTensor, b: TTensor, out_q: QParams) -> TTensor:
    """a*b in int32, then one RESCALE. A 16-bit operand (an int8 one beside it moved to the int16 grid) goes
    into the MUL as it is, int16 x int16 -> int32, exact: widening it by a CAST first, Vela 5.2 runs the CAST
    of a SLICE's result over the unsliced tensor on U55/U65, so a GRU's reset gate read its update gate
    (tests/npusim/test_vela_slice_rescale.py), and it cost an NPU op per operand."""
    _quantized(ctx, a, b)
    scale = a.q.s * b.q.s / out_q.s
    if np.int16 in (a.dtype, b.dtype):
        return _int_mul32(ctx, as_int16(ctx, a), as_int16(ctx, b), scale, out_q)
    return _int_mul32(ctx, _centred32(ctx, a), _centred32(ctx, b), scale, out_q)


def _mul_const_int(ctx: LoweringContext, x: TTensor, c: np.ndarray, out_q: QParams, qconst: int | None = None
                   ) -> TTensor:
    """x * c for a real constant c: one RESCALE for a positive c per tensor or per channel, one TABLE for any
    other scalar, else MUL by the constant: input `qconst`'s own int8 data when given (exactly what the QDQ
    graph multiplies by), otherwise c as an int32 at 23 bits (a reciprocal has no exact int8 form)."""
    _quantized(ctx, x)
    c = np.asarray(c, np.float64)
    rank = len(x.shape)
    out_name = ctx.current.output[0]
    if c.ndim <= rank and np.all(c > 0):  # a positive scale per tensor or per channel: one RESCALE
        phys = np.transpose(c.reshape((1,) * (rank - c.ndim) + c.shape), x.perm)
        if all(d == 1 for d in phys.shape[:-1]) and phys.shape[-1] in (1, x.shape[-1]):
            return rescale(ctx, x, x.q.s * phys.reshape(-1) / out_q.s, out_q.dtype, x.q.zp, out_q.zp, out_q,
                           output_of=out_name)
    if c.size == 1 and c.ndim <= rank and np.isfinite(c).all():
        v = float(c.reshape(-1)[0])
        if x.dtype == np.int8 and out_q.dtype == np.int8:
            return emit_table(ctx, x, build_table(lambda t: np.asarray(t, np.float64) * v, x.q, out_q), out_q,
                              output_of=out_name)
        if v < 0:  # 16-bit: -round(x |c|) on the output's scale (one rounding), negated exactly
            t = rescale(ctx, x, x.q.s * -v / out_q.s, np.int32, x.q.zp, 0, None)
            neg = _int_sub(ctx, ctx.materialize_const(np.zeros((1,) * rank, np.int32), None, "zero"), t)
            return rescale(ctx, neg, 1.0, out_q.dtype, 0, out_q.zp, out_q, output_of=out_name)
    qc = ctx.qconst(qconst) if qconst is not None else None
    if qc is not None and qc.q.axis is None:
        a, b = broadcast_pair(ctx, x, operand(ctx, qconst, max(rank, c.ndim)))
        return _mul_int(ctx, a, b, out_q)
    peak = float(np.max(np.abs(c)))
    if peak == 0.0 or not np.isfinite(peak):
        raise ctx.unsupported("multiplying by a constant that is all zero or not finite")
    k = const_bits(x) - int(np.ceil(np.log2(peak)))
    c_int = np.round(c * 2.0**k).astype(np.int32)
    c_int = c_int.reshape((1,) * max(0, rank - c.ndim) + c_int.shape)
    ct = ctx.materialize_const(c_int, None, hint="mulconst")
    return _int_mul32(ctx, _centred32(ctx, x), ct, x.q.s * 2.0**-k / out_q.s, out_q)


@lowers("Mul")
@fusable
def lower_mul(ctx: LoweringContext) -> None:
    out_name = ctx.current.output[0]
    if ctx.profile == "fp":
        a, b = broadcast_operands(ctx)
        ctx.set_output(0, fp.mul(ctx, a, b, output_of=out_name))
        return
    out_q = ctx.require_output_q()
    c1, c0 = ctx.constant(1), ctx.constant(0)
    if c1 is not None and c0 is None:
        ctx.set_output(0, _mul_const_int(ctx, ctx.tensor(0), c1, out_q, qconst=1))
    elif c0 is not None and c1 is None:
        ctx.set_output(0, _mul_const_int(ctx, ctx.tensor(1), c0, out_q, qconst=0))
    else:
        a, b = broadcast_operands(ctx)
        ctx.set_output(0, _mul_int(ctx, a, b, out_q))


RECIP_MAX = 127 * 256 + 127  # largest |R| the two-byte reciprocal holds
MANT_BITS = 15  # |mantissa| of each code's reciprocal in [2**14, 2**15)


def reciprocal32(ctx: LoweringContext, b: TTensor) -> tuple[TTensor, TTensor, float]:
    """1/b per element in floating point: (M, t, scale) with 1/b = M * 2**-t * scale, M an int32 holding a
    15-bit mantissa times 2**8 (so a product with an int8 operand fills int32 without overflow) and t >= 0
    the per-element exponent.

    Three int8 TABLEs of b's 256 codes give M's high and low bytes and t. Each code's reciprocal keeps
    15 significant bits whatever its size: a fixed-point one (one scale for all codes) keeps only as many
    as the ratio to the largest reciprocal allows, and when b's range comes close to 0 that was 9 bits
    for b ~ 1, enough for a 2 LSB error in the decomposed group norm's Div. The code b == 0 maps to the
    largest finite reciprocal."""
    with np.errstate(divide="ignore"):
        r = 1.0 / b.q.dequantize(np.arange(-128, 128))
    finite = np.isfinite(r)
    peak = float(np.max(np.abs(r[finite])))
    r = np.where(finite, r, peak)
    mag = np.maximum(np.abs(r), 1e-30)
    e = (MANT_BITS - 1) - np.floor(np.log2(mag)).astype(np.int64)  # |r| 2**e in [2**14, 2**15)
    e_min = int(e.min())
    t = np.minimum(e - e_min, 31)
    mant = np.round(r * 2.0 ** (e_min + t)).astype(np.int64)
    mant = np.clip(mant, -RECIP_MAX, RECIP_MAX)
    hi = np.floor((mant + 128) / 256).astype(np.int64)
    lo = mant - 256 * hi
    raw = QParams(np.array(1.0), np.array(0, np.int64), np.dtype(np.int8))
    parts = []
    for byte, weight in ((hi, 2.0**16), (lo, 2.0**8)):
        tab = emit_table(ctx, b, byte.astype(np.int8), raw)
        parts.append(rescale(ctx, tab, weight, np.int32, 0, 0, None))
    m = ctx.new_tensor(b.shape, np.int32, b.perm)
    ctx.op(Op.ADD, [parts[0].name, parts[1].name], [m.name], attr("Add"))
    shift = rescale(ctx, emit_table(ctx, b, t.astype(np.int8), raw), 1.0, np.int32, 0, 0, None)
    return m, shift, 2.0 ** -(e_min + 8)


@lowers("Div")
@fusable
def lower_div(ctx: LoweringContext) -> None:
    out_name = ctx.current.output[0]
    c = ctx.constant(1)
    if ctx.profile == "fp":
        if c is not None:
            a, r = broadcast_pair(ctx, ctx.tensor(0), ctx.materialize_const(
                (1.0 / np.asarray(c, np.float64)).astype(np.float32), None, "recip"))
        else:
            a, b = broadcast_operands(ctx)
            r = fp.unary(ctx, Op.RECIPROCAL, "Reciprocal", b)
        ctx.set_output(0, fp.mul(ctx, a, r, output_of=out_name))
        return
    out_q = ctx.require_output_q()
    if c is not None:
        with np.errstate(divide="ignore"):
            ctx.set_output(0, _mul_const_int(ctx, ctx.tensor(0), 1.0 / np.asarray(c, np.float64), out_q))
        return
    a, b = broadcast_operands(ctx)
    _quantized(ctx, a, b)
    m, t, r_scale = reciprocal32(ctx, b)
    a32, m = broadcast_pair(ctx, _centred32(ctx, a), m)
    p = ctx.new_tensor(_out_shape(a32, m), np.int32, a32.perm if a32.shape == _out_shape(a32, m) else m.perm)
    ctx.op(Op.MUL, [a32.name, m.name, ctx.const(np.zeros([1], np.int8), "shift")], [p.name], attr("Mul"))
    p, t = broadcast_pair(ctx, p, t)
    q = ctx.new_tensor(_out_shape(p, t), np.int32, p.perm)
    ctx.op(Op.ARITHMETIC_RIGHT_SHIFT, [p.name, t.name], [q.name], attr("ArithmeticRightShift", True))
    ctx.set_output(0, rescale(ctx, q, a.q.s * r_scale / out_q.s, out_q.dtype, 0, out_q.zp, out_q, output_of=out_name))


# ---------------------------------------------------------------------------------------------- Min, Max


def _min_max(ctx: LoweringContext, op, kind: str) -> None:
    """Variadic Min/Max. TOSA 1.0 PRO-INT has MINIMUM/MAXIMUM for int32 only, so int8 operands are rescaled
    to int32 on the output's scale (rounding is monotonic: min-then-round == round-then-min)."""
    idx = [i for i in range(len(ctx.current.input)) if ctx.has_input(i)]
    rank = max(operand_rank(ctx, i) for i in idx)
    out_name = ctx.current.output[0]
    out_q = None
    if _clamp_by_scalar(ctx, idx, op):
        return
    if ctx.profile == "int":
        out_q = ctx.require_output_q()
        if len(idx) == 1:
            ctx.set_output(0, requantize(ctx, ctx.tensor(0), out_q, output_of=out_name))
            return
        xs = [_int32_on(ctx, i, rank, out_q) for i in idx]
    else:
        xs = [operand(ctx, i, rank) for i in idx]
        if len(xs) == 1:
            ctx.set_output(0, fp.add_scalar(ctx, xs[0], 0.0, output_of=out_name))
            return
    acc = xs[0]
    for j, x in enumerate(xs[1:], start=2):
        a, b = broadcast_pair(ctx, acc, x)
        last = j == len(xs) and out_q is None
        out = ctx.new_tensor(_out_shape(a, b), a.dtype, a.perm if a.shape == _out_shape(a, b) else b.perm,
                             output_of=out_name if last else None)
        ctx.op(op, [a.name, b.name], [out.name], attr(kind, fp.NAN_MODE))
        acc = out
    if out_q is not None:
        acc = rescale(ctx, acc, 1.0, out_q.dtype, 0, out_q.zp, out_q, output_of=out_name)
    ctx.set_output(0, acc)


def _clamp_by_scalar(ctx: LoweringContext, idx: list[int], op) -> bool:
    """Min/Max of a tensor and a scalar constant is a CLAMP (fused by Vela into the op before it)."""
    consts = [ctx.constant(i) for i in idx]
    if len(idx) != 2 or sum(c is not None for c in consts) != 1:
        return False
    j = 0 if consts[0] is not None else 1
    c = np.asarray(consts[j])
    x = ctx.tensor(idx[1 - j])
    if c.size != 1 or c.ndim > len(x.shape):
        return False
    v = float(c.reshape(-1)[0])
    out_name = ctx.current.output[0]
    if ctx.profile == "fp":
        lo, hi = (v, 3.4e38) if op == Op.MAXIMUM else (-3.4e38, v)
        ctx.set_output(0, clamp(ctx, x, lo, hi, output_of=out_name))
        return True
    out_q = ctx.require_output_q()
    _quantized(ctx, x)
    b = int(np.clip(np.round(v / out_q.s) + out_q.zp, out_q.qmin, out_q.qmax))
    lo, hi = (b, out_q.qmax) if op == Op.MAXIMUM else (out_q.qmin, b)
    ctx.set_output(0, clamp(ctx, requantize(ctx, x, out_q), lo, hi, output_of=out_name))
    return True


def _int32_on(ctx: LoweringContext, i: int, rank: int, out_q: QParams) -> TTensor:
    """Input i as int32 on out_q's scale (zero point 0); constants are converted in numpy."""
    v = ctx.values.get(ctx.current.input[i])
    if isinstance(v, QConst):
        data = np.round(v.real().astype(np.float64) / out_q.s).astype(np.int32)
        return ctx.materialize_const(data.reshape((1,) * (rank - data.ndim) + data.shape), None, "minmax")
    x = operand(ctx, i, rank)
    _quantized(ctx, x)
    return rescale(ctx, x, x.q.s / out_q.s, np.int32, x.q.zp, 0, None)


@lowers("Min")
@fusable
def lower_min(ctx: LoweringContext) -> None:
    _min_max(ctx, Op.MINIMUM, "Minimum")


@lowers("Max")
@fusable
def lower_max(ctx: LoweringContext) -> None:
    _min_max(ctx, Op.MAXIMUM, "Maximum")
