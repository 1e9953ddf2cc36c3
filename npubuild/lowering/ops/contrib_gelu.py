"""onnxruntime's fused GELU contrib ops (domain com.microsoft): Gelu, FastGelu, BiasGelu, QuickGelu.

onnxruntime's transformer optimiser fuses the Erf and tanh forms of GELU (and their bias Add) into these
ops, so exported-then-optimised models carry them; ONNX's own Gelu is in unary.py.

- Gelu: 0.5 x (1 + erf(x / sqrt 2)); BiasGelu(x, bias): Gelu(x + bias).
- FastGelu(x[, bias]): the tanh approximation, of x + bias when the bias is given.
- QuickGelu(x; alpha = 1.702): x * sigmoid(alpha x).

INT profile: one int8 TABLE of the node as onnxruntime evaluates it (table.node_function), so it equals
the QDQ reference. The bias forms (a constant vector along the last axis) first add the bias in int32
(x exact, the bias at 2**-8 of x's step) and round the sum once to an int8 grid spanning its range (the
range below which the output code no longer changes is cut off), then the TABLE of the bias-free op: two
roundings where the QDQ reference has one, so up to 1 LSB (on a [-4, 4] sweep with a [-1.5, 1] bias, 21% of
FastGelu's and 35% of BiasGelu's outputs are 1 LSB off; tests/lowering/test_ops_contrib_gelu.py). One TABLE
cannot be exact here: each channel's bias shifts the 256 input codes differently, and Vela runs int8 TABLEs
only.
FP profile: the formula in TOSA fp32 ops (fp.gelu; SIGMOID for QuickGelu).
"""

from __future__ import annotations

import numpy as np

from npubuild.lowering import fp, intmath
from npubuild.lowering.broadcast import broadcast_pair
from npubuild.lowering.context import LoweringContext, TTensor
from npubuild.lowering.emit import Op, rescale
from npubuild.lowering.quant import QParams
from npubuild.lowering.registry import lowers, quantize_also
from npubuild.lowering.table import build_table, emit_table, lower_via_table, node_function, quantize_like_ort

quantize_also("FastGelu", "BiasGelu", "QuickGelu")  # com.microsoft:Gelu is quantized as "Gelu" (unary.py)

BIAS_BITS = 8  # the bias is added at 2**-8 of the input step: its rounding is far below one output LSB
FLAT_PROBE = 16 * 256  # points at which the sum's range is probed for a constant output code


def _bias(ctx: LoweringContext) -> np.ndarray | None:
    """The optional bias input (1): a constant 1-D vector along x's last axis, or None."""
    if len(ctx.current.input) < 2 or not ctx.current.input[1]:
        return None
    b = ctx.constant(1)
    x = ctx.tensor(0)
    if b is None:
        raise ctx.unsupported("the bias must be a constant")
    b = np.asarray(b, np.float64).reshape(-1)
    if b.size not in (1, x.logical_shape[-1]):
        raise ctx.unsupported(f"bias of {b.size} values for a last axis of {x.logical_shape[-1]}")
    return b


def _bias_const(ctx: LoweringContext, values: np.ndarray, x: TTensor) -> TTensor:
    """`values` along x's last (logical) axis, as a constant of x's rank."""
    rank = len(x.logical_shape)
    return ctx.materialize_const(values.reshape((1,) * (rank - 1) + (values.size,)), None, hint="bias")


def _sum_grid(fn, lo: float, hi: float, out_q: QParams) -> QParams:
    """int8 parameters for x + bias over [lo, hi], raising lo past where fn's output code stops changing (any
    sum below it saturates to the same table entry, so none of the 256 codes is spent there)."""
    t = np.linspace(lo, hi, FLAT_PROBE, dtype=np.float64)
    y = np.concatenate([fn(chunk) for chunk in t.astype(np.float32).reshape(-1, 256)])  # fn takes 256 values
    codes = quantize_like_ort(y, out_q)
    changed = np.nonzero(codes != codes[0])[0]
    if changed.size:
        lo = max(lo, float(t[max(changed[0] - 1, 0)]))
    scale = max((hi - lo) / 255.0, 1e-12)
    zp = int(np.clip(np.round(-128.0 - lo / scale), -128, 127))
    return QParams(np.asarray(scale, np.float64), np.asarray(zp, np.int64), np.dtype(np.int8))


