"""Unary non-linear ops: Sigmoid, Tanh, HardSigmoid, HardSwish, Gelu, Erf, Exp, Log, Sqrt, Reciprocal,
Abs, Neg, LeakyRelu, PRelu, Pow (constant exponent).

INT profile: each is one int8 TABLE computed from the float function and the
input/output quantisation (table.py): exact up to one rounding, one NPU op.
Chains of these that compute a function of one tensor (GELU's Erf form, SiLU...)
become one TABLE too (patterns.py).
PRelu with a per-channel slope cannot be one table. On an NHWC tensor it is two int8 branches that each
round once: max(x, zp) requantised to the output, and min(x, zp) through a 1x1 DEPTHWISE_CONV2D whose
per-channel scale is |slope|, summed (one of the two is always the output's zero point, so the sum is
exact); else slope*x + (1-slope)*max(x, 0) in int32 with the slope as a 23-bit constant.

FP profile: the direct TOSA fp32 op where there is one, else a composition
(HardSigmoid/HardSwish with CLAMP, Gelu with ERF or TANH, LeakyRelu/PRelu with
MAXIMUM/MINIMUM).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import tosa_serializer as ts

from npubuild.lowering import fp
from npubuild.lowering import intmath as im
from npubuild.lowering.broadcast import CONST_BITS, broadcast_pair
from npubuild.lowering.context import LoweringContext, TTensor
from npubuild.lowering.emit import Op, attr, clamp, rescale
from npubuild.lowering.fusion.patterns import fusable, gelu
from npubuild.lowering.quant import multiplier_shift
from npubuild.lowering.registry import lowers, quantize_also
from npubuild.lowering.table import KNOT_STEP, lower_via_table

quantize_also("Tanh", "HardSigmoid", "HardSwish", "Gelu", "Erf", "Exp", "Log", "Sqrt", "Reciprocal", "Abs", "Neg",
              "PRelu", "Pow")

FMAX = 3.4e38


def _hard_sigmoid(alpha: float, beta: float) -> Callable[[np.ndarray], np.ndarray]:
    return lambda x: np.clip(alpha * np.asarray(x, np.float64) + beta, 0.0, 1.0)


def _gelu_tanh(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, np.float64)
    return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x**3)))


def _leaky(alpha: float) -> Callable[[np.ndarray], np.ndarray]:
    return lambda x: np.where(np.asarray(x) >= 0, x, alpha * np.asarray(x, np.float64))


def _out(ctx: LoweringContext) -> str:
    return ctx.current.output[0]


def _unary(ctx: LoweringContext, fn: Callable[[np.ndarray], np.ndarray], build_fp: Callable[[TTensor, str], TTensor]
           ) -> None:
    """Dispatch on the profile: TABLE of fn in int8, build_fp(x, output name) in fp32."""
    if ctx.profile == "int":
        lower_via_table(ctx, fn)
        return
    ctx.set_output(0, build_fp(ctx.tensor(0), _out(ctx)))


def _erf(x: np.ndarray) -> np.ndarray:
    return np.vectorize(math.erf)(np.asarray(x, np.float64))


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-np.asarray(x, np.float64)))


def _reciprocal(x: np.ndarray) -> np.ndarray:
    return 1.0 / np.asarray(x, np.float64)


# ONNX ops TOSA has as one elementwise op of the same name: the op, and the function of the values an int8
# TABLE samples
DIRECT: dict[str, tuple[Op, Callable[[np.ndarray], np.ndarray]]] = {
    "Sigmoid": (Op.SIGMOID, _sigmoid), "Tanh": (Op.TANH, np.tanh), "Exp": (Op.EXP, np.exp), "Log": (Op.LOG, np.log),
    "Erf": (Op.ERF, _erf), "Abs": (Op.ABS, np.abs), "Reciprocal": (Op.RECIPROCAL, _reciprocal)}


@lowers(*DIRECT)
@fusable
def lower_direct(ctx: LoweringContext) -> None:
    """A TABLE of the function in int8; TOSA's own elementwise op in fp32."""
    kind = ctx.current.op_type
    op, fn = DIRECT[kind]
    _unary(ctx, fn, lambda x, out: fp.unary(ctx, op, kind, x, output_of=out))


@lowers("Neg")
@fusable
def lower_neg(ctx: LoweringContext) -> None:
    _unary(ctx, np.negative, lambda x, out: fp.negate(ctx, x, output_of=out))


