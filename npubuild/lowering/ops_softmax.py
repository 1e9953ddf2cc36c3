"""Softmax and LogSoftmax over one axis, in any layout (the reduction follows the axis physically).

FP: REDUCE_MAX, SUB, EXP, REDUCE_SUM, RECIPROCAL (or LOG), MUL.

INT (no EXP or division on Ethos-U): d = x - max(x) in [-255, 0] becomes an
int8 index; two int8 TABLEs give the high and low bytes of exp(s_x d) in
Q15, so exp keeps 15 bits although TABLE is 8-bit in and out (Vela runs
int16 TABLE on no U55); the rows are summed in int32. Softmax (softmax_int.py)
multiplies by the Newton-Raphson reciprocal of intmath in the form Vela runs
in the fewest passes. LogSoftmax instead subtracts ln(sum), whose mantissa
part is one more TABLE. Accuracy is measured against onnxruntime in
tests/test_ops_compute.py.
"""

from __future__ import annotations

import numpy as np

from npubuild.lowering import intmath as im
from npubuild.lowering.context import LoweringContext, TTensor
from npubuild.lowering.emit import Op, attr, rescale, to_layout
from npubuild.lowering.ops_reduce import emit_reduce
from npubuild.lowering.quant import QParams
from npubuild.lowering.registry import lowers, quantize_also
from npubuild.lowering.softmax_int import lower_softmax_int
from npubuild.lowering.table import emit_table

quantize_also("LogSoftmax")  # onnxruntime leaves it in float on its own

EXP_BITS = 15
OUT_FRAC_BITS = 16  # fixed-point fraction of the int32 result before the final RESCALE
BYTE_Q = QParams(np.float64(1.0), np.int64(-128), np.dtype(np.int8))  # a table byte b stored as b - 128


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


def exp_tables(scale: float) -> tuple[np.ndarray, np.ndarray]:
    """High and low byte tables of round(exp(scale * d) * 2**15) for index i = d + 127, d in [-255, 0]."""
    d = np.arange(-128, 128, dtype=np.float64) - 127
    v = np.round(np.exp(scale * d) * (1 << EXP_BITS)).astype(np.int64)
    return ((v >> 8) - 128).astype(np.int8), ((v & 255) - 128).astype(np.int8)


def ln_mantissa_table() -> tuple[np.ndarray, QParams]:
    """ln(m) at the midpoint of each of 256 mantissa bins m in [0.5, 1), as int8 with its QParams."""
    m = (np.arange(-128, 128, dtype=np.float64) + 384.5) / 512
    q = QParams(np.float64(np.log(2) / 255), np.int64(127), np.dtype(np.int8))
    return q.quantize(np.log(m)), q


def _shifted(ctx: LoweringContext, x: TTensor, axis: int) -> tuple[TTensor, TTensor]:
    """d = x - max(x) over the axis: as int32, and as the int8 table index d + 127."""
    mx = emit_reduce(ctx, Op.REDUCE_MAX, x, [axis])
    d = im.sub(ctx, im.widen(ctx, x), im.widen(ctx, mx))
    return d, im.narrow_exact(ctx, d, 127)


def _exp_q15(ctx: LoweringContext, index: TTensor, scale: float) -> TTensor:
    hi_t, lo_t = exp_tables(scale)
    hi = im.widen(ctx, emit_table(ctx, index, hi_t, BYTE_Q), 256)
    lo = im.widen(ctx, emit_table(ctx, index, lo_t, BYTE_Q))
    return im.add(ctx, hi, lo)


def _lower_int(ctx: LoweringContext, x: TTensor, axis: int, log: bool) -> TTensor:
    out_q = ctx.require_output_q()
    if x.q is None or x.dtype != np.int8 or out_q.dtype != np.int8:
        raise ctx.unsupported("the integer softmax needs int8 input and output")
    if not log:
        return lower_softmax_int(ctx, x, axis, out_q)
    out_name = ctx.current.output[0]
    d, index = _shifted(ctx, x, axis)
    e = _exp_q15(ctx, index, x.q.s)
    total = emit_reduce(ctx, Op.REDUCE_SUM, e, [axis])  # >= 2**15: the maximum contributes exp(0)
    if x.shape[axis] >= 1 << (31 - EXP_BITS):
        raise ctx.unsupported(f"softmax over {x.shape[axis]} elements overflows the int32 sum")
    one = 1 << OUT_FRAC_BITS
    # log softmax = s_x d - ln(total / 2**15); total = m 2**(32 - n), m in [0.5, 1)
    n = im.clz(ctx, total)
    m = im.shl(ctx, total, im.sub(ctx, n, im.const_i32(ctx, 1, n)))
    idx = im.narrow_exact(ctx, im.sub(ctx, im.asr(ctx, m, im.const_i32(ctx, 22, m)), im.const_i32(ctx, 384, m)), 0)
    table, tq = ln_mantissa_table()
    ln_m = rescale(ctx, emit_table(ctx, idx, table, tq), tq.s * one, np.int32, tq.zp, 0, None)
    a = rescale(ctx, d, x.q.s * one, np.int32, 0, 0, None)
    ln2 = np.log(2) * one
    n_ln2 = im.mul(ctx, n, im.const_i32(ctx, round(ln2), n), 0)
    y = im.add(ctx, im.sub(ctx, im.sub(ctx, a, ln_m), im.const_i32(ctx, round((32 - EXP_BITS) * ln2), a)), n_ln2)
    return rescale(ctx, y, 1.0 / (one * out_q.s), out_q.dtype, 0, out_q.zp, out_q, output_of=out_name)


def axis_last(ctx: LoweringContext, x: TTensor, logical_axes: list[int]) -> TTensor:
    """x in a layout with the given logical axes physically last (a TRANSPOSE only if the order changes).

    The integer lowerings reduce int32 tensors; Vela runs REDUCE_SUM natively
    over the channel (last) axis only and otherwise moves the data itself,
    which npu-sim showed to give wrong sums for computed int32 tensors. An
    int8 layout change up front is cheap and exact; the result keeps the new
    layout (the next op converts only if it needs to).
    """
    layout = tuple(p for p in x.perm if p not in logical_axes) + tuple(logical_axes)
    return to_layout(ctx, x, layout)


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

