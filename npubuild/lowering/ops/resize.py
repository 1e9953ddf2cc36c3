"""Spatial rearrangements on NHWC tensors: Resize, DepthToSpace, SpaceToDepth.

Resize maps each ONNX coordinate transformation onto TOSA RESIZE's integer
form in = (out * d + offset) / n (n, d, offset, border per axis). TOSA's
nearest neighbour rounds halves up; each ONNX nearest mode (floor, ceil,
round_prefer_floor/ceil) is met by searching (n, d, offset) for a set that
picks exactly ONNX's source indices (checked in exact arithmetic), trying
first the pixel-replication form (n = 2u, d = 2, offset = 1 - u), the only
one Vela 5.2 runs on U55/U65 (for u = 2, 4, 8). Int8 bilinear yields int32
values scaled by n_y * n_x; one RESCALE brings them back to int8. Vela 5.2
rejects TOSA bilinear RESIZE on U55/U65 (every parameter form we tried: its
legalisation wants the 1/(n_y n_x) RESCALE fused into the RESIZE, but with no
U55 hardware op for RESIZE it fuses no scale onto one); U85 runs both modes.
Vela also takes a NEAREST RESIZE whose output is 2 (in - 1) + 1 for
align_corners whatever its offset, so the replication keeps the full 2x size.
Lowered for the U55 and U65 families, half-pixel bilinear 2x
becomes replication + a depthwise blur, which U55/U65 run on the NPU (on U85
the native RESIZE is 16-24% faster on the example U-Nets, so it stays the default);
on U55 a large one read only by a channel Concat goes in two channel halves, so only
one half's replicated intermediate is live (the U-Nets' SRAM peak on U55).

Numerics (issue 21, verify/node_errors): the int32 bilinear sum is exact and rounds once, half up (TOSA
RESCALE has no half-to-even mode); onnxruntime interpolates the dequantised values in float32 and its
QuantizeLinear rounds half to even, so on an exact tie (k + 1/2: 6-11% of a half-pixel 2x upsample's
elements) the two differ by 1 LSB about half the time (the float32 sum itself lands on the other side in
~20% of ties). Measured: segmentation/unet resize_70 1 LSB on 1.74% of elements, every one +1; resize_52
and unet_torch's 0. The reference rounds differently, not the lowering twice: half to even would cost
three more int32 ops per element and stop Vela fusing the RESCALE into the U55 blur conv, and would still
differ from onnxruntime's float32 on a fifth of the ties.

DepthToSpace / SpaceToDepth are a RESHAPE, one rank-4/5 TRANSPOSE (the
semantics need it: channels move into space) and a RESHAPE, in NHWC.
"""

from __future__ import annotations

from fractions import Fraction
from math import gcd

import numpy as np
import tosa_serializer as ts

from npubuild.lowering.context import NHWC, VELA_MAX_DIM, LoweringContext, TTensor
from npubuild.lowering.convolution import acc_type, int_conv
from npubuild.lowering.emit import (
    Op,
    attr,
    requantize_dw,
    rescale,
    to_layout,
    transpose,
)
from npubuild.lowering.fusion.channel_parts import PartsTensor, feeds_channel_concat
from npubuild.lowering.movement import concat_phys, direct, finish, phys_reshape, result_q, slice_phys
from npubuild.lowering.quant import QParams, accumulator
from npubuild.lowering.registry import lowers

COORD_MODES = ("half_pixel", "pytorch_half_pixel", "asymmetric", "align_corners", "tf_half_pixel_for_nn")


def _str_attr(ctx: LoweringContext, name: str, default: str) -> str:
    v = ctx.attr(name, default)
    return v.decode() if isinstance(v, bytes) else v


def _ratio(ctx: LoweringContext, in_len: int, out_len: int, scale: float | None) -> Fraction:
    """out/in as ONNX uses it in the coordinate transform: the given scale, else sizes' ratio."""
    if scale is None:
        return Fraction(out_len, in_len)
    r = Fraction(scale).limit_denominator(1 << 10)
    if abs(float(r) - scale) > 1e-6 * scale:
        raise ctx.unsupported(f"scale {scale} is not a simple fraction")
    return r


