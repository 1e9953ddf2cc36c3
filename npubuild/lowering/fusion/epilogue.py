"""Fold the affine nodes after a matrix product into its bias and output rescale.

Torch writes a Linear layer on rank-3 activations as MatMul(x, W) then
Add(., b), and attention's 1/sqrt(d) as a Mul or Div by a scalar after the
score MatMul. Lowered one node at a time those become a separate elementwise
ADD pass and a standalone RESCALE on the NPU; TFLite folds them into
FullyConnected. Here a chain of Add(per-channel constant) and Mul/Div(positive
scalar constant) nodes that only the product reads is folded into an epilogue
y = gain * acc_real + bias, applied by the producer's int32 bias and RESCALE
(or its float weights and bias).

In the QDQ model every intermediate is rounded to its own int8 scale; the
folded form rounds once. Folding is exact up to that rounding, so a step is
taken only while the intermediates' rounding (0.5 LSB each, carried through the
later gains) stays under one LSB of the chain's final output.

INT bias Adds behind a Q/DQ pair are not folded by default (LoweringOptions.int_bias_add): each
fold is within one LSB of the QDQ reference, but the reference rounds the
product before adding the bias and the folded form does not, and on the example
transformer those 1-LSB differences add up through the layers (TOSA-vs-QDQ SNR
32.8 -> 27.6 dB, under the 30 dB gate). The quantize stage removes that pair
for constant-weight MatMuls (qdq_linear.py), as TFLite's FullyConnected has
none: an Add that reads the product directly is folded exactly, with the QDQ
model's own int32 bias (`Epilogue.exact`). Scalar Mul/Div folds are exact when
the scales line up as they do in attention (s_product * c == s_out).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import onnx

from npubuild.lowering.context import LoweringContext
from npubuild.lowering.quant import QParams


@dataclass
class Epilogue:
    """y = gain * product + bias, ending at ONNX value `out_name` (quantized as `out_q` in the INT profile)."""

    gain: float
    bias: np.ndarray  # float64 [o], added after the gain
    out_name: str
    out_q: QParams | None
    nodes: list[onnx.NodeProto] = field(default_factory=list)  # folded nodes, Q/DQ between them included
    exact: tuple[np.ndarray, np.ndarray] | None = None  # the bias as the QDQ model's int32 values and scales

    def commit(self, ctx: LoweringContext) -> None:
        """Mark the folded nodes so the driver skips them."""
        ctx.fused.update(n.name for n in self.nodes)


def _step(const: np.ndarray, op: str, operand_first: bool, o: int, rank: int) -> tuple[float, np.ndarray] | None:
    """(gain, bias) of one affine node, or None if it is not a foldable constant Add/Mul/Div."""
    if not np.all(np.isfinite(const)):
        return None
    if op == "Add":
        if const.ndim > rank or const.size not in (1, o) or (const.size == o and const.shape[-1] != o):
            return None
        return 1.0, np.broadcast_to(const.reshape(-1), (o,)).astype(np.float64)
    if const.size != 1:
        return None
    c = float(const.reshape(-1)[0])
    if op == "Div":
        if not operand_first or c <= 0:
            return None
        c = 1.0 / c
    if c <= 0:
        return None
    return c, np.zeros(o)


def follow(ctx: LoweringContext, o: int, rank: int, allow_add: bool = True) -> Epilogue | None:
    """The longest foldable affine chain after the current node's output 0 (o channels, last axis), or None."""
    cur = ctx.current.output[0]
    gain, bias, err = 1.0, np.zeros(o), 0.0  # err: the intermediates' rounding, real units
    nodes: list[onnx.NodeProto] = []
    best: Epilogue | None = None
    for _ in range(8):
        if ctx.index.reaches_output(cur):
            break
        seen: list[onnx.NodeProto] = []
        users = ctx.index.uses(cur, seen)
        if len(users) != 1 or users[0].op_type not in ("Add", "Mul", "Div") or len(users[0].input) != 2:
            break
        nxt = users[0]
        direct = ctx.profile == "int" and not seen  # the QDQ model adds at the product's precision (qdq_linear)
        if nxt.op_type == "Add" and (not allow_add or (ctx.profile == "int" and not direct and not ctx.options.int_bias_add)):
            break
        if direct:
            pass  # no rounding between the product and this node: nothing to carry in err
        elif ctx.profile == "int":
            if [n.op_type for n in seen] != ["QuantizeLinear", "DequantizeLinear"]:
                break
            q_mid = ctx.qparams_of(seen[0])
            if not q_mid.is_per_tensor or q_mid.dtype != np.int8:
                break
            err += 0.5 * float(q_mid.s)
        elif seen:
            break
        which = [i for i, name in enumerate(nxt.input) if ctx.index.source(name) == cur]
        if len(which) != 1:
            break
        const = ctx.real_const(nxt.input[1 - which[0]])
        step = None if const is None else _step(const, nxt.op_type, which[0] == 0, o, rank)
        if step is None:
            break
        k, b = step
        exact = _int32_bias(ctx, nxt.input[1 - which[0]], o) if direct and not nodes and nxt.op_type == "Add" else None
        gain, bias, err = gain * k, bias * k + b, err * k
        nodes += [*seen, nxt]
        cur = nxt.output[0]
        out_q = None
        if ctx.profile == "int":
            qs = [n for n in ctx.consumers.get(cur, []) if n.op_type == "QuantizeLinear"]
            if not qs:
                break
            out_q = ctx.qparams_of(qs[0])
            if not out_q.is_per_tensor or err >= float(out_q.s):
                break
        best = Epilogue(gain, bias.copy(), cur, out_q, list(nodes), exact if gain == 1.0 else None)
    return best


def _int32_bias(ctx: LoweringContext, name: str, o: int) -> tuple[np.ndarray, np.ndarray] | None:
    """(int32 values, scales) of a bias given as a DequantizeLinear of an int32 initializer, broadcast to o."""
    dq = ctx.index.producer.get(name)
    if dq is None or dq.op_type != "DequantizeLinear":
        return None
    data = ctx.values.get(dq.input[0])
    if not isinstance(data, np.ndarray) or data.dtype != np.int32 or data.size not in (1, o):
        return None
    q = ctx.qparams_of(dq)
    if np.any(q.zero_point != 0):
        return None
    return (np.broadcast_to(data.reshape(-1), (o,)).copy(),
            np.broadcast_to(np.asarray(q.scale, np.float64).reshape(-1), (o,)).copy())
