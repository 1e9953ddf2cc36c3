"""Binary elementwise arithmetic: Add.

Integer Add follows the scheme every int8 runtime uses: both operands are
rescaled to int32 on a common scale with 20 bits of headroom, added, and
rescaled to the output; Vela fuses the three into one NPU elementwise op.
"""

from __future__ import annotations

import numpy as np

from npubuild.lowering.context import LoweringContext, TTensor
from npubuild.lowering.emit import Op, attr, rescale, reshape, to_layout
from npubuild.lowering.registry import lowers

HEADROOM_BITS = 20


def broadcast_operands(ctx: LoweringContext) -> tuple[TTensor, TTensor]:
    """Both inputs in one layout and one rank (TOSA broadcasts only between equal ranks)."""
    a, b = ctx.tensor(0), ctx.tensor(1)
    ra, rb = len(a.shape), len(b.shape)
    if ra < rb:
        a = _unsqueeze_front(ctx, a, rb)
    elif rb < ra:
        b = _unsqueeze_front(ctx, b, ra)
    layout = a.perm if len(a.shape) == 4 and a.perm != tuple(range(4)) else b.perm
    return to_layout(ctx, a, layout), to_layout(ctx, b, layout)


def _unsqueeze_front(ctx: LoweringContext, x: TTensor, rank: int) -> TTensor:
    logical = (1,) * (rank - len(x.shape)) + x.logical_shape
    x = to_layout(ctx, x, tuple(range(len(x.shape))))
    return reshape(ctx, x, logical, tuple(range(rank)))


def _out_shape(a: TTensor, b: TTensor) -> tuple[int, ...]:
    return tuple(int(max(p, q)) for p, q in zip(a.shape, b.shape, strict=True))


@lowers("Add")
def lower_add(ctx: LoweringContext) -> None:
    a, b = broadcast_operands(ctx)
    shape = _out_shape(a, b)
    out_name = ctx.current.output[0]
    if ctx.profile == "fp":
        out = ctx.new_tensor(shape, np.float32, a.perm, output_of=out_name)
        ctx.op(Op.ADD, [a.name, b.name], [out.name], attr("Add"))
        ctx.set_output(0, out)
        return
    out_q = ctx.require_output_q()
    if a.q is None or b.q is None:
        raise ctx.unsupported("both operands must be quantized")
    twice_max = 2.0 * max(a.q.s, b.q.s)
    a32 = rescale(ctx, a, a.q.s / twice_max * (1 << HEADROOM_BITS), np.int32, a.q.zp, 0, None)
    b32 = rescale(ctx, b, b.q.s / twice_max * (1 << HEADROOM_BITS), np.int32, b.q.zp, 0, None)
    acc = ctx.new_tensor(shape, np.int32, a.perm)
    ctx.op(Op.ADD, [a32.name, b32.name], [acc.name], attr("Add"))
    out_scale = twice_max / ((1 << HEADROOM_BITS) * out_q.s)
    ctx.set_output(0, rescale(ctx, acc, out_scale, out_q.dtype, 0, out_q.zp, out_q, output_of=out_name))