def _fp_pow(ctx: LoweringContext, x: TTensor, p: float, out: str) -> TTensor:
    if p in (1.0, 2.0, 3.0, 4.0):  # small integer powers as products: POW is undefined for x < 0
        acc = x
        for j in range(2, int(p) + 1):
            acc = fp.mul(ctx, acc, x, output_of=out if j == int(p) else None)
        return acc if p > 1.0 else fp.mul_scalar(ctx, x, 1.0, output_of=out)
    return fp.binary(ctx, Op.POW, "Pow", x, fp.scalar(ctx, p, x), output_of=out)


@lowers("Sqrt")
@fusable
def lower_sqrt(ctx: LoweringContext) -> None:
    _unary(ctx, np.sqrt, lambda x, out: _fp_pow(ctx, x, 0.5, out))


@lowers("Pow")
@fusable
def lower_pow(ctx: LoweringContext) -> None:
    """A constant exponent (of any numeric type) that is one value everywhere: a TABLE in int8, products
    or POW in fp32; per-element or run-time exponents: POW in fp32 only."""
    e = ctx.constant(1)
    if e is not None and np.asarray(e).size > 1 and np.all(np.asarray(e) == np.asarray(e).reshape(-1)[0]) \
            and np.asarray(e).ndim <= len(ctx.tensor(0).shape) and \
            np.broadcast_shapes(np.asarray(e).shape, ctx.tensor(0).logical_shape) == ctx.tensor(0).logical_shape:
        e = np.asarray(e).reshape(-1)[:1]
    if e is None or np.asarray(e).size != 1:
        if ctx.profile == "int":
            raise ctx.unsupported("int8 Pow needs one constant exponent")
        if e is None:  # ONNX defines (-2) ** 3; TOSA POW is unpredictable for any negative base
            raise ctx.unsupported("Pow of a computed exponent: TOSA POW is undefined for a negative base")
        x = ctx.tensor(0)  # an integer exponent tensor: the fp32 POW takes it as fp32
        rank = max(len(x.shape), np.asarray(e).ndim)
        ev = np.asarray(e, np.float32)
        a, b = broadcast_pair(ctx, x, ctx.materialize_const(ev.reshape((1,) * (rank - ev.ndim) + ev.shape), None))
        ctx.set_output(0, fp.binary(ctx, Op.POW, "Pow", a, b, output_of=_out(ctx)))
        return
    p = float(np.asarray(e).reshape(-1)[0])
    p = round(p, 4) if abs(p - round(p, 4)) < 1e-5 else p  # int8 exponent constants dequantize to 2.0000002
    _unary(ctx, lambda x: np.power(np.asarray(x, np.float64), p), lambda x, out: _fp_pow(ctx, x, p, out))


def _fp_hard_sigmoid(ctx: LoweringContext, x: TTensor, alpha: float, beta: float, out: str | None) -> TTensor:
    return clamp(ctx, fp.add_scalar(ctx, fp.mul_scalar(ctx, x, alpha), beta), 0.0, 1.0, output_of=out)


def _needs_integer_form(ctx: LoweringContext, bends: tuple[float, ...]) -> bool:
    """Whether the current node reads or writes an int16 activation with a bend its interpolating int16 TABLE
    cannot follow: one not on a knot of the int16 input (the precision rewrite puts a hard swish's input on a
    scale with its bends on knots, frontend/precision/rewrite.int16_scale; then one TABLE is exact)."""
    if ctx.profile != "int":
        return False
    x, out_q = ctx.tensor(0), ctx.require_output_q()
    if x.dtype != np.int16 and out_q.dtype != np.int16:
        return False
    if x.dtype != np.int16 or x.q is None:
        return True
    codes = [b / x.q.s for b in bends]
    return not all(abs(c - round(c)) < 1e-3 and round(c) % KNOT_STEP == 0 and abs(c) < 32768 for c in codes)


def _hard_sigmoid_int32(ctx: LoweringContext, x: TTensor, alpha: float, beta: float, scale: float,
                        frac: int) -> TTensor:
    """clamp(alpha x + beta, 0, 1) / scale as int32 with `frac` fraction bits: one RESCALE of x (alpha > 0), an
    ADD of beta and a MAXIMUM/MINIMUM pair, exact up to the two roundings at 2**-frac."""
    assert x.q is not None
    t = rescale(ctx, x, alpha * x.q.s / scale * 2.0**frac, np.int32, x.q.zp, 0, None)
    t = im.add(ctx, t, im.const_i32(ctx, round(beta / scale * 2.0**frac), t))
    lo, hi = im.const_i32(ctx, 0, t), im.const_i32(ctx, round(2.0**frac / scale), t)
    for op, kind, bound in ((Op.MAXIMUM, "Maximum", lo), (Op.MINIMUM, "Minimum", hi)):
        out = ctx.new_tensor(t.shape, np.int32, t.perm)
        ctx.op(op, [t.name, bound.name], [out.name], attr(kind, fp.NAN_MODE))
        t = out
    return t


