"""Reshape-like ops: Reshape, Flatten.

A reshape of an NHWC tensor keeps NHWC when only unit dimensions move (e.g.
[N, C, 1, 1] -> [N, C] after a global pool); otherwise the logical NCHW order
is restored first with one TRANSPOSE, because the model's semantics need it.
"""

from __future__ import annotations

import numpy as np

from npubuild.lowering.context import NHWC, LoweringContext, TTensor, identity
from npubuild.lowering.emit import order_preserved, requantize, reshape, to_layout
from npubuild.lowering.registry import lowers


def reshape_logical(ctx: LoweringContext, x: TTensor, new_shape: tuple[int, ...]) -> TTensor:
    """Reshape by the logical (ONNX) shape, picking the cheapest physical layout."""
    out_name = ctx.current.output[0]
    out_layout = NHWC if len(new_shape) == 4 else identity(len(new_shape))
    if x.perm != identity(len(x.shape)) and not order_preserved(x.logical_shape, x.perm):
        x = to_layout(ctx, x, identity(len(x.shape)))
    # x's physical element order now equals its logical order.
    if not order_preserved(new_shape, out_layout):
        out_layout = identity(len(new_shape))
    phys = tuple(new_shape[i] for i in out_layout)
    q_out = ctx.output_q() if ctx.profile == "int" else None
    if q_out is not None and x.q is not None and not x.q.same_as(q_out):
        return requantize(ctx, reshape(ctx, x, phys, out_layout), q_out, output_of=out_name)
    return reshape(ctx, x, phys, out_layout, output_of=out_name)


def _target_shape(ctx: LoweringContext, x: TTensor, spec: np.ndarray) -> tuple[int, ...]:
    src = x.logical_shape
    allowzero = int(ctx.attr("allowzero", 0))
    out = [int(s) if (s != 0 or allowzero) else src[i] for i, s in enumerate(spec)]
    if -1 in out:
        known = int(np.prod([s for s in out if s != -1]))
        out[out.index(-1)] = int(np.prod(src)) // max(known, 1)
    if int(np.prod(out)) != int(np.prod(src)):
        raise ctx.unsupported(f"cannot reshape {list(src)} to {out}")
    return tuple(out)


@lowers("Reshape")
def lower_reshape(ctx: LoweringContext) -> None:
    x = ctx.tensor(0)
    spec = ctx.constant(1)
    if spec is None:
        raise ctx.unsupported("the target shape must be a constant (static shapes are set at import)")
    ctx.set_output(0, reshape_logical(ctx, x, _target_shape(ctx, x, spec.astype(np.int64).reshape(-1))))


@lowers("Flatten")
def lower_flatten(ctx: LoweringContext) -> None:
    x = ctx.tensor(0)
    shape = x.logical_shape
    axis = int(ctx.attr("axis", 1))
    axis = axis + len(shape) if axis < 0 else axis
    new = (int(np.prod(shape[:axis])), int(np.prod(shape[axis:])))
    ctx.set_output(0, reshape_logical(ctx, x, new))
