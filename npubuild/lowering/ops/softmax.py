"""Softmax and LogSoftmax over one axis, in any layout (the reduction follows the axis physically).

FP: REDUCE_MAX, SUB, EXP, REDUCE_SUM, RECIPROCAL (or LOG), MUL.

INT (no EXP or division on Ethos-U): softmax_int.py. d = x - max(x) in
[-255, 0] becomes an int8 index; two int8 TABLEs give the high and low bytes
of exp(s_x d) in 15 bits although TABLE is 8-bit in and out (Vela runs int16
TABLE on no U55); the rows are summed in int32. Softmax multiplies by the
Newton-Raphson reciprocal of intmath, LogSoftmax subtracts ln(sum), whose
mantissa part is one more TABLE; both in the form Vela runs in the fewest
passes. Accuracy is measured against onnxruntime in tests/lowering/test_ops_compute.py
and tests/lowering/test_softmax_int.py. Fed the QDQ model's own int8 input (verify/node_errors), the
examples' softmaxes are within 1 LSB of onnxruntime's float32 one on every element, and off at all on
0.02-0.06% of them (transformer softmax_24 0.061%, mobilevit 0.016%): the 15-bit exp and the reciprocal's
last bit against float32 near a rounding boundary (issue 21).
"""

from __future__ import annotations

import numpy as np

from npubuild.lowering.context import LoweringContext, TTensor
from npubuild.lowering.emit import Op, attr
from npubuild.lowering.fusion.softmax_int import lower_log_softmax_int, lower_softmax_int
from npubuild.lowering.reduction import axis_last, emit_reduce
from npubuild.lowering.registry import lowers, quantize_also

quantize_also("LogSoftmax")  # onnxruntime leaves it in float on its own


def _axis(ctx: LoweringContext, x: TTensor) -> int:
    """The physical axis holding the node's logical axis."""
    rank = len(x.shape)
    axis = int(ctx.attr("axis", -1))
    axis = axis + rank if axis < 0 else axis
    return x.perm.index(axis)


def _fp_unary(ctx: LoweringContext, op, kind: str, x: TTensor) -> TTensor:
    out = ctx.new_tensor(x.shape, np.float32, x.perm)
    ctx.op(op, [x.name], [out.name], attr(kind))
    return out


def _fp_binary(ctx: LoweringContext, op, kind: str, a: TTensor, b: TTensor, output_of: str | None = None) -> TTensor:
    shape = tuple(max(p, q) for p, q in zip(a.shape, b.shape, strict=True))
    out = ctx.new_tensor(shape, np.float32, a.perm, output_of=output_of)
    ins = [a.name, b.name] + ([ctx.const(np.zeros(1, np.int8), "shift")] if op == Op.MUL else [])
    ctx.op(op, ins, [out.name], attr(kind))
    return out


def _lower_fp(ctx: LoweringContext, x: TTensor, axis: int, log: bool) -> TTensor:
    out_name = ctx.current.output[0]
    mx = emit_reduce(ctx, Op.REDUCE_MAX, x, [axis])
    d = _fp_binary(ctx, Op.SUB, "Sub", x, mx)
    e = _fp_unary(ctx, Op.EXP, "Exp", d)
    s = emit_reduce(ctx, Op.REDUCE_SUM, e, [axis])
    if log:
        return _fp_binary(ctx, Op.SUB, "Sub", d, _fp_unary(ctx, Op.LOG, "Log", s), output_of=out_name)
    return _fp_binary(ctx, Op.MUL, "Mul", e, _fp_unary(ctx, Op.RECIPROCAL, "Reciprocal", s), output_of=out_name)


def _lower_int(ctx: LoweringContext, x: TTensor, axis: int, log: bool) -> TTensor:
    out_q = ctx.require_output_q()
    if x.q is None or x.dtype not in (np.int8, np.int16) or out_q.dtype not in (np.int8, np.int16):
        raise ctx.unsupported("the integer softmax needs an int8 or int16 input and output")
    if log and (x.dtype != np.int8 or out_q.dtype != np.int8):
        raise ctx.unsupported("the integer log softmax needs int8 input and output")
    return (lower_log_softmax_int if log else lower_softmax_int)(ctx, x, axis, out_q)


def _lower(ctx: LoweringContext, log: bool) -> None:
    x = ctx.tensor(0)
    if ctx.profile == "fp":
        ctx.set_output(0, _lower_fp(ctx, x, _axis(ctx, x), log))
        return
    x = axis_last(ctx, x, [x.perm[_axis(ctx, x)]])
    ctx.set_output(0, _lower_int(ctx, x, len(x.shape) - 1, log))


@lowers("Softmax")
def lower_softmax(ctx: LoweringContext) -> None:
    _lower(ctx, log=False)


@lowers("LogSoftmax")
def lower_log_softmax(ctx: LoweringContext) -> None:
    _lower(ctx, log=True)