def _frac_bits(peak: float) -> int:
    """Fraction bits that keep `peak` (in LSBs) times 2**frac below 2**30."""
    return max(0, 30 - int(np.ceil(np.log2(max(peak, 1.0)))))


@lowers("HardSigmoid")
@fusable
def lower_hard_sigmoid(ctx: LoweringContext) -> None:
    alpha, beta = float(ctx.attr("alpha", 0.2)), float(ctx.attr("beta", 0.5))
    if alpha > 0 and _needs_integer_form(ctx, (-beta / alpha, (1 - beta) / alpha)):
        x, out_q = ctx.tensor(0), ctx.require_output_q()
        frac = _frac_bits(max(alpha * x.q.s * 65536, abs(beta) + 1.0) / out_q.s)
        h = _hard_sigmoid_int32(ctx, x, alpha, beta, out_q.s, frac)
        ctx.set_output(0, rescale(ctx, h, 2.0**-frac, out_q.dtype, 0, out_q.zp, out_q, output_of=_out(ctx)))
        return
    _unary(ctx, _hard_sigmoid(alpha, beta), lambda x, out: _fp_hard_sigmoid(ctx, x, alpha, beta, out))


HSWISH_BITS = 22  # the hard sigmoid factor of an int16 hard swish in Q22; the product x * h shifted by 7 fits int32


@lowers("HardSwish")
@fusable
def lower_hard_swish(ctx: LoweringContext) -> None:
    """x * hardsigmoid(x): one TABLE, or with a 16-bit input whose bends at +-3 miss the TABLE's knots x (int32)
    times the factor in Q22, shifted into int32 by 7, and one RESCALE (an int16 TABLE is 8-16 LSB off there)."""
    if _needs_integer_form(ctx, (-3.0, 3.0)):
        x, out_q = ctx.tensor(0), ctx.require_output_q()
        h = _hard_sigmoid_int32(ctx, x, 1.0 / 6.0, 0.5, 1.0, HSWISH_BITS)
        p = im.mul(ctx, rescale(ctx, x, 1.0, np.int32, x.q.zp, 0, None), h, HSWISH_BITS - 15)
        ctx.set_output(0, rescale(ctx, p, x.q.s * 2.0**-15 / out_q.s, out_q.dtype, 0, out_q.zp, out_q,
                                  output_of=_out(ctx)))
        return
    hs = _hard_sigmoid(1.0 / 6.0, 0.5)
    _unary(ctx, lambda x: np.asarray(x, np.float64) * hs(x),
           lambda x, out: fp.mul(ctx, x, _fp_hard_sigmoid(ctx, x, 1.0 / 6.0, 0.5, None), output_of=out))


@lowers("Gelu")
@fusable
def lower_gelu(ctx: LoweringContext) -> None:
    approximate = ctx.attr("approximate", b"none")
    approximate = approximate.decode() if isinstance(approximate, bytes) else str(approximate)
    _unary(ctx, _gelu_tanh if approximate == "tanh" else gelu, lambda x, out: fp.gelu(ctx, x, approximate == "tanh", out))


def _fp_leaky(ctx: LoweringContext, x: TTensor, slope: TTensor, uniform: float | None, out: str) -> TTensor:
    """max(x, 0) + slope * min(x, 0); for 0 <= slope <= 1 simply max(x, slope * x)."""
    if uniform is not None and 0.0 <= uniform <= 1.0:
        return fp.maximum(ctx, x, fp.mul(ctx, x, slope), output_of=out)
    x, slope = broadcast_pair(ctx, x, slope)
    neg = fp.mul(ctx, clamp(ctx, x, -FMAX, 0.0), slope)
    return fp.add(ctx, clamp(ctx, x, 0.0, FMAX), neg, output_of=out)


@lowers("LeakyRelu")
@fusable
def lower_leaky_relu(ctx: LoweringContext) -> None:
    alpha = float(ctx.attr("alpha", 0.01))
    _unary(ctx, _leaky(alpha), lambda x, out: _fp_leaky(ctx, x, fp.scalar(ctx, alpha, x), alpha, out))


