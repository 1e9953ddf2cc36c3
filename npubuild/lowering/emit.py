"""Common TOSA idioms used by many op lowerings: rescale, clamp, reshape, transpose, layout moves.

Each helper emits TOSA 1.0 operators through the context and returns the
resulting `TTensor`; operand order follows TOSA 1.0 (zero points and rescale
parameters are tensors, not attributes).
"""

from __future__ import annotations

import heapq

import numpy as np
import tosa_serializer as ts

from npubuild.lowering.context import ChannelRescale, LoweringContext, TTensor, WideRescale, identity, inverse
from npubuild.lowering.quant import INT48, QParams, multiplier_shift

Op = ts.Op


def attr(kind: str, *args) -> ts.TosaSerializerAttribute:
    """`attr("Conv2d", pad, ...)` -> a TosaSerializerAttribute with Conv2dAttribute(...) set."""
    a = ts.TosaSerializerAttribute()
    getattr(a, f"{kind}Attribute")(*args)
    return a


# ops whose int32 result's RESCALE Vela fuses into the op itself (its output scaling): a SLICE or CONCAT of that
# RESCALE's result is compiled right on every family (LoweringOptions.clamp_sliced_rescale is for the others: a
# TABLE's, a MAXIMUM's, a REDUCE_SUM's, a graph input's), where it is free. Measured on ResNet-8 in int8: with a
# CLAMP after these too, 12% more U55 cycles (208228 -> 233572); without, the same cycles as no CLAMP at all.
FUSES_OUTPUT_RESCALE = frozenset({"ADD", "SUB", "MUL", "CONV2D", "DEPTHWISE_CONV2D", "TRANSPOSE_CONV2D", "CONV3D",
                                  "MATMUL"})


def rescale(
    ctx: LoweringContext,
    x: TTensor,
    scale: float | np.ndarray,
    out_dtype: np.dtype,
    in_zp: int,
    out_zp: int,
    out_q: QParams | None,
    output_of: str | None = None,
) -> TTensor:
    """RESCALE x to out_dtype: out = round((x - in_zp) * scale) + out_zp, per channel if scale is a vector.

    An int48 accumulator (a 16-bit activation's conv) takes 16-bit multipliers: TOSA and Vela refuse a 32-bit
    one there (`scale32` must be false), so its scale keeps 15 significant bits."""
    out_dtype = np.dtype(out_dtype)
    scale = np.atleast_1d(np.asarray(scale, np.float64))
    scale32 = x.dtype != INT48
    try:
        mult, shift = multiplier_shift(scale, 32 if scale32 else 16)
    except ValueError as exc:  # a non-finite or out-of-range scale: the node cannot be lowered, say which
        if ctx.current is None:
            raise
        raise ctx.unsupported(str(exc)) from None
    per_channel = scale.size > 1
    out = ctx.new_tensor(x.shape, out_dtype, x.perm, out_q, output_of=output_of)
    inputs = [
        x.name,
        ctx.const(mult.astype(np.int32 if scale32 else np.int16), "multiplier"),
        ctx.const(shift.astype(np.int8), "shift"),
        ctx.zp(in_zp, x.dtype),
        ctx.zp(out_zp, out_dtype),
    ]
    rescale_attr = attr("Rescale", scale32, ts.RoundingMode.SINGLE_ROUND, per_channel, False, False)
    ctx.op(Op.RESCALE, inputs, [out.name], rescale_attr)
    source = ctx.producers.get(x.name, "input")
    if x.dtype == np.int32 and out_dtype != np.int32 and source not in FUSES_OUTPUT_RESCALE:
        ctx.wide_rescales[out.name] = WideRescale(tuple(x.shape), out_dtype, source)
    if per_channel and np.dtype(x.dtype).itemsize <= 2:  # an int8/int16 -> int8 rescale Vela runs as a pool (not a
        # conv's int32 accumulator scaling, which Vela fuses into the conv: a SLICE of that int32 tensor is worse)
        ctx.channel_rescales[out.name] = ChannelRescale(x.name, np.dtype(x.dtype), mult.astype(np.int32),
                                                        shift.astype(np.int8), inputs[3], inputs[4], rescale_attr)
    return out


def requantize(ctx: LoweringContext, x: TTensor, out_q: QParams, output_of: str | None = None) -> TTensor:
    """Move an int8 tensor to other quantisation parameters (no-op if they already match)."""
    assert x.q is not None
    if x.q.same_as(out_q) and output_of is None:
        return x
    if ctx.options.dw_requantize and ctx.options.depthwise_pays(x, out_q):
        return requantize_dw(ctx, x, out_q, output_of)
    return rescale(ctx, x, x.q.s / out_q.s, out_q.dtype, x.q.zp, out_q.zp, out_q, output_of)


