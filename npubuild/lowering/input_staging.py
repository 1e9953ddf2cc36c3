"""U85: a narrow image input copied into SRAM in long rows before the first convolution reads it.

With Dedicated_Sram the graph input lives in DRAM, and a convolution reading a 3-channel NHWC input fetches
it a few bytes per burst: MobileNetV1's first conv on U85-256 spends 82265 cycles on its DRAM reads for 13809
NPU cycles. Viewed as [N, H, 1, W*C] the input is one long contiguous row per image row; an elementwise
MAXIMUM of it with itself (fusion/concat_copy.max_copy: the same integers, no constant) reads it in long
bursts and writes a copy Vela keeps in SRAM, which the conv then reads at SRAM latency (LoweringOptions.
staged_input_min_row; measurements in bench/perf_choices.md).
"""

from __future__ import annotations

from npubuild.lowering.context import NHWC, LoweringContext, TTensor, identity
from npubuild.lowering.fusion.concat_copy import fits_max_copy, max_copy, max_copy_rows

MAX_CHANNELS = 4  # from 8 channels on, the NHWC reads are full bricks already


def staged_input(ctx: LoweringContext, t: TTensor, onnx_name: str) -> TTensor:
    """Graph input `t` (ONNX `onnx_name`), copied (input_copy) or copied as long rows when the family's
    options say it pays; else `t` itself."""
    if ctx.options.input_copy and fits_max_copy(t):
        return max_copy(ctx, t)
    if len(t.shape) != 4 or not fits_max_copy(t):
        return t
    # NHWC bytes: an NCHW input laid out NHWC, or an NHWC image as it is (LoweringContext.nhwc_image)
    if t.perm != NHWC and not (t.perm == identity(4) and ctx.nhwc_image(onnx_name)):
        return t
    n, h, w, c = t.shape
    if c > MAX_CHANNELS:
        return t
    # the option read only for an input it could stage: one it cannot lowers alike with or without it, and the
    # stage's Lowerings shares such a graph (ethosu/families.Lowerings: PP-OCRv4 det's planar U65 input)
    least = ctx.options.staged_input_min_row
    if least is None or w * c < least or _folded_by_a_reader(ctx, onnx_name, c):
        return t
    return max_copy_rows(ctx, t)


def _folded_by_a_reader(ctx: LoweringContext, onnx_name: str, channels: int) -> bool:
    """Whether a reader is a stride-2 conv the family runs on the input's space-to-depth view: that view is
    a copy into SRAM already, and a second one only costs (U65 28x28x1 stride-2 stem: 5568 -> 6051 cycles)."""
    if not ctx.options.space_to_depth(channels):
        return False
    return any(u.op_type == "Conv" and list(_ints(u, "strides")) == [2, 2] for u in ctx.index.uses(onnx_name, []))


def _ints(node, name: str) -> list[int]:
    return next((list(a.ints) for a in node.attribute if a.name == name), [])