@lowers("PRelu")
@fusable
def lower_prelu(ctx: LoweringContext) -> None:
    slope = ctx.constant(1)
    uniform = None
    if slope is not None and np.all(slope == np.asarray(slope).reshape(-1)[0]):
        uniform = float(np.asarray(slope).reshape(-1)[0])
    if ctx.profile == "fp":
        x = ctx.tensor(0)
        s = fp.scalar(ctx, uniform, x) if uniform is not None else ctx.tensor(1)
        ctx.set_output(0, _fp_leaky(ctx, x, s, uniform, _out(ctx)))
    elif uniform is not None:
        lower_via_table(ctx, _leaky(uniform))
    elif slope is not None:
        if not _int_prelu_branches(ctx, ctx.tensor(0), np.asarray(slope, np.float64)):
            _int_prelu_per_channel(ctx, ctx.tensor(0), np.asarray(slope, np.float64))
    else:
        raise ctx.unsupported("int8 PRelu needs a constant slope")


def _channel_slopes(x: TTensor, slope: np.ndarray) -> np.ndarray | None:
    """The slope per physical channel of an NHWC x (its last axis), or None if it varies along another axis."""
    rank = len(x.shape)
    if rank != 4 or slope.ndim > rank:
        return None
    phys = np.transpose(slope.reshape((1,) * (rank - slope.ndim) + slope.shape), x.perm)  # physical layout
    if any(d != 1 for d in phys.shape[:-1]) or phys.shape[-1] not in (1, x.shape[-1]):
        return None
    return np.broadcast_to(phys.reshape(-1), (x.shape[-1],)).astype(np.float64)


def _int_prelu_branches(ctx: LoweringContext, x: TTensor, slope: np.ndarray) -> bool:
    """y = requant(max(x, zp)) + dw_|slope|(min(x, zp)) - zp_y, all int8 (see the module docstring).

    For x >= zp the depthwise branch reads zp and gives exactly zp_y; for x < zp the requantised branch is
    zp_y: so y is one branch, rounded once from the exact product (the int32 form rounded its slope to 23
    bits). Vela runs each branch at int8 speed (an int32 MUL costs ~8 cycles an element on U55-128; palm
    detection's 26 PReLUs were 62% of its cycles). False where it does not apply (the caller's form then)."""
    out_q = ctx.require_output_q()
    if x.q is None or x.dtype != np.int8 or out_q.dtype != np.int8:
        return False
    per_c = _channel_slopes(x, slope)
    if per_c is None:
        return False
    a = x.q.s / out_q.s
    mag = np.abs(per_c)
    scales = np.where(mag > 0, mag, 1.0) * a
    try:
        multiplier_shift(scales, 32)
        multiplier_shift(np.array([a]), 32)
    except ValueError:
        return False
    c = x.shape[3]
    zp, zp_y = int(x.q.zp), int(out_q.zp)
    if ctx.options.prelu_select or (ctx.current is not None and ctx.current.name in ctx.options.prelu_select_nodes):
        _int_prelu_select(ctx, x, per_c, a, scales, out_q)
        return True
    if ctx.options.prelu_elementwise:
        pos = _min_max(ctx, Op.MAXIMUM, x, zp, a, out_q)  # max(R(a (x - zp)), 0) + zp_y: one rounding
        neg_in = _min_max(ctx, Op.MINIMUM, x, zp)
    else:
        # positive branch: x requantised, then everything below the output's zero point clamped to it
        pos = clamp(ctx, rescale(ctx, x, a, np.int8, zp, zp_y, out_q), zp_y, 127)
        # negative branch: min(x, zp) times slope per channel: weight sign(slope), scale |slope| a
        neg_in = clamp(ctx, x, -128, zp)
    acc = ctx.new_tensor(x.shape, np.int32, x.perm)
    weights = np.sign(per_c).astype(np.int8).reshape(1, 1, c, 1)
    ctx.op(Op.DEPTHWISE_CONV2D, [neg_in.name, ctx.const(weights, "prelu_sign"), ctx.const(np.zeros(c, np.int32), "bias"),
                                 ctx.zp(zp, np.int8), ctx.zp(0, np.int8)], [acc.name],
           attr("DepthwiseConv2d", [0, 0, 0, 0], [1, 1], [1, 1], False, ts.DType.INT32))
    neg = rescale(ctx, acc, scales, np.int8, 0, zp_y, out_q)
    # the sum, as an int8 Add: both operands widened by ~2**19 (one of them is always 0), back by 2**-19.
    # The second operand's factor is 2**19 - 1/2 (multiplier 2**30 - 2**10, shift 11): Vela 5.2 fuses the
    # widening RESCALEs into its ADD only when the two differ (with equal ones it ran each as an int32 ADD
    # and MUL: 3x the Add's cycles). The result is the same: for |v| <= 255 the sum is v * 2**19 - d,
    # |d| <= 128, which the final RESCALE (round half up) brings back to v exactly.
    p32 = _rescale_fixed(ctx, pos, 1 << 30, 11, np.int32, zp_y, 0)
    n32 = _rescale_fixed(ctx, neg, (1 << 30) - (1 << 10), 11, np.int32, zp_y, 0)
    acc2 = ctx.new_tensor(x.shape, np.int32, x.perm)
    ctx.op(Op.ADD, [p32.name, n32.name], [acc2.name], attr("Add"))
    ctx.set_output(0, _rescale_fixed(ctx, acc2, 1 << 30, 49, np.int8, 0, zp_y, out_q, output_of=_out(ctx)))
    return True


