"""Data-movement ops: Concat, Split, Slice, Gather and GatherElements (constant indices), Pad, Tile, Expand.

All work in the tensor's current layout: a logical axis is mapped to its
physical position through `perm`, so a channel Concat of NHWC tensors is a
CONCAT on axis 3 and needs no TRANSPOSE. Everything is built from SLICE,
CONCAT, PAD, TILE, RESHAPE and REVERSE, which Vela runs on every Ethos-U
(U55/U65 have no GATHER, so index lists become slices of contiguous runs).
"""

from __future__ import annotations

import numpy as np

from npubuild.lowering.context import GraphInput, LoweringContext, TTensor, identity
from npubuild.lowering.emit import Op, attr, requantize, requantize_dw, to_layout
from npubuild.lowering.fusion.channel_parts import concat_inputs
from npubuild.lowering.fusion.concat_copy import fits_max_copy, max_copy
from npubuild.lowering.movement import (
    concat_phys,
    constant_ints,
    decimate,
    direct,
    finish,
    norm_axis,
    pad_phys,
    phys_axis,
    phys_reshape,
    reshape_to,
    result_q,
    slice_axis,
)
from npubuild.lowering.options import ConcatCopy
from npubuild.lowering.quant import QParams
from npubuild.lowering.registry import lowers


def _layout_of_inputs(ctx: LoweringContext) -> tuple[int, ...] | None:
    """The layout most activation inputs already have (first one wins a tie), None if all are constants."""
    counts: dict[tuple[int, ...], int] = {}
    for i, name in enumerate(ctx.current.input):
        if name and isinstance(ctx.value(name), TTensor | GraphInput):
            perm = ctx.tensor(i).perm
            counts[perm] = counts.get(perm, 0) + 1
    return max(counts, key=lambda p: counts[p]) if counts else None


def _copied(ctx: LoweringContext, i: int) -> bool:
    """Whether Vela must copy Concat input i into the output (it writes a producer's result in place only
    when the Concat is its one reader): on U55 a 1x1 depthwise of ones makes that copy about twice as fast
    as Vela's MemoryCopy (U-Net skip 64x64x8 on U55-128: 32928 -> 17472 cycles) and is written in place;
    on U85 an elementwise MAXIMUM of the input with itself is four times as fast, with no constant (concat_copy)."""
    name = ctx.current.input[i]
    return isinstance(ctx.value(name), GraphInput) or len(ctx.consumers.get(name, [])) > 1


@lowers("Concat")
def lower_concat(ctx: LoweringContext) -> None:
    names = list(ctx.current.input)
    layout = _layout_of_inputs(ctx)
    first = next((ctx.tensor(i) for i, n in enumerate(names) if isinstance(ctx.value(n), TTensor)), None)
    if layout is None or first is None:
        raise ctx.unsupported("Concat of constants only should have been folded at import")
    q = result_q(ctx, first.q)
    axis = layout.index(norm_axis(ctx, int(ctx.attr("axis")), len(layout)))
    parts = []
    for i, n in enumerate(names):
        if not n:
            continue
        copied = _copied(ctx, i)
        for t in concat_inputs(ctx, i, layout, axis, q):  # an input made of channel groups adds each group
            t = _operand(ctx, t, q, copied)
            if 0 not in t.shape:
                parts.append(t)
    out = concat_phys(ctx, parts, axis, output_of=ctx.current.output[0])
    finish(ctx, out)


def _operand(ctx: LoweringContext, t: TTensor, q: QParams | None, copied: bool) -> TTensor:
    """A Concat input as the Concat takes it: at the output's scale, and copied the family's fast way."""
    if q is None or t.q is None:
        return t
    if not t.q.same_as(q):
        return requantize(ctx, t, q)  # int8 operands with other scales move to the output's
    how = ctx.options.concat_copy
    if copied and how == ConcatCopy.DEPTHWISE and ctx.options.depthwise_pays(t, q):
        return requantize_dw(ctx, t, q)
    if copied and how == ConcatCopy.MAXIMUM and fits_max_copy(t):
        return max_copy(ctx, t)
    return t


