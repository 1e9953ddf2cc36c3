"""Piecewise-linear activations that become CLAMP: Relu, Clip (Relu6).

In int8 the bounds are quantized into the output's parameters; if the input
has other parameters a RESCALE comes first. Vela fuses the CLAMP into the
producing op, so a Conv+Relu costs nothing extra.
"""

from __future__ import annotations

import numpy as np

from npubuild.lowering.context import LoweringContext, RowImage
from npubuild.lowering.emit import clamp, requantize
from npubuild.lowering.fusion.patterns import fusable
from npubuild.lowering.registry import lowers


def _clamp_real(ctx: LoweringContext, lo: float, hi: float) -> None:
    out_name = ctx.current.output[0]
    image = None if ctx.index.reaches_output(out_name) else ctx.row_image(0)  # a 1-D activation stays rank 4
    x = image if image is not None else ctx.tensor(0)
    out_of = None if image is not None else out_name
    if ctx.profile == "fp":
        y = clamp(ctx, x, max(lo, -3.4e38), min(hi, 3.4e38), output_of=out_of)
    else:
        out_q = ctx.require_output_q()
        x = requantize(ctx, x, out_q)
        qlo = out_q.qmin if lo == -np.inf else int(np.clip(np.round(lo / out_q.s) + out_q.zp, out_q.qmin, out_q.qmax))
        qhi = out_q.qmax if hi == np.inf else int(np.clip(np.round(hi / out_q.s) + out_q.zp, out_q.qmin, out_q.qmax))
        y = clamp(ctx, x, qlo, qhi, output_of=out_of)
    ctx.set_output(0, RowImage(y) if image is not None else y)


@lowers("Relu")
@fusable
def lower_relu(ctx: LoweringContext) -> None:
    _clamp_real(ctx, 0.0, np.inf)


@lowers("Clip")
@fusable
def lower_clip(ctx: LoweringContext) -> None:
    lo, hi = ctx.attr("min", -np.inf), ctx.attr("max", np.inf)  # opset < 11
    if ctx.has_input(1):
        v = ctx.constant(1)
        if v is None:
            raise ctx.unsupported("Clip min must be a constant")
        lo = float(v)
    if ctx.has_input(2):
        v = ctx.constant(2)
        if v is None:
            raise ctx.unsupported("Clip max must be a constant")
        hi = float(v)
    _clamp_real(ctx, min(float(lo), float(hi)), float(hi))  # ONNX: min > max sets every value to max