def as_int16(ctx: LoweringContext, x: TTensor) -> TTensor:
    """An int8 tensor on the int16 grid of the same scale (zero point 0, as TOSA wants every int16 tensor):
    one exact RESCALE, so an op whose operands must share a type can take an int8 one beside an int16 one."""
    assert x.q is not None
    if x.dtype == np.int16:
        return x
    q16 = QParams(np.asarray(x.q.s, np.float64), np.asarray(0, np.int64), np.dtype(np.int16))
    return rescale(ctx, x, 1.0, np.int16, x.q.zp, 0, q16)


def requantize_dw(ctx: LoweringContext, x: TTensor, out_q: QParams, output_of: str | None = None) -> TTensor:
    """The same requantisation as a 1x1 DEPTHWISE_CONV2D of ones: its int32 sum is exactly x - zp_in, and
    the RESCALE Vela fuses into the conv is the one `rescale` would apply, so the result is bit-identical."""
    assert x.q is not None
    c = x.shape[3]
    acc = ctx.new_tensor(x.shape, np.int32, x.perm)
    ins = [x.name, ctx.const(np.ones((1, 1, c, 1), np.int8), "ones"), ctx.const(np.zeros(c, np.int32), "bias"),
           ctx.zp(x.q.zp, np.int8), ctx.zp(0, np.int8)]
    ctx.op(Op.DEPTHWISE_CONV2D, ins, [acc.name],
           attr("DepthwiseConv2d", [0, 0, 0, 0], [1, 1], [1, 1], False, ts.DType.INT32))
    return rescale(ctx, acc, x.q.s / out_q.s, out_q.dtype, 0, out_q.zp, out_q, output_of)


def clamp(
    ctx: LoweringContext, x: TTensor, lo: float | int, hi: float | int, output_of: str | None = None
) -> TTensor:
    out = ctx.new_tensor(x.shape, x.dtype, x.perm, x.q, output_of=output_of)
    if x.dtype == np.float32:
        bounds = (np.array([lo], np.float32), np.array([hi], np.float32))
        a = attr("Clamp", ts.TosaSerializer.convertDataToUint8Vec(ts.DType.FP32, bounds[0]),
                 ts.TosaSerializer.convertDataToUint8Vec(ts.DType.FP32, bounds[1]), ts.NanPropagationMode.PROPAGATE)
    else:
        dt = {np.dtype(np.int8): ts.DType.INT8, np.dtype(np.int16): ts.DType.INT16}[x.dtype]
        a = attr("Clamp", ts.TosaSerializer.convertDataToUint8Vec(dt, np.array([int(lo)], x.dtype)),
                 ts.TosaSerializer.convertDataToUint8Vec(dt, np.array([int(hi)], x.dtype)), ts.NanPropagationMode.PROPAGATE)
    ctx.op(Op.CLAMP, [x.name], [out.name], a)
    return out


def reshape(ctx: LoweringContext, x: TTensor, shape: tuple[int, ...], perm: tuple[int, ...] | None = None,
            output_of: str | None = None) -> TTensor:
    """RESHAPE to a physical shape; `perm` is the layout the result is known to have."""
    shape = tuple(int(s) for s in shape)
    if shape == x.shape and (perm is None or perm == x.perm) and not ctx.is_graph_output(output_of):
        return x
    out = ctx.new_tensor(shape, x.dtype, perm if perm is not None else identity(len(shape)), x.q, output_of=output_of)
    ctx.op(Op.RESHAPE, [x.name, ctx.shape_const(shape)], [out.name], attr("Reshape"))
    return out


def transpose(ctx: LoweringContext, x: TTensor, perm: tuple[int, ...], new_layout: tuple[int, ...],
              output_of: str | None = None) -> TTensor:
    """Physically TRANSPOSE x by `perm`; the result's layout is `new_layout`."""
    shape = tuple(x.shape[p] for p in perm)
    if ctx.options.transpose_block_swaps and output_of is None:
        rshape, rperm = reduced_transpose(x.shape, perm)
        steps = block_swaps(rshape, rperm)
        if steps is not None and len(steps) > 1:
            return _by_block_swaps(ctx, x, rshape, steps, shape, new_layout)
    out = ctx.new_tensor(shape, x.dtype, new_layout, x.q, output_of=output_of)
    ctx.op(Op.TRANSPOSE, [x.name], [out.name], attr("Transpose", list(perm)))
    return out