def _split_sizes(ctx: LoweringContext, dim: int) -> list[int]:
    n_out = len(ctx.current.output)
    sizes = constant_ints(ctx, 1, "split")
    if sizes is None and ctx.attr("split") is not None:
        sizes = [int(v) for v in ctx.attr("split")]
    if sizes is None:
        n = int(ctx.attr("num_outputs", n_out))
        chunk = -(-dim // n)
        sizes = [chunk] * (n - 1) + [dim - chunk * (n - 1)]
    if sum(sizes) != dim or len(sizes) != n_out or min(sizes) <= 0:
        raise ctx.unsupported(f"split sizes {sizes} do not split a dimension of {dim} into {n_out} outputs")
    return sizes


@lowers("Split")
def lower_split(ctx: LoweringContext) -> None:
    x = ctx.tensor(0)
    axis = norm_axis(ctx, int(ctx.attr("axis", 0)), len(x.shape))
    start = 0
    for i, size in enumerate(_split_sizes(ctx, x.logical_shape[axis])):
        if ctx.current.output[i]:
            finish(ctx, slice_axis(ctx, x, axis, start, size, output_of=direct(ctx, x.q, i)), i)
        start += size


def _reverse(ctx: LoweringContext, x: TTensor, axis: int) -> TTensor:
    """REVERSE a logical axis, always as the W axis of an [1, outer, L, inner] view (U55/U65 reverse only H or W)."""
    p = phys_axis(x, axis)
    if x.shape[p] == 1:
        return x
    outer, inner = int(np.prod(x.shape[:p])), int(np.prod(x.shape[p + 1:]))
    view = phys_reshape(ctx, x, (1, outer, x.shape[p], inner))
    out = ctx.new_tensor(view.shape, x.dtype, view.perm, x.q)
    ctx.op(Op.REVERSE, [view.name], [out.name], attr("Reverse", 2))
    return phys_reshape(ctx, out, x.shape, x.perm)


def take(ctx: LoweringContext, x: TTensor, axis: int, start: int, stop: int, step: int) -> TTensor:
    """x[..., start:stop:step, ...] on a logical axis, bounds already clamped as ONNX Slice does."""
    idx = list(range(start, stop, step))
    if not idx:
        raise ctx.unsupported("a Slice producing an empty tensor is not supported")
    if step > 0:
        return decimate(ctx, x, axis, idx[0], step, len(idx))
    return _reverse(ctx, decimate(ctx, x, axis, idx[-1], -step, len(idx)), axis)


@lowers("Slice")
def lower_slice(ctx: LoweringContext) -> None:
    x = ctx.tensor(0)
    shape = x.logical_shape
    starts, ends = constant_ints(ctx, 1, "starts"), constant_ints(ctx, 2, "ends")
    if starts is None or ends is None:
        raise ctx.unsupported("starts and ends are required")
    axes = constant_ints(ctx, 3, "axes") or list(range(len(starts)))
    steps = constant_ints(ctx, 4, "steps") or [1] * len(starts)
    t = x
    for s, e, a, st in zip(starts, ends, axes, steps, strict=True):
        a = norm_axis(ctx, a, len(shape))
        dim = shape[a]
        if st == 0:
            raise ctx.unsupported("a Slice step of 0 is invalid")
        s = s + dim if s < 0 else s
        e = e + dim if e < 0 else e
        if st > 0:
            s, e = min(max(s, 0), dim), min(max(e, 0), dim)
        else:
            s, e = min(max(s, 0), dim - 1), min(max(e, -1), dim - 1)
        t = take(ctx, t, a, s, e, st)
    finish(ctx, t)


def _runs(idx: list[int]) -> list[tuple[int, int]]:
    """Consecutive ascending runs of indices as (start, length)."""
    runs: list[tuple[int, int]] = []
    for i in idx:
        if runs and runs[-1][0] + runs[-1][1] == i:
            runs[-1] = (runs[-1][0], runs[-1][1] + 1)
        else:
            runs.append((i, 1))
    return runs


def _gather_operands(ctx: LoweringContext) -> tuple[np.ndarray, TTensor, tuple[int, ...], int]:
    """A Gather's or GatherElements' constant indices, data tensor, its logical shape and the axis."""
    idx = ctx.constant(1)
    if idx is None:
        raise ctx.unsupported("only constant indices are supported (U55/U65 have no GATHER)")
    x = ctx.tensor(0)
    shape = x.logical_shape
    return idx, x, shape, norm_axis(ctx, int(ctx.attr("axis", 0)), len(shape))


@lowers("Gather")
def lower_gather(ctx: LoweringContext) -> None:
    """Constant indices: slices of the contiguous index runs, one CONCAT, and a reshape to the output's rank."""
    idx, x, shape, axis = _gather_operands(ctx)
    dim = shape[axis]
    idx = np.asarray(idx, np.int64)
    flat = [int(i) + dim if i < 0 else int(i) for i in idx.reshape(-1)]
    if not flat or any(not 0 <= i < dim for i in flat):
        raise ctx.unsupported(f"indices {idx.reshape(-1).tolist()} are out of range for a dimension of {dim}")
    parts = [slice_axis(ctx, x, axis, s, n) for s, n in _runs(flat)]
    t = concat_phys(ctx, parts, phys_axis(x, axis))
    out_shape = (*shape[:axis], *idx.shape, *shape[axis + 1:])
    finish(ctx, reshape_to(ctx, t, out_shape, output_of=direct(ctx, x.q)))


@lowers("GatherElements")
def lower_gather_elements(ctx: LoweringContext) -> None:
    """Constant indices pick a fixed set of elements: their flat positions in the row-major input, as the
    contiguous runs of a [1, N] view (SLICEs and one CONCAT), reshaped to the indices' shape."""
    idx, x, shape, axis = _gather_operands(ctx)
    idx = np.asarray(idx, np.int64)
    if idx.ndim != len(shape) or any(idx.shape[a] > shape[a] for a in range(len(shape)) if a != axis):
        raise ctx.unsupported(f"indices of shape {list(idx.shape)} do not fit data of shape {list(shape)}")
    idx = np.where(idx < 0, idx + shape[axis], idx)
    if np.any(idx < 0) or np.any(idx >= shape[axis]):
        raise ctx.unsupported(f"indices out of range for a dimension of {shape[axis]}")
    grid = list(np.indices(idx.shape))
    grid[axis] = idx
    flat = np.ravel_multi_index(tuple(grid), shape).reshape(-1)
    row = reshape_to(ctx, to_layout(ctx, x, identity(len(shape))), (1, int(np.prod(shape))))
    parts = [slice_axis(ctx, row, 1, int(s), n) for s, n in _runs([int(i) for i in flat])]
    t = concat_phys(ctx, parts, phys_axis(row, 1)) if len(parts) > 1 else parts[0]
    finish(ctx, reshape_to(ctx, t, tuple(int(d) for d in idx.shape), output_of=direct(ctx, x.q)))


def _full_pads(ctx: LoweringContext, rank: int) -> tuple[list[int], list[int]]:
    pads = constant_ints(ctx, 1, "pads")
    if pads is None:
        pads = [int(v) for v in ctx.attr("pads", [0] * 2 * rank)]
    axes = constant_ints(ctx, 3, "axes")
    axes = [norm_axis(ctx, a, rank) for a in axes] if axes is not None else list(range(rank))
    if len(pads) != 2 * len(axes):
        raise ctx.unsupported(f"{len(pads)} pads for {len(axes)} axes")
    before, after = [0] * rank, [0] * rank
    for k, a in enumerate(axes):
        before[a], after[a] = pads[k], pads[k + len(axes)]
    return before, after


def edge_parts(ctx: LoweringContext, x: TTensor, a: int, n_before: int, n_after: int, mode: str) -> TTensor:
    """Pad logical axis a by copying edge, mirrored (reflect) or wrapped slices, then one CONCAT."""
    dim = x.logical_shape[a]
    if mode == "reflect" and (n_before >= dim or n_after >= dim):
        raise ctx.unsupported(f"reflect pads must be smaller than the dimension ({dim})")
    if mode == "wrap" and (n_before > dim or n_after > dim):
        raise ctx.unsupported(f"wrap pads must not exceed the dimension ({dim})")
    if mode == "edge":
        left = [slice_axis(ctx, x, a, 0, 1)] * n_before
        right = [slice_axis(ctx, x, a, dim - 1, 1)] * n_after
    elif mode == "reflect":
        left = [slice_axis(ctx, x, a, i, 1) for i in range(n_before, 0, -1)]
        right = [slice_axis(ctx, x, a, dim - 2 - i, 1) for i in range(n_after)]
    else:
        left = [slice_axis(ctx, x, a, dim - n_before, n_before)] if n_before else []
        right = [slice_axis(ctx, x, a, 0, n_after)] if n_after else []
    return concat_phys(ctx, [*left, x, *right], phys_axis(x, a))


@lowers("Pad")
def lower_pad(ctx: LoweringContext) -> None:
    mode = ctx.attr("mode", b"constant")
    mode = mode.decode() if isinstance(mode, bytes) else mode
    x = ctx.tensor(0)
    rank = len(x.shape)
    before, after = _full_pads(ctx, rank)
    for a in range(rank):  # negative pads crop
        if before[a] < 0 or after[a] < 0:
            lo, hi = max(-before[a], 0), max(-after[a], 0)
            x = slice_axis(ctx, x, a, lo, x.logical_shape[a] - lo - hi)
            before[a], after[a] = max(before[a], 0), max(after[a], 0)
    if mode == "constant":
        value = ctx.constant(2)
        if value is None and ctx.has_input(2):
            raise ctx.unsupported("the pad value must be a constant")
        value = float(np.asarray(value).reshape(-1)[0]) if value is not None and np.asarray(value).size else 0.0
        if not any(before) and not any(after):
            finish(ctx, x)
            return
        b = [before[a] for a in x.perm]
        e = [after[a] for a in x.perm]
        finish(ctx, pad_phys(ctx, x, b, e, value, output_of=direct(ctx, x.q)))
        return
    if mode not in ("edge", "reflect", "wrap"):
        raise ctx.unsupported(f"pad mode '{mode}' is not supported")
    for a in range(rank):
        if before[a] or after[a]:
            x = edge_parts(ctx, x, a, before[a], after[a], mode)
    finish(ctx, x)


def tile_phys(ctx: LoweringContext, x: TTensor, repeats: list[int], output_of: str | None = None) -> TTensor:
    """TILE by logical repeats (mapped to physical axes)."""
    mult = [repeats[a] for a in x.perm]
    if all(m == 1 for m in mult):
        return x
    shape = tuple(d * m for d, m in zip(x.shape, mult, strict=True))
    out = ctx.new_tensor(shape, x.dtype, x.perm, x.q, output_of=output_of)
    ctx.op(Op.TILE, [x.name, ctx.shape_const(mult)], [out.name], attr("Tile"))
    return out


@lowers("Tile")
def lower_tile(ctx: LoweringContext) -> None:
    x = ctx.tensor(0)
    repeats = constant_ints(ctx, 1, "repeats")
    if repeats is None or len(repeats) != len(x.shape):
        raise ctx.unsupported("repeats must be a constant with one entry per axis")
    finish(ctx, tile_phys(ctx, x, repeats, output_of=direct(ctx, x.q)))


@lowers("Expand")
def lower_expand(ctx: LoweringContext) -> None:
    """Broadcast by TILE of the unit axes (after a reshape that adds leading axes)."""
    x = ctx.tensor(0)
    target = constant_ints(ctx, 1, "shape")
    if target is None:
        raise ctx.unsupported("the shape must be a constant")
    shape = list(x.logical_shape)
    rank = max(len(shape), len(target))
    shape = [1] * (rank - len(shape)) + shape
    target = [1] * (rank - len(target)) + target
    out = [max(s, t) for s, t in zip(shape, target, strict=True)]
    if any(s not in (1, o) for s, o in zip(shape, out, strict=True)):
        raise ctx.unsupported(f"cannot expand {shape} to {target}")
    if rank != len(x.shape):
        x = reshape_to(ctx, x, tuple(shape))
    repeats = [o // s for s, o in zip(shape, out, strict=True)]
    finish(ctx, tile_phys(ctx, x, repeats, output_of=direct(ctx, x.q)))
