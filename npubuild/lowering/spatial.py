"""Convolution and pooling windows in 2-D TOSA terms, for 1-D (rank-3) and 2-D (rank-4) ONNX ops.

TOSA 1.0 has only 2-D convolutions and pools, so a 1-D op on [N, C, L] runs as a
2-D op on the NHWC view [N, 1, L, C] (H = 1): kernel (1, k), stride (1, s),
dilation (1, d), ONNX pads [b, e] as [0, b, 0, e]. A 1-D result stays that
NHWC image (context.RowImage) for the next 1-D op, residual Add or Q/DQ: a stack
of Conv1d layers (a TCN, an audio front end) runs in rank 4 with no RESHAPE
between its layers. A reader that needs rank 3 gets the channels-last [N, L, C]
tensor (perm (0, 2, 1)), a free RESHAPE of it, so no TRANSPOSE either. 3-D ops
(rank 5) are refused here with a clear reason, so the host fallback can take them.
"""

from __future__ import annotations

from dataclasses import dataclass

from npubuild.lowering.context import CHANNELS_LAST_1D, NHWC, LoweringContext, RowImage, TTensor
from npubuild.lowering.emit import reshape, to_layout

__all__ = ["CHANNELS_LAST_1D", "Window", "as_nhwc", "direct_output", "from_nhwc", "spatial_rank", "window",
           "window_input"]


@dataclass(frozen=True)
class Window:
    """An ONNX window's attributes lifted to two spatial axes (H first)."""

    kernel: tuple[int, int]
    stride: tuple[int, int]
    dilation: tuple[int, int]
    onnx_pads: tuple[int, int, int, int]  # ONNX order: h_begin, w_begin, h_end, w_end
    auto_pad: str


def spatial_rank(ctx: LoweringContext, x: TTensor, what: str) -> int:
    """1 or 2 spatial axes; anything else is refused (UnsupportedOpError) so the node can go to the host."""
    rank = len(x.shape)
    if rank not in (3, 4):
        raise ctx.unsupported(f"only 1-D and 2-D {what} are supported (input rank {rank})")
    return rank - 2


def _lift(values, spatial: int, fill: int) -> tuple[int, ...]:
    values = tuple(int(v) for v in values)
    return (fill, *values) if spatial == 1 else values


def window(ctx: LoweringContext, spatial: int, kernel) -> Window:
    """The current node's kernel, strides, dilations, pads and auto_pad, as a 2-D window."""
    n = spatial
    kernel = _lift(kernel, n, 1)
    stride = _lift(ctx.attr("strides", [1] * n), n, 1)
    dilation = _lift(ctx.attr("dilations", [1] * n), n, 1)
    pads = [int(p) for p in ctx.attr("pads", [0] * 2 * n)]
    onnx_pads = (0, pads[0], 0, pads[1]) if n == 1 else tuple(pads)
    auto_pad = ctx.attr("auto_pad", b"NOTSET")
    auto_pad = auto_pad.decode() if isinstance(auto_pad, bytes) else str(auto_pad)
    if len(kernel) != 2 or len(stride) != 2 or len(dilation) != 2 or len(onnx_pads) != 4:
        raise ctx.unsupported("kernel, strides, dilations and pads do not match the input's spatial rank")
    return Window(kernel, stride, dilation, onnx_pads, auto_pad)  # type: ignore[arg-type]


def window_input(ctx: LoweringContext, i: int, what: str, any_view: bool = False) -> tuple[TTensor, int]:
    """Input i of a window op in NHWC and its spatial rank; a 1-D input held as a RowImage is its one-row
    image (`any_view`: the view it has, for a window over the whole length)."""
    row = ctx.row(i)
    if row is not None:
        return (row.image if any_view else ctx.row_view(row, row.length)), 1
    x = ctx.tensor(i)
    spatial = spatial_rank(ctx, x, what)
    return as_nhwc(ctx, x), spatial


def as_nhwc(ctx: LoweringContext, x: TTensor) -> TTensor:
    """A rank-4 tensor in NHWC; a rank-3 [N, C, L] one as the NHWC view [N, 1, L, C]."""
    if len(x.shape) == 4:
        return to_layout(ctx, x, NHWC)
    x = to_layout(ctx, x, CHANNELS_LAST_1D)
    n, length, c = x.shape
    return reshape(ctx, x, (n, 1, length, c), NHWC)


def from_nhwc(ctx: LoweringContext, y: TTensor, spatial: int, output_of: str | None) -> TTensor | RowImage:
    """The NHWC result of a window op as the node's value: as it is for 2-D; for 1-D the RowImage of it, or
    the [N, L, C] tensor where the value reaches a graph output (the output keeps the ONNX rank)."""
    if spatial == 2:
        return y
    if output_of is None or not ctx.index.reaches_output(output_of):
        return RowImage(y)
    n, h, w, c = y.shape
    return reshape(ctx, y, (n, h * w, c), CHANNELS_LAST_1D, output_of=output_of)


def direct_output(spatial: int, name: str | None) -> str | None:
    """The output name the NHWC emitter writes: the node's own for 2-D, None for 1-D (from_nhwc names it)."""
    return name if spatial == 2 else None
