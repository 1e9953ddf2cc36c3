"""QuantizeLinear / DequantizeLinear: they emit no TOSA themselves, they annotate tensors.

A DequantizeLinear of an initializer becomes a quantized constant (`QConst`)
for the op that reads it; a Q -> DQ pair on an activation says which int8
parameters that activation has. Ops lower straight to int8 by looking at the
QuantizeLinear after their output (`ctx.output_q`). A 1-D activation held as its
one-row image (context.RowImage) passes through as one, so the pair needs no RESHAPE.
"""

from __future__ import annotations

import numpy as np

from npubuild.lowering.context import GraphInput, LoweringContext, QConst, RowImage, TTensor
from npubuild.lowering.emit import requantize
from npubuild.lowering.input_staging import staged_input
from npubuild.lowering.registry import lowers

INT_TYPES = (np.int8, np.int16, np.int32)


@lowers("QuantizeLinear", "com.microsoft:QuantizeLinear")  # onnxruntime's contrib Q/DQ: 4- and 16-bit before opset 21
def quantize_linear(ctx: LoweringContext) -> None:
    node = ctx.current
    q = ctx.qparams_of(node)
    if q.dtype.type not in INT_TYPES:
        raise ctx.unsupported(f"{q.dtype} quantisation is not supported (use signed int8/int16)")
    if not q.is_per_tensor:
        raise ctx.unsupported("per-axis quantisation of activations is not supported")
    row = ctx.values.get(node.input[0])
    if isinstance(row, RowImage) and row.image.q is not None:
        ctx.set_output(0, row if row.image.q.same_as(q) else RowImage(requantize(ctx, row.image, q)))
        return
    src = ctx.value(node.input[0])
    if isinstance(src, GraphInput):
        value = ctx.input_value(src, q.dtype, q)
        ctx.set_output(0, staged_input(ctx, value, src.name) if isinstance(value, TTensor) else value)
    elif isinstance(src, TTensor):
        if src.q is None:
            raise ctx.unsupported("quantizing a float tensor inside the graph is not supported in the INT profile")
        ctx.set_output(0, requantize(ctx, src, q, output_of=None) if not src.q.same_as(q) else src)
    elif isinstance(src, np.ndarray):
        ctx.set_output(0, QConst(q.quantize(src), q))
    else:
        raise ctx.unsupported(f"cannot quantize a {type(src).__name__}")


@lowers("DequantizeLinear", "com.microsoft:DequantizeLinear")
def dequantize_linear(ctx: LoweringContext) -> None:
    node = ctx.current
    row = ctx.values.get(node.input[0])
    if isinstance(row, RowImage):
        ctx.set_output(0, row)
        return
    src = ctx.value(node.input[0])
    q = ctx.qparams_of(node)
    if isinstance(src, np.ndarray):
        ctx.set_output(0, QConst(src, q))
    elif isinstance(src, QConst):
        ctx.set_output(0, QConst(src.data, q))
    elif isinstance(src, TTensor):
        ctx.set_output(0, src)
    else:
        raise ctx.unsupported(f"cannot dequantize a {type(src).__name__}")