def _int_prelu_select(ctx: LoweringContext, x: TTensor, slope: np.ndarray, a: float, scales: np.ndarray,
                      out_q) -> None:
    """y = max(P, D) on the channels whose slope is at most 1 (PRelu is convex there), min(P, D) on the others
    (concave), with P = R(a (x - zp)) and D = R(slope a (x - zp)) each rounded once: for x >= zp y is P, for
    x < zp it is D (rounding is monotone), so y is the branch form's integers for every input, saturation
    included. D is a 1x1 DEPTHWISE_CONV2D of x, P the elementwise op's own input RESCALE: U85 chains the
    MAXIMUM / MINIMUM onto the depthwise, one pass over x where the branches made three (palm detection's
    96x96x32 maps live in DRAM on U85-256: 407k -> 297k cycles a PRelu). Both kinds of channel: two passes,
    z = min(D', P) with D' at int8's top on the convex channels (z is P there), then y = max(D'', z) with D''
    at its bottom on the concave ones (y is z there). D comes first in each pair: Vela chains that operand."""
    convex = slope <= 1.0
    zp, zp_y = int(x.q.zp), int(out_q.zp)
    c = x.shape[3]

    def depthwise(keep: np.ndarray, fill: int) -> TTensor:
        """D on the `keep` channels; the others saturate to int8's end `fill` (+1 / -1), whatever x is."""
        weights = np.where(keep, np.sign(slope), 0).astype(np.int8).reshape(1, 1, c, 1)
        bias = np.where(keep, 0, fill << 16).astype(np.int32)
        acc = ctx.new_tensor(x.shape, np.int32, x.perm)
        ctx.op(Op.DEPTHWISE_CONV2D, [x.name, ctx.const(weights, "prelu_sign"), ctx.const(bias, "bias"),
                                     ctx.zp(zp, np.int8), ctx.zp(0, np.int8)], [acc.name],
               attr("DepthwiseConv2d", [0, 0, 0, 0], [1, 1], [1, 1], False, ts.DType.INT32))
        return rescale(ctx, acc, np.where(keep, scales, 1.0), np.int8, 0, zp_y, out_q)

    def pick(op, d: TTensor, other: TTensor, other_scale: float, other_zp: int, output_of=None) -> TTensor:
        d32 = rescale(ctx, d, 1.0, np.int32, zp_y, 0, None)
        o32 = rescale(ctx, other, other_scale, np.int32, other_zp, 0, None)
        acc = ctx.new_tensor(x.shape, np.int32, x.perm)
        ctx.op(op, [d32.name, o32.name], [acc.name], attr("Minimum" if op == Op.MINIMUM else "Maximum", fp.NAN_MODE))
        return rescale(ctx, acc, 1.0, np.int8, 0, zp_y, out_q, output_of=output_of)

    if convex.all():
        y = pick(Op.MAXIMUM, depthwise(convex, 0), x, a, zp, _out(ctx))
    elif not convex.any():
        y = pick(Op.MINIMUM, depthwise(~convex, 0), x, a, zp, _out(ctx))
    else:
        z = pick(Op.MINIMUM, depthwise(~convex, 1), x, a, zp)
        y = pick(Op.MAXIMUM, depthwise(convex, -1), z, 1.0, zp_y, _out(ctx))
    ctx.set_output(0, y)