def axis_params(ctx: LoweringContext, in_len: int, out_len: int, scale: float | None, coord: str,
                nearest: str | None) -> tuple[int, int, int, int]:
    """(n, d, offset, border) of one axis for TOSA RESIZE; nearest is the ONNX nearest_mode or None (linear)."""
    r = _ratio(ctx, in_len, out_len, scale)
    n, d, off = r.numerator, r.denominator, 0  # in = (out * d + off) / n
    if coord == "align_corners" or (coord == "pytorch_half_pixel" and out_len == 1):
        if out_len == 1 or in_len == 1:
            n, d = 1, 1
        else:  # x = out (in - 1) / (out - 1) with the floored output length, as onnxruntime and torch compute it
            # (ONNX's reference implementation uses in * scale unrounded for a scale that is not integral: 3.14
            # where onnxruntime gives 4.0 in test_resize_downsample_scales_linear_align_corners; the build checks
            # against onnxruntime, so its answer is the one lowered)
            g = gcd(out_len - 1, in_len - 1)
            n, d = (out_len - 1) // g, (in_len - 1) // g
    elif coord in ("half_pixel", "pytorch_half_pixel"):
        n, d, off = 2 * n, 2 * d, d - n  # (out + 1/2) * d/n - 1/2
    elif coord == "tf_half_pixel_for_nn":
        n, d, off = 2 * n, 2 * d, d  # (out + 1/2) * d/n
    if nearest is None:
        return _checked(ctx, in_len, out_len, n, d, off)
    want = _onnx_nearest(in_len, out_len, r, coord, nearest)
    for cn, cd, coff in _nearest_candidates(in_len, out_len, n, d, off):
        border = (out_len - 1) * cd - (in_len - 1) * cn + coff
        if _valid(cn, cd, coff, border) and _tosa_nearest(in_len, out_len, cn, cd, coff) == want:
            return cn, cd, coff, border
    raise ctx.unsupported(f"no TOSA RESIZE offset reproduces nearest_mode '{nearest}' for {in_len} -> {out_len}")


def _valid(n: int, d: int, off: int, border: int) -> bool:
    """TOSA 1.0 RESIZE parameter limits."""
    return 0 < n <= 2048 and 0 < d < 16 * n and -n <= off < 16 * n and -16 * n <= border < n


def _checked(ctx: LoweringContext, in_len: int, out_len: int, n: int, d: int, off: int) -> tuple[int, int, int, int]:
    border = (out_len - 1) * d - (in_len - 1) * n + off
    if not _valid(n, d, off, border):
        raise ctx.unsupported(f"the resize ratio {n}/{d} (offset {off}) is outside TOSA RESIZE's limits")
    return n, d, off, border


def _nearest_candidates(in_len: int, out_len: int, n: int, d: int, off: int):
    """Parameter sets to try, the replication form Vela runs on every Ethos-U first."""
    if out_len % in_len == 0 and out_len > in_len:
        u = out_len // in_len
        yield 2 * u, 2, 1 - u
    for mult in (1, 2, 4):
        span = min(n * mult, 64)
        for adj in sorted(range(-span, span + 1), key=lambda a: (abs(a), a)):
            yield n * mult, d * mult, off * mult + adj


def _onnx_nearest(in_len: int, out_len: int, r: Fraction, coord: str, mode: str) -> list[int]:
    """The source index ONNX picks for each output index, in exact arithmetic."""
    half = Fraction(1, 2)
    picks = []
    for o in range(out_len):
        if coord in ("half_pixel", "pytorch_half_pixel"):
            x = (o + half) / r - half if (out_len > 1 or coord == "half_pixel") else Fraction(0)
        elif coord == "asymmetric":
            x = o / r
        elif coord == "align_corners":
            x = Fraction(o * (in_len - 1), out_len - 1) if out_len > 1 else Fraction(0)
        else:  # tf_half_pixel_for_nn
            x = (o + half) / r
        i = {"round_prefer_floor": lambda v: -((-(v - half)).__floor__()),
             "round_prefer_ceil": lambda v: (v + half).__floor__(),
             "floor": lambda v: v.__floor__(),
             "ceil": lambda v: -((-v).__floor__())}[mode](x)
        picks.append(min(max(int(i), 0), in_len - 1))
    return picks


