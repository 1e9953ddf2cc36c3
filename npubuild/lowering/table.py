"""Lookup tables: any unary function of an int8 or int16 tensor becomes one TOSA TABLE op (and a RESCALE).

An int8 input has only 256 values, so `y = quantize_out(f(dequantize_in(x)))`
can be tabulated exactly: the NPU result equals a float evaluation of f on
the dequantized input, rounded once. The table is computed the way
onnxruntime evaluates a DQ -> f -> Q chain (float32 dequantize, f, float32
divide, round half to even, saturate), so it matches the QDQ reference up to
differences in f's float32 implementation.

TOSA 1.0 TABLE for int8: operands (input int8, table int8[256]); the result is
`table[x + 128]`. Vela runs it on the NPU for U55/U65 and U85.

For int16 (EXT-INT16) TABLE interpolates: 513 int16 entries at the inputs -32768 + 128 i, an int32 result
`(t[i] << 7) + (t[i + 1] - t[i]) * (x & 127)`, which one RESCALE takes to the output. Its entries are the
function at those knots on a scale as fine as int16 allows, each moved by half the linear interpolation's
error at the segment's midpoint (as TFLite's 16-bit LUTs are made). Measured over all 65536 inputs against
onnxruntime's QDQ node (tests/lowering/test_int16.py): within 1 LSB of the 16-bit output scale for sigmoid,
LeakyRelu (its kink at 0 sits on a knot), ELU, softplus, abs; 2 LSB on 0.1% of inputs for tanh and exp, whose
curvature over one segment sags 1.7 LSB from a straight line (512 segments are all TOSA's int16 TABLE has: a
knot search does no better). HardSigmoid's kinks fall inside segments (32 LSB): it has an integer form. Vela 5.2 compiles it for U55
and U65 too (LUT passes and MULs, measured bit-exact in npu-sim), although its supported-ops report lists
TABLE as int8 only there. An int8 input with an int16 output is first spread over the int16 range (x - zp)
* 128, exactly: each of its 256 codes is then a knot, so the table is exact up to one rounding.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from npubuild.lowering.context import LoweringContext, TTensor
from npubuild.lowering.emit import Op, attr
from npubuild.lowering.quant import QParams

RealFn = Callable[[np.ndarray], np.ndarray]


def int8_inputs(in_q: QParams) -> np.ndarray:
    """The real value of each of the 256 int8 codes -128..127, as onnxruntime dequantizes them (float32)."""
    codes = np.arange(-128, 128, dtype=np.int64)
    return ((codes - in_q.zp).astype(np.float32) * np.float32(in_q.s)).astype(np.float32)


def quantize_like_ort(y: np.ndarray, out_q: QParams) -> np.ndarray:
    """QuantizeLinear as onnxruntime does it: float32 divide, round half to even, saturate; NaN -> zero point.

    For TABLE entries only (f may give NaN or inf on some of the 256 codes); a graph's own inputs and
    outputs are quantised by tosa.iospec.IOSpec.
    """
    y = np.asarray(y, np.float64)
    big = float(np.finfo(np.float32).max)
    y = np.nan_to_num(y, nan=0.0, posinf=big, neginf=-big).astype(np.float32)
    with np.errstate(over="ignore", invalid="ignore"):
        q = np.rint(y / np.float32(out_q.s)).astype(np.float64) + out_q.zp
    return np.clip(q, out_q.qmin, out_q.qmax).astype(np.int64)


def build_table(fn: RealFn, in_q: QParams, out_q: QParams) -> np.ndarray:
    """256 int8 entries: entry[i] = quantize_out(fn(dequantize_in(i - 128)))."""
    if in_q.dtype != np.int8 or out_q.dtype != np.int8:
        raise ValueError("TABLE lowering needs int8 input and output")
    x = int8_inputs(in_q)
    with np.errstate(all="ignore"):
        y = fn(x.astype(np.float32))
    return quantize_like_ort(y, out_q).astype(np.int8)


KNOTS16 = 513
KNOT_STEP = 128  # int16 inputs between two knots of an int16 TABLE
INT8_SPREAD = 128  # an int8 input's gain onto the int16 knots (|x - zp| <= 255 stays within int16)


def knot_inputs(in_q: QParams) -> np.ndarray:
    """The real input at each of an int16 TABLE's 513 knots (the last one past int16, extrapolated)."""
    codes = -32768 + KNOT_STEP * np.arange(KNOTS16, dtype=np.int64)
    return (codes - in_q.zp).astype(np.float64) * in_q.s


def build_table16(fn: RealFn, in_q: QParams, midpoints: bool = True) -> tuple[np.ndarray, float]:
    """513 int16 entries of fn at the knots on a scale of their own (returned: real = entry * scale, the TABLE's
    int32 result is 128 times that), each moved by half the interpolation's error at its segments' midpoints."""
    x = knot_inputs(in_q)
    with np.errstate(all="ignore"):
        y = np.asarray(fn(x), np.float64)
        mid = np.asarray(fn((x[:-1] + x[1:]) / 2), np.float64) if midpoints else None
    big = float(np.finfo(np.float32).max)
    y = np.nan_to_num(y, nan=0.0, posinf=big, neginf=-big)
    peak = float(np.max(np.abs(y)))
    scale = max(peak, 1e-30) / 32767.0
    t = y / scale
    if mid is not None:
        mid = np.nan_to_num(mid, nan=0.0, posinf=big, neginf=-big) / scale
        err = (t[:-1] + t[1:]) / 2 - mid  # the interpolation's error at each segment's midpoint
        fix = np.zeros(KNOTS16)
        fix[:-1] += err / 2
        fix[1:] += err / 2
        fix[1:-1] /= 2  # an inner knot is shared by two segments
        t = t - fix
    return np.clip(np.round(t), -32768, 32767).astype(np.int16), scale