def _min_max(ctx: LoweringContext, op, x: TTensor, value: int, scale: float = 1.0, out_q=None) -> TTensor:
    """MINIMUM / MAXIMUM of int8 x - zp and int8 value - zp, both times `scale` and rounded once (RESCALE to
    int32), on `out_q` (default x's): TOSA has them on int32 only, and Vela fuses the RESCALEs into its
    elementwise op (U85 runs it at 4 elements a cycle, a CLAMP as a 1x1 pool at 2)."""
    assert x.q is not None
    out_q = out_q or x.q
    a = rescale(ctx, x, scale, np.int32, x.q.zp, 0, None)
    bound = ctx.const(np.full((1,) * len(x.shape), value, np.int8), "bound")
    b = rescale(ctx, TTensor(bound, (1,) * len(x.shape), np.dtype(np.int8), x.perm, x.q), scale, np.int32, x.q.zp, 0,
                None)
    acc = ctx.new_tensor(x.shape, np.int32, x.perm)
    ctx.op(op, [a.name, b.name], [acc.name], attr("Minimum" if op == Op.MINIMUM else "Maximum", fp.NAN_MODE))
    return rescale(ctx, acc, 1.0, out_q.dtype, 0, out_q.zp, out_q)


def _rescale_fixed(ctx: LoweringContext, x: TTensor, multiplier: int, shift: int, out_dtype: type, in_zp: int,
                   out_zp: int, out_q=None, output_of: str | None = None) -> TTensor:
    """A RESCALE by multiplier * 2**-shift exactly as given (emit.rescale normalises a float scale)."""
    out = ctx.new_tensor(x.shape, np.dtype(out_dtype), x.perm, out_q, output_of=output_of)
    ctx.op(Op.RESCALE, [x.name, ctx.const(np.array([multiplier], np.int32), "multiplier"),
                        ctx.const(np.array([shift], np.int8), "shift"), ctx.zp(in_zp, x.dtype),
                        ctx.zp(out_zp, np.dtype(out_dtype))], [out.name],
           attr("Rescale", True, ts.RoundingMode.SINGLE_ROUND, False, False, False))
    return out


def _int_prelu_per_channel(ctx: LoweringContext, x: TTensor, slope: np.ndarray) -> None:
    """y = slope*x + (1 - slope)*max(x, 0) in int32 (x centred), constants at 2**k, one RESCALE out."""
    out_q = ctx.require_output_q()
    if x.q is None or x.dtype not in (np.int8, np.int16):
        raise ctx.unsupported("the input must be int8- or int16-quantized")
    peak = max(float(np.max(np.abs(slope))), float(np.max(np.abs(1.0 - slope))), 1.0)
    bits = CONST_BITS if x.dtype == np.int8 else CONST_BITS - 8  # |x - zp| <= 255 (int16: 2**15): products < 2**31
    k = bits - int(np.ceil(np.log2(peak)))
    rank = len(x.shape)
    shaped = slope.reshape((1,) * max(0, rank - slope.ndim) + slope.shape)

    def const(v: np.ndarray) -> TTensor:
        return ctx.materialize_const(np.round(v * 2.0**k).astype(np.int32), None, hint="prelu")

    x32 = rescale(ctx, x, 1.0, np.int32, x.q.zp, 0, None)
    zero = ctx.const(np.zeros((1,) * rank, np.int32), "zero")
    pos = ctx.new_tensor(x32.shape, np.int32, x32.perm)
    ctx.op(Op.MAXIMUM, [x32.name, zero], [pos.name], attr("Maximum", fp.NAN_MODE))
    shift = ctx.const(np.zeros([1], np.int8), "shift")
    terms = []
    for v, t in ((shaped, x32), (1.0 - shaped, pos)):
        a, c = broadcast_pair(ctx, t, const(v))
        prod = ctx.new_tensor(tuple(max(p, q) for p, q in zip(a.shape, c.shape, strict=True)), np.int32, a.perm)
        ctx.op(Op.MUL, [a.name, c.name, shift], [prod.name], attr("Mul"))
        terms.append(prod)
    acc = ctx.new_tensor(terms[0].shape, np.int32, terms[0].perm)
    ctx.op(Op.ADD, [terms[0].name, terms[1].name], [acc.name], attr("Add"))
    ctx.set_output(0, rescale(ctx, acc, x.q.s * 2.0**-k / out_q.s, out_q.dtype, 0, out_q.zp, out_q,
                              output_of=_out(ctx)))