def _tosa_nearest(in_len: int, out_len: int, n: int, d: int, off: int) -> list[int] | None:
    """The source index TOSA RESIZE NEAREST picks (rounding halves up), None if it would read out of range."""
    picks = []
    for o in range(out_len):
        y = o * d + off
        i, rem = divmod(y, n)
        pick = min(i + 1, in_len - 1) if 2 * rem >= n else max(i, 0)
        if pick >= in_len:
            return None
        picks.append(pick)
    return picks


def _sizes_and_scales(ctx: LoweringContext, x: TTensor) -> tuple[tuple[int, int], tuple[float | None, float | None]]:
    """(out H, out W) and the scales given for them (None where sizes were given), read through `axes`:
    with axes = [3, 2] the first scale or size is W's."""
    shape = x.logical_shape
    axes = ctx.attr("axes")
    axes = [int(a) % 4 for a in axes] if axes is not None else [0, 1, 2, 3]
    if sorted(axes) not in ([2, 3], [0, 1, 2, 3]):
        raise ctx.unsupported("only resizing the two spatial axes is supported")
    scales, sizes = ctx.constant(2), ctx.constant(3)
    if sizes is not None and np.asarray(sizes).size:
        given = dict(zip(axes, (int(v) for v in np.asarray(sizes).reshape(-1)), strict=True))
        if given.get(0, shape[0]) != shape[0] or given.get(1, shape[1]) != shape[1]:
            raise ctx.unsupported("only the spatial axes can be resized")
        if ctx.attr("keep_aspect_ratio_policy", b"stretch") not in (b"stretch", "stretch"):
            raise ctx.unsupported("keep_aspect_ratio_policy other than stretch is not supported")
        return (given[2], given[3]), (None, None)
    if scales is None or not np.asarray(scales).size:
        raise ctx.unsupported("scales or sizes must be a constant")
    given_sc = dict(zip(axes, (float(v) for v in np.asarray(scales).reshape(-1)), strict=True))
    if given_sc.get(0, 1.0) != 1.0 or given_sc.get(1, 1.0) != 1.0:
        raise ctx.unsupported("only the spatial axes can be resized")
    sh, sw = given_sc[2], given_sc[3]
    return (int(np.floor(shape[2] * sh)), int(np.floor(shape[3] * sw))), (sh, sw)


@lowers("Resize")
def lower_resize(ctx: LoweringContext) -> None:
    x = ctx.tensor(0)
    if len(x.shape) != 4:
        raise ctx.unsupported("only 4-D (NCHW) Resize is supported")
    mode = _str_attr(ctx, "mode", "nearest")
    coord = _str_attr(ctx, "coordinate_transformation_mode", "half_pixel")
    if mode not in ("nearest", "linear"):
        raise ctx.unsupported(f"mode '{mode}' is not supported (nearest, linear)")
    if coord not in COORD_MODES or (coord == "tf_half_pixel_for_nn" and mode != "nearest"):
        raise ctx.unsupported(f"coordinate_transformation_mode '{coord}' is not supported with mode '{mode}'")
    if int(ctx.attr("antialias", 0)):
        raise ctx.unsupported("antialias is not supported")
    nearest = _str_attr(ctx, "nearest_mode", "round_prefer_floor") if mode == "nearest" else None
    x = to_layout(ctx, x, NHWC)
    (oh, ow), (sh, sw) = _sizes_and_scales(ctx, x)
    ny, dy, oy, by = axis_params(ctx, x.shape[1], oh, sh, coord, nearest)
    nx, dx, ox, bx = axis_params(ctx, x.shape[2], ow, sw, coord, nearest)
    shape = (x.shape[0], oh, ow, x.shape[3])
    ins = [x.name, ctx.shape_const([ny, dy, nx, dx]), ctx.shape_const([oy, ox]), ctx.shape_const([by, bx])]
    bilinear = mode == "linear"
    tosa_mode = ts.ResizeMode.BILINEAR if bilinear else ts.ResizeMode.NEAREST
    if not bilinear or x.q is None:
        out = ctx.new_tensor(shape, x.dtype, NHWC, x.q, output_of=direct(ctx, x.q))
        ctx.op(Op.RESIZE, ins, [out.name], attr("Resize", tosa_mode))
        finish(ctx, out)
        return
    if ctx.options.bilinear_2x and coord in ("half_pixel", "pytorch_half_pixel") \
            and (oh, ow) == (2 * x.shape[1], 2 * x.shape[2]) and (ny, dy, nx, dx) == (4, 2, 4, 2):
        finish(ctx, _bilinear_2x(ctx, x))
        return
    acc = ctx.new_tensor(shape, accumulator(x.dtype), NHWC)  # int48 for an int16 x
    ctx.op(Op.RESIZE, ins, [acc.name], attr("Resize", tosa_mode))
    finish(ctx, _unscale(ctx, acc, ny * nx, x))