def _int_biased(ctx: LoweringContext, bias: np.ndarray) -> None:
    """TABLE(round(x + bias)): int32 add, one RESCALE to the sum's int8 grid, the bias-free op's TABLE."""
    x = ctx.tensor(0)
    if x.q is None or x.dtype != np.int8:
        raise ctx.unsupported("the input must be int8-quantized for a TABLE lowering")
    out_q = ctx.require_output_q()
    if out_q.dtype != np.int8:
        raise ctx.unsupported(f"{out_q.dtype} output: TABLE lowering is int8 only")
    fn = node_function(ctx, keep_inputs=1, op_type="Gelu" if ctx.current.op_type == "BiasGelu" else None)
    lo = float(x.q.dequantize(-128)) + float(bias.min())
    hi = float(x.q.dequantize(127)) + float(bias.max())
    sum_q = _sum_grid(fn, lo, hi, out_q)
    gain = 2.0**BIAS_BITS
    x32 = rescale(ctx, x, gain, np.int32, x.q.zp, 0, None)
    b32 = np.round(bias / x.q.s * gain).astype(np.int64)
    if np.abs(b32).max(initial=0) >= 2**30:
        raise ctx.unsupported("the bias is too large against the input's scale")
    a, b = broadcast_pair(ctx, x32, _bias_const(ctx, b32.astype(np.int32), x32))
    total = intmath.add(ctx, a, b)
    t = rescale(ctx, total, x.q.s / gain / sum_q.s, np.int8, 0, sum_q.zp, sum_q)
    ctx.set_output(0, emit_table(ctx, t, build_table(fn, sum_q, out_q), out_q, output_of=ctx.current.output[0]))


def _fp_biased(ctx: LoweringContext, bias: np.ndarray | None) -> TTensor:
    x = ctx.tensor(0)
    if bias is None:
        return x
    a, b = broadcast_pair(ctx, x, _bias_const(ctx, bias.astype(np.float32), x))
    return fp.add(ctx, a, b)


def _lower_gelu(ctx: LoweringContext, tanh: bool) -> None:
    """One TABLE in int8 (after the bias, if any, in int32); TOSA's fp32 GELU, erf or tanh form, in fp32."""
    bias = _bias(ctx)
    if ctx.profile == "int":
        if bias is None:
            lower_via_table(ctx, node_function(ctx))
        else:
            _int_biased(ctx, bias)
        return
    ctx.set_output(0, fp.gelu(ctx, _fp_biased(ctx, bias), tanh, ctx.current.output[0]))


@lowers("com.microsoft:Gelu", "com.microsoft:BiasGelu")
def lower_gelu(ctx: LoweringContext) -> None:
    _lower_gelu(ctx, tanh=False)


@lowers("com.microsoft:FastGelu")
def lower_fast_gelu(ctx: LoweringContext) -> None:
    _lower_gelu(ctx, tanh=True)


@lowers("com.microsoft:QuickGelu")
def lower_quick_gelu(ctx: LoweringContext) -> None:
    """x * sigmoid(alpha x): a TABLE in int8; SIGMOID and MUL in fp32."""
    if ctx.profile == "int":
        lower_via_table(ctx, node_function(ctx))
        return
    x = ctx.tensor(0)
    alpha = float(ctx.attr("alpha", 1.702))
    s = fp.unary(ctx, Op.SIGMOID, "Sigmoid", fp.mul_scalar(ctx, x, alpha))
    ctx.set_output(0, fp.mul(ctx, x, s, output_of=ctx.current.output[0]))
