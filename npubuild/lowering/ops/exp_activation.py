"""Smooth activations built on exp and log: Elu, Selu, Celu, Softplus, Softsign, Mish, Swish.

INT profile: each is one int8 TABLE of the node as onnxruntime evaluates it (table.node_function), so it
equals the QDQ reference exactly. FP profile: compositions of TOSA fp32 ops, written so no intermediate
overflows (softplus as max(x, 0) + log(1 + exp(-|x|))).
"""

from __future__ import annotations

from npubuild.lowering import fp
from npubuild.lowering.context import LoweringContext, TTensor
from npubuild.lowering.emit import Op, clamp
from npubuild.lowering.fusion.patterns import fusable
from npubuild.lowering.registry import lowers, quantize_also
from npubuild.lowering.table import table_or_fp

quantize_also("Elu", "Selu", "Celu", "Softplus", "Softsign", "Mish", "Swish")

FMAX = 3.4e38


def _expm1_neg(ctx: LoweringContext, x: TTensor, scale: float) -> TTensor:
    """exp(min(x, 0) / scale) - 1, the negative branch of the ELU family (0 for x >= 0)."""
    neg = clamp(ctx, x, -FMAX, 0.0)
    if scale != 1.0:
        neg = fp.mul_scalar(ctx, neg, 1.0 / scale)
    return fp.add_scalar(ctx, fp.unary(ctx, Op.EXP, "Exp", neg), -1.0)


@lowers("Elu")
@fusable
@table_or_fp
def _elu(ctx: LoweringContext, x: TTensor, out: str | None) -> TTensor:
    alpha = float(ctx.attr("alpha", 1.0))
    return fp.add(ctx, clamp(ctx, x, 0.0, FMAX), fp.mul_scalar(ctx, _expm1_neg(ctx, x, 1.0), alpha), output_of=out)


@lowers("Selu")
@fusable
@table_or_fp
def _selu(ctx: LoweringContext, x: TTensor, out: str | None) -> TTensor:
    alpha = float(ctx.attr("alpha", 1.67326319217681884765625))
    gamma = float(ctx.attr("gamma", 1.05070102214813232421875))
    y = fp.add(ctx, clamp(ctx, x, 0.0, FMAX), fp.mul_scalar(ctx, _expm1_neg(ctx, x, 1.0), alpha))
    return fp.mul_scalar(ctx, y, gamma, output_of=out)


@lowers("Celu")
@fusable
@table_or_fp
def _celu(ctx: LoweringContext, x: TTensor, out: str | None) -> TTensor:
    alpha = float(ctx.attr("alpha", 1.0))
    return fp.add(ctx, clamp(ctx, x, 0.0, FMAX), fp.mul_scalar(ctx, _expm1_neg(ctx, x, alpha), alpha), output_of=out)


def _softplus(ctx: LoweringContext, x: TTensor, out: str | None) -> TTensor:
    """log(1 + exp(x)) = max(x, 0) + log(1 + exp(-|x|)): exp never overflows."""
    minus_abs = fp.negate(ctx, fp.unary(ctx, Op.ABS, "Abs", x))
    tail = fp.unary(ctx, Op.LOG, "Log", fp.add_scalar(ctx, fp.unary(ctx, Op.EXP, "Exp", minus_abs), 1.0))
    return fp.add(ctx, clamp(ctx, x, 0.0, FMAX), tail, output_of=out)


@lowers("Softsign")
@fusable
@table_or_fp
def _softsign(ctx: LoweringContext, x: TTensor, out: str | None) -> TTensor:
    denom = fp.add_scalar(ctx, fp.unary(ctx, Op.ABS, "Abs", x), 1.0)
    return fp.mul(ctx, x, fp.unary(ctx, Op.RECIPROCAL, "Reciprocal", denom), output_of=out)


@lowers("Softplus")
@fusable
@table_or_fp
def _softplus_op(ctx: LoweringContext, x: TTensor, out: str | None) -> TTensor:
    return _softplus(ctx, x, out)


@lowers("Mish")
@fusable
@table_or_fp
def _mish(ctx: LoweringContext, x: TTensor, out: str | None) -> TTensor:
    return fp.mul(ctx, x, fp.unary(ctx, Op.TANH, "Tanh", _softplus(ctx, x, None)), output_of=out)


@lowers("Swish")
@fusable
@table_or_fp
def _swish(ctx: LoweringContext, x: TTensor, out: str | None) -> TTensor:
    alpha = float(ctx.attr("alpha", 1.0))
    scaled = x if alpha == 1.0 else fp.mul_scalar(ctx, x, alpha)
    return fp.mul(ctx, x, fp.unary(ctx, Op.SIGMOID, "Sigmoid", scaled), output_of=out)