def _bilinear_2x(ctx: LoweringContext, x: TTensor) -> TTensor:
    """Half-pixel bilinear 2x in int8 as every Ethos-U runs it: pixel replication (the only RESIZE form U55
    accepts) of the edge-padded input, a depthwise 3x3 [1, 2, 1] x [1, 2, 1] / 16 blur rounded once to the
    output over the replicated rows/columns inside the one-pixel margin.

    On replicated pixels u, out[2i] = (u[2i-1] + 2 u[2i] + u[2i+1]) / 4 = (v[i-1] + 3 v[i]) / 4, and
    likewise for odd outputs, which is exactly half-pixel bilinear; the edge pad is ONNX's clamping.

    The replicated intermediate (4x the input) is the SRAM peak of a U-Net on U55; Vela 5.2 has no strided
    write a TOSA graph can reach (its own 4-phase depthwise bilinear needs the 1/16 scale on the RESIZE; a
    stride-2 TRANSPOSE_CONV2D is a zero-upscaled full conv with its RESCALE left unfused: unet 448 KiB,
    +90k cycles; by regor's MoveConcatSliceToProducer a CONCAT or RESHAPE between the phases and the Concat
    is a whole copy), so on U55 (family_choices: U65 runs it faster whole) when a channel Concat is
    the one reader the channels go in two halves, each padded, replicated and blurred on its own and handed
    to the Concat as a separate input (channel_parts): one half's intermediate is live at a time. Example
    U-Nets on U55-128: SRAM 186.5 -> 177.5 KiB (unet), 195.0 -> 178.5 KiB (unet_torch); two halves keep
    every group a multiple of 8 channels (8-channel groups of the 32-channel upsample: +7850 cycles).
    """
    assert x.q is not None
    n, h, w, c = x.shape
    out_q = result_q(ctx, x.q)
    assert out_q is not None
    opts = ctx.options
    if opts.bilinear_channel_split and c % 16 == 0 and (2 * h + 4) * (2 * w + 4) * c >= opts.split_min_bytes \
            and feeds_channel_concat(ctx):
        g = c // 2
        # the row pad once for both halves where its body copy is a depthwise (on U55 always; U55-128: unet's
        # 32x32x16 -1216 cycles, unet_torch's 16x16x32 -976 for 1 KiB more SRAM), else per half, so each
        # half's body can be a depthwise copy where the whole one is not
        rows = _edge_pad(ctx, x, 1) if opts.shared_row_pad and opts.depthwise_pays(x, x.q) else None
        halves = [_edge_pad(ctx, rows, 2, (s, g)) if rows is not None else _edge_pad(ctx, _edge_pad(ctx, x, 1, (s, g)), 2)
                  for s in (0, g)]
        parts = [_blur(ctx, half, x.q, out_q, None) for half in halves]
        return PartsTensor("", (n, 2 * h, 2 * w, c), out_q.dtype, NHWC, out_q, parts=parts)
    return _blur(ctx, _edge_pad(ctx, _edge_pad(ctx, x, 1), 2), x.q, out_q, ctx.current.output[0])