def apply_table16(table: np.ndarray, q: np.ndarray) -> np.ndarray:
    """What TOSA TABLE computes for int16: the int32 interpolation (tests and composed tables)."""
    u = q.astype(np.int64) + 32768
    i, frac = u >> 7, u & 127
    base = table[i].astype(np.int64)
    return (base << 7) + (table[i + 1].astype(np.int64) - base) * frac


def emit_function(ctx: LoweringContext, x: TTensor, fn: RealFn, out_q: QParams, output_of: str | None = None,
                  table8: np.ndarray | None = None) -> TTensor:
    """out = fn(x) for an int8 or int16 x and output: one int8 TABLE (exact) when both are int8 (`table8` when the
    caller has built it), else an int16 TABLE and a RESCALE to the output (an int8 x spread onto its knots)."""
    assert x.q is not None
    if x.dtype == np.int8 and out_q.dtype == np.int8:
        table = table8 if table8 is not None else build_table(fn, x.q, out_q)
        return emit_table(ctx, x, table, out_q, output_of=output_of)
    midpoints = True
    if x.dtype == np.int8:
        from npubuild.lowering.emit import rescale

        q16 = QParams(np.asarray(x.q.s / INT8_SPREAD), np.asarray(0, np.int64), np.dtype(np.int16))
        x = rescale(ctx, x, float(INT8_SPREAD), np.int16, x.q.zp, 0, q16)
        midpoints = False  # every code of the int8 input is a knot
    table, t_scale = build_table16(fn, x.q, midpoints)
    acc = ctx.new_tensor(x.shape, np.int32, x.perm)
    ctx.op(Op.TABLE, [x.name, ctx.const(table, "table")], [acc.name], attr("Table"))
    from npubuild.lowering.emit import rescale

    return rescale(ctx, acc, t_scale / (KNOT_STEP * out_q.s), out_q.dtype, 0, out_q.zp, out_q, output_of=output_of)


def emit_table(ctx: LoweringContext, x: TTensor, table: np.ndarray, out_q: QParams,
               output_of: str | None = None) -> TTensor:
    """One TABLE op: int8 x -> int8 with the given 256-entry table."""
    assert table.shape == (256,) and table.dtype == np.int8
    out = ctx.new_tensor(x.shape, np.int8, x.perm, out_q, output_of=output_of)
    ctx.op(Op.TABLE, [x.name, ctx.const(table, "table")], [out.name], attr("Table"))
    return out


def node_function(ctx: LoweringContext, keep_inputs: int | None = None, op_type: str | None = None) -> RealFn:
    """The current node as a function of its input 0, evaluated by onnxruntime in float32 (its other inputs
    constants): the very kernel the QDQ reference runs between its DequantizeLinear and QuantizeLinear, so
    a table built from it equals the reference exactly, with no numpy twin of the op to keep in step.

    `keep_inputs` keeps only the node's first inputs and `op_type` runs another op of its domain (a contrib
    op's bias, added before the table: BiasGelu tabulates as Gelu); a custom-domain node (com.microsoft
    contrib ops) keeps its domain and opset."""
    import onnx
    import onnxruntime as ort
    from onnx import TensorProto, helper

    node = ctx.current
    assert node is not None
    inits, names = [], ["x"]
    kept = node.input[1:keep_inputs] if keep_inputs is not None else node.input[1:]
    for k, name in enumerate(kept, start=1):
        c = ctx.constant(k) if name else None
        if name and c is None:
            raise ctx.unsupported(f"input {k} must be a constant for a TABLE lowering")
        if c is not None:
            inits.append(onnx.numpy_helper.from_array(np.asarray(c).astype(np.asarray(c).dtype), f"c{k}"))
        names.append(f"c{k}" if name else "")
    made = helper.make_node(op_type or node.op_type, names, ["y"], domain=node.domain)
    made.attribute.extend(node.attribute)
    graph = helper.make_graph([made], "f", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n"])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    domains = ("", "ai.onnx", node.domain)
    model = helper.make_model(graph, opset_imports=[o for o in ctx.model.opset_import if o.domain in domains])
    model.ir_version = min(ctx.model.ir_version, 10) or 8
    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    sess = ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    return lambda v: np.asarray(sess.run(None, {"x": np.asarray(v, np.float32)})[0], np.float64).reshape(-1)


def lower_via_table(ctx: LoweringContext, fn: RealFn, x: TTensor | None = None) -> None:
    """Lower the current single-output node as out = fn(in) through one TABLE (emit_function)."""
    x = x if x is not None else ctx.tensor(0)
    if x.q is None or x.dtype not in (np.int8, np.int16):
        raise ctx.unsupported("the input must be int8- or int16-quantized for a TABLE lowering")
    out_q = ctx.require_output_q()
    if out_q.dtype not in (np.int8, np.int16):
        raise ctx.unsupported(f"{out_q.dtype} output: TABLE lowering is int8/int16 only")
    ctx.set_output(0, emit_function(ctx, x, fn, out_q, output_of=ctx.current.output[0]))


FpBuild = Callable[[LoweringContext, TTensor, str | None], TTensor]  # the fp32 form: (ctx, x, output name)


def table_or_fp(build: FpBuild) -> Callable[[LoweringContext], None]:
    """A unary op's lowering: a TABLE in int8 (onnxruntime's own evaluation of the node, so exact to its
    rounding), `build(ctx, x, output)` in fp32. A decorator on the fp32 builder, under `@lowers(...)`."""

    def lower(ctx: LoweringContext) -> None:
        if ctx.profile == "int":
            lower_via_table(ctx, node_function(ctx))
            return
        ctx.set_output(0, build(ctx, ctx.tensor(0), ctx.current.output[0]))

    return lower
