"""Piecewise and rounding functions: ThresholdedRelu, Shrink, Sign, Floor, Ceil, Round.

INT profile: one int8 TABLE each, of the node as onnxruntime evaluates it (table.node_function): exact
against the QDQ reference. FP profile: TOSA fp32 compositions with GREATER / EQUAL / SELECT (which only
the fp pipeline, never Vela, runs) and FLOOR / CEIL; Round is ONNX's round-half-to-even, built from
FLOOR with the tie case set to the even neighbour.
"""

from __future__ import annotations

from npubuild.lowering import fp
from npubuild.lowering.context import LoweringContext, TTensor
from npubuild.lowering.emit import Op
from npubuild.lowering.fusion.patterns import fusable
from npubuild.lowering.registry import lowers, quantize_also
from npubuild.lowering.table import table_or_fp

quantize_also("ThresholdedRelu", "Shrink", "Sign", "Floor", "Ceil", "Round")


@lowers("ThresholdedRelu")
@fusable
@table_or_fp
def _thresholded_relu(ctx: LoweringContext, x: TTensor, out: str | None) -> TTensor:
    alpha = float(ctx.attr("alpha", 1.0))
    return fp.select(ctx, fp.greater(ctx, x, fp.scalar(ctx, alpha, x)), x, fp.scalar(ctx, 0.0, x), output_of=out)


@lowers("Shrink")
@fusable
@table_or_fp
def _shrink(ctx: LoweringContext, x: TTensor, out: str | None) -> TTensor:
    """x < -lambd: x + bias; x > lambd: x - bias; else 0."""
    bias, lambd = float(ctx.attr("bias", 0.0)), float(ctx.attr("lambd", 0.5))
    high = fp.select(ctx, fp.greater(ctx, x, fp.scalar(ctx, lambd, x)), fp.add_scalar(ctx, x, -bias),
                     fp.scalar(ctx, 0.0, x))
    return fp.select(ctx, fp.greater(ctx, fp.scalar(ctx, -lambd, x), x), fp.add_scalar(ctx, x, bias), high,
                     output_of=out)


@lowers("Sign")
@fusable
@table_or_fp
def _sign(ctx: LoweringContext, x: TTensor, out: str | None) -> TTensor:
    zero = fp.scalar(ctx, 0.0, x)
    neg = fp.select(ctx, fp.greater(ctx, zero, x), fp.scalar(ctx, -1.0, x), zero)
    return fp.select(ctx, fp.greater(ctx, x, zero), fp.scalar(ctx, 1.0, x), neg, output_of=out)


@lowers("Floor")
@fusable
@table_or_fp
def _floor(ctx: LoweringContext, x: TTensor, out: str | None) -> TTensor:
    return fp.floor(ctx, x, output_of=out)


@lowers("Ceil")
@fusable
@table_or_fp
def _ceil(ctx: LoweringContext, x: TTensor, out: str | None) -> TTensor:
    return fp.unary(ctx, Op.CEIL, "Ceil", x, output_of=out)


@lowers("Round")
@fusable
@table_or_fp
def _round(ctx: LoweringContext, x: TTensor, out: str | None) -> TTensor:
    """floor(x) + 1 where the fraction is above one half, or exactly one half and floor(x) is odd."""
    f = fp.floor(ctx, x)
    frac = fp.sub(ctx, x, f)
    half = fp.scalar(ctx, 0.5, x)
    odd = fp.greater(ctx, fp.sub(ctx, f, fp.mul_scalar(ctx, fp.floor(ctx, fp.mul_scalar(ctx, f, 0.5)), 2.0)), half)
    tie_up = fp.logical(ctx, Op.LOGICAL_AND, "LogicalAnd", fp.equal(ctx, frac, half), odd)
    up = fp.logical(ctx, Op.LOGICAL_OR, "LogicalOr", fp.greater(ctx, frac, half), tie_up)
    return fp.add(ctx, f, fp.select(ctx, up, fp.scalar(ctx, 1.0, x), fp.scalar(ctx, 0.0, x)), output_of=out)