def _blur(ctx: LoweringContext, padded: TTensor, in_q: QParams, out_q: QParams, output_of: str | None) -> TTensor:
    """Replicate the edge-padded input 2x and blur it to the output, rounding once to out_q."""
    n, hp, wp, c = padded.shape
    h, w = hp - 2, wp - 2
    if ctx.options.replicate_copies and padded.dtype == np.int8 and ctx.options.depthwise_pays(padded, in_q):
        up = _replicate_2x(ctx, padded)
    else:
        up = ctx.new_tensor((n, 2 * h + 4, 2 * w + 4, c), padded.dtype, NHWC, in_q)
        ins = [padded.name, ctx.shape_const([4, 2, 4, 2]), ctx.shape_const([-1, -1]), ctx.shape_const([1, 1])]
        ctx.op(Op.RESIZE, ins, [up.name], attr("Resize", ts.ResizeMode.NEAREST))
    # the blur reads only the rows/columns it needs (Vela folds an input SLICE into the conv's read), so its
    # result is the output itself and can be written straight into a consuming Concat (a SLICE after it
    # costs Vela a whole-tensor MemoryCopy there: 65760 cycles on the U-Net's 64x64x16 on U55-128)
    up = slice_phys(ctx, up, [0, 1, 1, 0], [n, 2 * h + 2, 2 * w + 2, c])
    blur = np.outer([1, 2, 1], [1, 2, 1]).astype(np.int8)
    weights = np.ascontiguousarray(np.broadcast_to(blur[:, :, None, None], (3, 3, c, 1)))  # HWCM
    acc = int_conv(ctx, Op.DEPTHWISE_CONV2D, up, weights, np.zeros(c, accumulator(up.dtype)), (n, 2 * h, 2 * w, c),
                   attr("DepthwiseConv2d", [0, 0, 0, 0], [1, 1], [1, 1], False, acc_type(up)))
    return rescale(ctx, acc, in_q.s / (16 * out_q.s), out_q.dtype, 0, out_q.zp, out_q, output_of=output_of)


def _replicate_2x(ctx: LoweringContext, x: TTensor) -> TTensor:
    """Each pixel of an int8 NHWC x twice along W and twice along H, the same values as RESIZE's 2x replication.

    CONCAT([x, x]) along C is [H, W, 2C], whose bytes are [H, 2W, C] with every pixel twice in a row; CONCAT([y, y])
    along W of that is [H, 4W, C], whose bytes are [2H, 2W, C] with every row twice: the RESHAPEs are views. Each
    CONCAT input is a 1x1 depthwise copy at x's own parameters (requantize_dw: bit-identical), so Vela writes it
    straight into the CONCAT where it would copy a tensor read twice with its slower MemoryCopy. On U55-128 the
    copies cost less than Vela's RESIZE, an AvgPool that upscales its input (about one output element a cycle): the
    U-Net's 34x34x32 replication 38338 -> 31808 cycles; a bare CONCAT of x with itself is slower (MemoryCopy).
    Only inside the bilinear 2x, where the blur reads the result: a nearest Resize's replication read by a Concat
    (the U-Net's skip) costs Vela a whole copy after the last RESHAPE (unet 577909 -> 607417 cycles with it). Only
    where the copies may be depthwise convs (depthwise_pays; size mode measures copies without one)."""
    assert x.q is not None
    n, h, w, c = x.shape
    rows = concat_phys(ctx, [requantize_dw(ctx, x, x.q), requantize_dw(ctx, x, x.q)], 3)
    rows = phys_reshape(ctx, rows, (n, h, 2 * w, c), x.perm)
    both = concat_phys(ctx, [requantize_dw(ctx, rows, x.q), requantize_dw(ctx, rows, x.q)], 2)
    return phys_reshape(ctx, both, (n, 2 * h, 2 * w, c), x.perm)