def reduced_transpose(shape: tuple[int, ...], perm: tuple[int, ...]) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The same element move on the fewest axes: unit axes dropped, input axes that stay neighbours merged."""
    runs: list[list[int]] = []
    for a in (a for a in perm if shape[a] != 1):
        if runs and a == _next_kept(shape, runs[-1][-1]):
            runs[-1].append(a)
        else:
            runs.append([a])
    order = sorted(range(len(runs)), key=lambda r: runs[r][0])  # the runs in input order
    rank = {r: i for i, r in enumerate(order)}
    return tuple(int(np.prod([shape[a] for a in runs[r]])) for r in order), tuple(rank[r] for r in range(len(runs)))


def _next_kept(shape: tuple[int, ...], a: int) -> int:
    """The next non-unit input axis after a (len(shape) if none)."""
    return next((b for b in range(a + 1, len(shape)) if shape[b] != 1), len(shape))


BATCHED_SWAP_COST = 6.0  # a swap with outer axes (A > 1): Vela 5.2 runs it as several TRANSPOSEs (~5x a plain one)
# a swap of a block shorter than 4 with another: U85-256 runs [1, 2, 256, 16] -> [1, 256, 2, 16] in 51200 cycles,
# [1, 8, 64, 16] -> [1, 64, 8, 16] in 4524 (U55-128: 2048 both); a tie-breaker between chains of equal length
SHORT_SIDE_COST = 0.5


def _swap_cost(outer: int, x: int, y: int) -> float:
    """The relative cost of one block swap [outer, x, y, C] -> [outer, y, x, C] (block_swaps)."""
    return (BATCHED_SWAP_COST if outer > 1 else 1.0) + (SHORT_SIDE_COST if min(x, y) < 4 else 0.0)


def block_swaps(shape: tuple[int, ...], perm: tuple[int, ...]) -> list[tuple[int, int, int]] | None:
    """The cheapest sequence of block swaps (positions i < j < k: axes [i, j) and [j, k) trade places) that
    performs `perm` on `shape`: each is one TRANSPOSE of an [A, X, Y, C] view by (0, 2, 1, 3), which Vela 5.2
    runs as one H/W swap when A is 1, where it splits a high-rank TRANSPOSE into a long chain of its own (a
    MobileViT unfold: 15 TRANSPOSEs on U55 for the permutation these do in two). None above rank 6 and when the
    innermost axis moves: a swap with C = 1 is Vela's slowest form (a byte at a time) whatever the chain."""
    r = len(shape)
    if r > 6 or not perm or perm[-1] != r - 1:
        return None
    start, goal = tuple(range(r)), tuple(perm)
    best: dict[tuple[int, ...], tuple[float, list[tuple[int, int, int]]]] = {start: (0.0, [])}
    frontier = [(0.0, start)]
    while frontier:
        cost, cur = heapq.heappop(frontier)
        if cur == goal:
            return best[cur][1]
        if cost > best[cur][0]:
            continue
        for i in range(r):
            for j in range(i + 1, r):
                for k in range(j + 1, r):
                    nxt = cur[:i] + cur[j:k] + cur[i:j] + cur[k:]
                    size = [int(np.prod([shape[a] for a in cur[p:q]])) for p, q in ((0, i), (i, j), (j, k))]
                    total = cost + _swap_cost(*size)
                    if nxt not in best or total < best[nxt][0]:
                        best[nxt] = (total, best[cur][1] + [(i, j, k)])
                        heapq.heappush(frontier, (total, nxt))
    return None


def _by_block_swaps(ctx: LoweringContext, x: TTensor, rshape: tuple[int, ...], steps: list[tuple[int, int, int]],
                    shape: tuple[int, ...], new_layout: tuple[int, ...]) -> TTensor:
    """x (reduced shape `rshape`) moved by `steps` of block swaps (block_swaps), RESHAPEd to `shape` at the end."""
    dims, cur = list(rshape), x
    for i, j, k in steps:
        a, b = int(np.prod(dims[:i])), int(np.prod(dims[i:j]))
        c, d = int(np.prod(dims[j:k])), int(np.prod(dims[k:]))
        view = reshape(ctx, cur, (a, b, c, d), identity(4))
        cur = ctx.new_tensor((a, c, b, d), x.dtype, identity(4), x.q)
        ctx.op(Op.TRANSPOSE, [view.name], [cur.name], attr("Transpose", [0, 2, 1, 3]))
        dims = dims[:i] + dims[j:k] + dims[i:j] + dims[k:]
    return reshape(ctx, cur, shape, new_layout)


def to_layout(ctx: LoweringContext, x: TTensor, layout: tuple[int, ...]) -> TTensor:
    """Bring x to the given layout; a TRANSPOSE only if the physical element order really changes."""
    if x.perm == layout:
        return x
    if len(layout) != len(x.shape):  # e.g. a 2-D (NHWC) op on a rank-3 or rank-5 tensor
        raise ctx.unsupported(f"a rank-{len(x.shape)} tensor where this lowering needs rank {len(layout)}")
    # physical_new = logical.transpose(layout) = physical_old.transpose(inverse(x.perm)).transpose(layout)
    inv = inverse(x.perm)
    move = tuple(inv[i] for i in layout)
    new_shape = tuple(x.shape[m] for m in move)
    if order_preserved(x.shape, move):
        return reshape(ctx, x, new_shape, layout)
    return transpose(ctx, x, move, layout)


def order_preserved(shape: tuple[int, ...], perm: tuple[int, ...]) -> bool:
    """True if transposing `shape` by `perm` keeps the element order (only unit dims move)."""
    moved = [p for p in perm if shape[p] != 1]
    return moved == sorted(moved)
