"""Strided convolutions as stride-1 ones on a view of the input whose blocks are channels (the same integers).

fold_stride: a stride-2 convolution of a narrow input on its 2x2 space-to-depth view. patch_view: a conv whose
kernel is its stride (a patch embedding) as a 1x1 conv. column_blocks: a conv strided past 3 along W (an STFT
as a conv) on its W-block view, which in NHWC is a RESHAPE.

An Ethos-U convolution consumes input channels in bricks (8 or 16 at a time): a 1- or 3-channel image stem
leaves most of the MAC array idle (DS-CNN's 10x4 stride-2 conv on its 49x10x1 spectrogram: 26201 cycles on
U55-128 for 320000 MACs, 8% utilisation). Every 2x2 block of the input becomes one position of 4C channels
(phase-major: channel (ph * 2 + pw) * C + c), and the kernel the same way, with zero taps where the 2x2 grid
of kernel positions overhangs the original kernel: y[o] = sum_j w[j] x[2o + j - t] is unchanged, term for
term, so the int32 sums are the same integers. The view is either a one-hot 2x2 stride-2 CONV2D (each output
channel copies one input of its block; U55, which runs it in a few hundred cycles) or an H/W-swapping TRANSPOSE
of the input after a PAD where H or W is odd (U65 by default: the conv view measures faster on some models and
slower on others there). LoweringOptions.space_to_depth_channels and space_to_depth_conv; measurements in
bench/perf_choices.md.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from npubuild.lowering.context import NHWC, LoweringContext, TTensor, identity
from npubuild.lowering.convolution import acc_type, exact_pads, int_conv, slice_hw
from npubuild.lowering.emit import Op, attr, rescale, reshape, transpose
from npubuild.lowering.movement import pad_phys


@dataclass(frozen=True)
class _Axis:
    """One spatial axis of the rewrite: blocks of input, block padding before/after, kernel shift, blocks, and
    the zero-point rows or columns the view puts before the input (`lead`)."""

    blocks: int
    before: int
    after: int
    shift: int
    kernel: int
    lead: int = 0


def _axis(n: int, k: int, before: int, after: int, lead: int = 0) -> _Axis | None:
    """The block-domain geometry of a stride-2 axis of n inputs, kernel k, pads (before, after), the view
    starting `lead` (<= before) padding entries before the input; None if the original conv leaves trailing
    input unread (the view would need a SLICE too)."""
    out = (n - 1 + before + after - (k - 1)) // 2 + 1
    before -= lead
    pad_blocks = -(-before // 2)
    shift = 2 * pad_blocks - before
    kernel = -(-(k + shift) // 2)
    blocks = -(-(n + lead) // 2)
    after_blocks = out - 1 + kernel - blocks - pad_blocks
    if after_blocks < 0:
        return None
    return _Axis(blocks, pad_blocks, after_blocks, shift, kernel, lead)


def fold_stride(ctx: LoweringContext, x: TTensor, w_oihw: np.ndarray, pads: list[int], stride, dilation,
                max_channels: int) -> tuple[TTensor, np.ndarray, list[int]] | None:
    """(the space-to-depth view of x, its kernel, its TOSA pads) for a stride-1 conv with the same integers,
    or None where the rewrite does not apply (not stride 2, dilated, wide, batched or not per-tensor int8)."""
    n, h, w, c = x.shape
    if (tuple(stride) != (2, 2) or tuple(dilation) != (1, 1) or c > max_channels or n != 1 or x.q is None
            or x.dtype != np.int8 or not x.q.is_per_tensor):
        return None
    # An odd leading pad shifts the kernel by one in the block grid, which costs an even kernel one more block
    # of taps (DS-CNN's 10x4 kernel, left pad 1: 5x3 blocks, 480000 MACs for 320000). The one-hot conv view
    # pads for free, so there it starts a zero-point row or column early instead: ceil(k / 2) blocks again.
    # (An odd kernel takes ceil(k / 2) blocks either way, and the early start only makes the view larger.)
    early = ctx.options.space_to_depth_conv
    kh, kw = w_oihw.shape[2], w_oihw.shape[3]
    rows = _axis(h, kh, pads[0], pads[1], pads[0] % 2 if early and kh % 2 == 0 else 0)
    cols = _axis(w, kw, pads[2], pads[3], pads[2] % 2 if early and kw % 2 == 0 else 0)
    if rows is None or cols is None:
        return None
    return _view(ctx, x, rows, cols), _kernel(w_oihw, rows, cols), [rows.before, rows.after, cols.before, cols.after]


def _view(ctx: LoweringContext, x: TTensor, rows: _Axis, cols: _Axis) -> TTensor:
    if ctx.options.space_to_depth_conv:
        return _view_by_conv(ctx, x, rows, cols)
    _, h, w, c = x.shape
    if 2 * cols.blocks != w:  # an odd width: one more column (and maybe row) of the zero point
        x = pad_phys(ctx, x, [0, 0, 0, 0], [0, 2 * rows.blocks - h, 2 * cols.blocks - w, 0])
    elif 2 * rows.blocks != h:  # an odd height only: one more row, appended to the flat bytes in one copy
        flat = reshape(ctx, x, (1, 1, 1, h * w * c), identity(4))  # (a 1-channel NHWC PAD copies a byte a
        x = pad_phys(ctx, flat, [0, 0, 0, 0], [0, 0, 0, w * c])  # cycle: DS-CNN U55-128 0.1596 -> 0.1536 ms)
    pairs = reshape(ctx, x, (rows.blocks, 2, cols.blocks, 2 * c), identity(4))
    blocked = transpose(ctx, pairs, (0, 2, 1, 3), identity(4))
    return reshape(ctx, blocked, (1, rows.blocks, cols.blocks, 4 * c), NHWC)


def _view_by_conv(ctx: LoweringContext, x: TTensor, rows: _Axis, cols: _Axis) -> TTensor:
    """x's 2x2 blocks as channels: a 2x2 stride-2 CONV2D whose output channel (ph * 2 + pw) * C + c has one
    weight, 1, on input (ph, pw, c), and a RESCALE of scale 1 back to x's parameters. With x's zero point as the
    conv's input zero point the sum is x - zp exactly, and its padding (the leading rows and columns, an odd
    side's last) reads as zp: every output integer is the input's."""
    _, h, w, c = x.shape
    assert x.q is not None
    one_hot = np.zeros((4 * c, 2, 2, c), np.int8)  # OHWI
    for ph in range(2):
        for pw in range(2):
            one_hot[(ph * 2 + pw) * c + np.arange(c), ph, pw, np.arange(c)] = 1
    pads = [rows.lead, 2 * rows.blocks - h - rows.lead, cols.lead, 2 * cols.blocks - w - cols.lead]
    sums = int_conv(ctx, Op.CONV2D, x, one_hot, np.zeros(4 * c, np.int32), (1, rows.blocks, cols.blocks, 4 * c),
                    attr("Conv2d", pads, [2, 2], [1, 1], False, acc_type(x)))
    return rescale(ctx, sums, 1.0, x.dtype, 0, x.q.zp, x.q)


def _kernel(w_oihw: np.ndarray, rows: _Axis, cols: _Axis) -> np.ndarray:
    o, c, kh, kw = w_oihw.shape
    grid = np.zeros((o, c, 2 * rows.kernel, 2 * cols.kernel), w_oihw.dtype)
    grid[:, :, rows.shift:rows.shift + kh, cols.shift:cols.shift + kw] = w_oihw
    blocks = grid.reshape(o, c, rows.kernel, 2, cols.kernel, 2).transpose(0, 3, 5, 1, 2, 4)
    return blocks.reshape(o, 4 * c, rows.kernel, cols.kernel)


def patch_view(ctx: LoweringContext, x: TTensor, w_oihw: np.ndarray, pads: list[int], stride, dilation,
               min_stride: int | None) -> tuple[TTensor, np.ndarray] | None:
    """(the input's patch view, the kernel as 1x1) for a conv whose kernel is its stride (ConvNeXt's and a
    ViT's patch embedding): each sh x sw patch is one position of sh * sw * C channels, channel
    (ph * sw + pw) * C + c, and the kernel the same way, so the int32 sums are the same integers; or None.

    Ethos-U convolves at strides up to 3: Vela 5.2 runs a stride-4 conv as one small conv per output position
    (ConvNeXt's 4x4 / 4 stem on a 64x64x3 image: 256 convs, 623k of the network's 774k cycles on U55-128).
    The view costs one TRANSPOSE of the input (LoweringOptions.patch_conv_min_stride)."""
    n, h, w, c = x.shape
    sh, sw = stride
    kh, kw = w_oihw.shape[2], w_oihw.shape[3]
    if (min_stride is None or max(sh, sw) < min_stride or (kh, kw) != (sh, sw) or tuple(dilation) != (1, 1)
            or any(pads) or h % sh or w % sw or n != 1 or x.q is None or x.dtype != np.int8):
        return None
    rows = reshape(ctx, x, (h // sh, sh, w // sw, sw * c), identity(4))
    patches = transpose(ctx, rows, (0, 2, 1, 3), identity(4))
    view = reshape(ctx, patches, (1, h // sh, w // sw, sh * sw * c), NHWC)
    o = w_oihw.shape[0]
    return view, np.ascontiguousarray(w_oihw.transpose(0, 2, 3, 1).reshape(o, sh * sw * c, 1, 1))


@dataclass(frozen=True)
class ColumnBlocks:
    """A conv strided s >= 4 along W as a stride-1 conv on the input's W-block view [N, H, W / s, s C]
    (column_blocks): the blocks of input it keeps, its pads in blocks and the kernel's offset in its block grid."""

    stride: int
    blocks: int  # whole input blocks the view keeps (their s * blocks columns; a tail no tap reads is sliced off)
    before: int  # zero-point blocks before the input
    after: int  # ... and after it
    shift: int  # the kernel's first tap within its block grid (s * before - the ONNX left pad)
    kernel: int  # kernel width in blocks

    @property
    def pads(self) -> tuple[int, int]:
        return self.before, self.after


def _column_blocks(w: int, k: int, s: int, before: int, after: int) -> ColumnBlocks | None:
    """The block geometry of a W axis of w inputs, kernel k, stride s, ONNX pads (before, after); None where a
    tap reads a column of a partial last block (the view would need a PAD of the zero point first)."""
    out = (w - 1 + before + after - (k - 1)) // s + 1
    if out < 1:
        return None
    pad_blocks = -(-before // s)
    shift = pad_blocks * s - before
    kernel = -(-(k + shift) // s)
    span = out - 1 + kernel  # blocks the outputs read, padding included
    blocks = min(w // s, span - pad_blocks)
    last_read = (out - 1) * s + k - 1 - before  # the last input column a tap reads (past w: ONNX's padding)
    if blocks < 1 or min(last_read, w - 1) >= blocks * s:
        return None
    return ColumnBlocks(s, blocks, pad_blocks, span - pad_blocks - blocks, shift, kernel)


def column_blocks(ctx: LoweringContext, x: TTensor, w_oihw: np.ndarray, pads: list[int], stride, dilation,
                  min_stride: int | None) -> tuple[TTensor, np.ndarray, list[int]] | None:
    """(the W-block view of x, its kernel, its TOSA pads) for a conv strided s >= min_stride along W and at most
    3 along H (an STFT as a conv: openWakeWord's 512-tap, hop-160 filters; an audio front end's strided 1-D
    conv), or None.

    Ethos-U convolves at strides up to 3: Vela 5.2 runs a larger one as one conv per output position, and a
    narrow input uses a few rows of the MAC array (the melspectrogram's two 257 x 512 filters over 1760 samples
    in one channel: 16 convs, 2.50 M of its 2.54 M cycles on U55-128). Each run of s columns is one position of
    s * C channels (channel p * C + c: in NHWC a RESHAPE, no copy), the kernel the same way with zero taps
    where its block grid overhangs it: y[o] = sum_j w[j] x[s o + j - before] term for term, the same integers.
    The view reads whole blocks, so a tail no tap reads is sliced off (TOSA's exact output size) and a
    partial last block that a tap reads is left to the strided conv."""
    n, h, w, c = x.shape
    sh, sw = stride
    if (min_stride is None or sw < min_stride or sh > 3 or dilation[1] != 1 or n != 1 or x.q is None
            or x.perm != NHWC or x.dtype not in (np.int8, np.int16)):
        return None
    kh, kw = w_oihw.shape[2], w_oihw.shape[3]
    cols = _column_blocks(w, kw, sw, pads[2], pads[3])
    if cols is None:
        return None
    row_pads, (keep_h, _) = exact_pads((h, w), (kh, kw), stride, dilation, pads)
    x = slice_hw(ctx, x, (keep_h, cols.blocks * sw))
    view = reshape(ctx, x, (n, keep_h, cols.blocks, sw * c), NHWC)
    o = w_oihw.shape[0]
    grid = np.zeros((o, c, kh, cols.kernel * sw), w_oihw.dtype)
    grid[:, :, :, cols.shift:cols.shift + kw] = w_oihw
    kernel = grid.reshape(o, c, kh, cols.kernel, sw).transpose(0, 4, 1, 2, 3).reshape(o, sw * c, kh, cols.kernel)
    return view, np.ascontiguousarray(kernel), [row_pads[0], row_pads[1], *cols.pads]