def _edge_pad(ctx: LoweringContext, x: TTensor, axis: int, ch: tuple[int, int] | None = None) -> TTensor:
    """One edge row (axis 1) or column (axis 2) on both sides of an NHWC tensor (of its channels
    ch = (start, count) only, if given). The edge slices read the
    body too, so Vela cannot write it into the CONCAT in place but copies it; where U55 runs a 1x1
    depthwise of ones faster than its MemoryCopy (LoweringOptions.depthwise_pays) the body is copied that way
    (U-Net 32x32x16 and 34x32x16 bodies on U55-128: 16640 -> 9280 and 17664 -> 9792 cycles)."""
    assert x.q is not None
    c0, cn = ch or (0, x.shape[3])
    size = [*x.shape[:3], cn]
    body = slice_phys(ctx, x, [0, 0, 0, c0], size)
    size[axis] = 1
    last = [0, 0, 0, c0]
    last[axis] = x.shape[axis] - 1
    body = requantize_dw(ctx, body, x.q) if ctx.options.depthwise_pays(body, x.q) else body
    return concat_phys(ctx, [slice_phys(ctx, x, [0, 0, 0, c0], size), body, slice_phys(ctx, x, last, size)], axis)


def _unscale(ctx: LoweringContext, acc: TTensor, factor: int, x: TTensor) -> TTensor:
    """The bilinear sums (values times `factor`; int32, or int48 for an int16 x) back to x's own parameters,
    rounding once."""
    assert x.q is not None
    out_of = direct(ctx, x.q)
    return rescale(ctx, acc, 1.0 / factor, x.dtype, 0, 0, x.q, output_of=out_of)


def _blocksize(ctx: LoweringContext, x: TTensor) -> int:
    b = int(ctx.attr("blocksize"))
    if len(x.shape) != 4 or b < 1:
        raise ctx.unsupported("a 4-D input and a positive blocksize are required")
    return b


@lowers("DepthToSpace")
def lower_depth_to_space(ctx: LoweringContext) -> None:
    x = to_layout(ctx, ctx.tensor(0), NHWC)
    b = _blocksize(ctx, x)
    n, h, w, c = x.shape
    if c % (b * b):
        raise ctx.unsupported(f"{c} channels do not divide by blocksize^2 = {b * b}")
    co = c // (b * b)
    dcr = _str_attr(ctx, "mode", "DCR") == "DCR"
    if dcr and ctx.options.depth_to_space_rows and w * b * co <= VELA_MAX_DIM:  # else the TRANSPOSE
        # output row h * b + i is channels [i * b * co, (i + 1) * b * co) of input row h, read as w * b pixels:
        # b channel SLICEs stacked along a new axis, no TRANSPOSE (LoweringOptions.depth_to_space_rows)
        rows = [phys_reshape(ctx, slice_phys(ctx, x, [0, 0, 0, i * b * co], [n, h, w, b * co]), (n, h, 1, w * b * co))
                for i in range(b)]
        t = concat_phys(ctx, rows, 2)
    elif dcr:  # channel = (i * b + j) * co + k
        v = phys_reshape(ctx, x, (n * h, w, b, b * co))
        t = transpose(ctx, v, (0, 2, 1, 3), (0, 1, 2, 3))
    else:  # CRD: channel = (k * b + i) * b + j
        v = phys_reshape(ctx, x, (n * h, w, co, b, b))
        t = transpose(ctx, v, (0, 3, 1, 4, 2), (0, 1, 2, 3, 4))
    finish(ctx, phys_reshape(ctx, t, (n, h * b, w * b, co), NHWC, output_of=direct(ctx, x.q)))


@lowers("SpaceToDepth")
def lower_space_to_depth(ctx: LoweringContext) -> None:
    x = to_layout(ctx, ctx.tensor(0), NHWC)
    b = _blocksize(ctx, x)
    n, h, w, c = x.shape
    if h % b or w % b:
        raise ctx.unsupported(f"spatial size {h}x{w} does not divide by blocksize {b}")
    v = phys_reshape(ctx, x, (n * h // b, b, w // b, b * c))
    t = transpose(ctx, v, (0, 2, 1, 3), (0, 1, 2, 3))
    finish(ctx, phys_reshape(ctx, t, (n, h // b, w // b, b * b * c), NHWC, output_of=direct(ctx, x.q)))
