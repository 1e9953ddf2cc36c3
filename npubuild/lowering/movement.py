"""Helpers for data-movement lowerings: layout-aware reshape, slice, concat, and the output step.

Data-movement ops never change values, so they keep the input's quantisation
(onnxruntime gives them equal input/output scales); `finish` requantizes only
when the QuantizeLinear after the op says otherwise. Layouts are tracked, not
enforced: a reshape or transpose that keeps the physical element order is a
relabelling of `perm` and costs no operator at all.
"""

from __future__ import annotations

import numpy as np

from npubuild.lowering.context import NHWC, LoweringContext, QConst, TTensor, identity
from npubuild.lowering.emit import Op, attr, requantize, to_layout
from npubuild.lowering.quant import QParams


def canonical(rank: int) -> tuple[int, ...]:
    """The layout a reshaped tensor prefers: NHWC for rank 4, channels last for rank >= 5 (the views pixel
    (un)shuffles go through on their way back to NHWC), row-major below."""
    if rank == 4:
        return NHWC
    return (0, *range(2, rank), 1) if rank >= 5 else identity(rank)


# readers that take their operand row-major (identity layout: MatMul/Gemm rows, LayerNormalization's last axes) and
# readers that take it channels-last (NHWC); a reshape that must move data anyway lands where its readers want it
ROW_MAJOR_READERS = frozenset({"MatMul", "Gemm", "LayerNormalization"})
CHANNELS_LAST_READERS = frozenset({"Conv", "ConvTranspose", "ConvInteger", "QLinearConv", "MaxPool", "AveragePool",
                                   "GlobalAveragePool", "GlobalMaxPool", "LpPool", "Resize", "Upsample",
                                   "BatchNormalization", "InstanceNormalization", "DepthToSpace", "SpaceToDepth",
                                   "LRN"})


def reader_ops(ctx: LoweringContext, name: str) -> set[str]:
    """The op types reading `name`, looking through QuantizeLinear/DequantizeLinear pairs."""
    ops, frontier, seen = set(), [name], set()
    while frontier:
        v = frontier.pop()
        if v in seen:
            continue
        seen.add(v)
        for c in ctx.consumers.get(v, []):
            if c.op_type in ("QuantizeLinear", "DequantizeLinear") and c.input[0] == v:
                frontier.append(c.output[0])
            else:
                ops.add(c.op_type)
    return ops


def preferred_layout(ctx: LoweringContext, rank: int, name: str | None) -> tuple[int, ...]:
    """The layout a reshape result `name` should be moved into: row-major if only row-major readers need an order
    (a MobileViT unfold read by LayerNormalization and linear layers, which would otherwise transpose it back from
    NHWC), else the canonical one."""
    if rank < 4 or name is None:
        return canonical(rank)
    readers = reader_ops(ctx, name)
    if readers & ROW_MAJOR_READERS and not readers & CHANNELS_LAST_READERS:
        return identity(rank)
    return canonical(rank)


def phys_axis(x: TTensor, axis: int) -> int:
    """Physical position of logical axis `axis` (already normalised to be >= 0)."""
    return x.perm.index(axis)


def norm_axis(ctx: LoweringContext, axis: int, rank: int) -> int:
    if not -rank <= axis < rank:
        raise ctx.unsupported(f"axis {axis} is out of range for rank {rank}")
    return axis + rank if axis < 0 else axis


def relabel(x: TTensor, perm: tuple[int, ...], q: QParams | None = None) -> TTensor:
    """The same TOSA tensor seen with another logical layout (no operator)."""
    return TTensor(x.name, x.shape, x.dtype, tuple(perm), q if q is not None else x.q)


def _groups(src: tuple[int, ...], dst: tuple[int, ...]) -> list[tuple[list[int], list[int]]] | None:
    """Pair runs of non-unit source axes with runs of destination axes of equal element count."""
    s_axes = [a for a, d in enumerate(src) if d != 1]
    d_axes = [b for b, d in enumerate(dst) if d != 1]
    groups, i, j = [], 0, 0
    while i < len(s_axes) and j < len(d_axes):
        gs, gd = [s_axes[i]], [d_axes[j]]
        ps, pd = src[s_axes[i]], dst[d_axes[j]]
        i, j = i + 1, j + 1
        while ps != pd:
            if ps < pd:
                if i >= len(s_axes):
                    return None
                gs.append(s_axes[i])
                ps *= src[s_axes[i]]
                i += 1
            else:
                if j >= len(d_axes):
                    return None
                gd.append(d_axes[j])
                pd *= dst[d_axes[j]]
                j += 1
        groups.append((gs, gd))
    if i != len(s_axes) or j != len(d_axes):
        return None
    return groups


def reshape_layout(src: tuple[int, ...], perm: tuple[int, ...], dst: tuple[int, ...]) -> tuple[int, ...] | None:
    """A layout for `src` (laid out by `perm`) reshaped to `dst` that keeps the physical element order.

    The reshape splits/merges runs of logical axes; if each run is contiguous and
    in order in the physical layout, the result is a physical reshape with the
    runs in the same physical order. Unit axes go where the canonical layout
    puts them. None if the reshape really needs the logical order.
    """
    groups = _groups(src, dst)
    if groups is None:
        return None
    out = _map_runs([a for a in perm if src[a] != 1], groups)
    return None if out is None else _with_unit_axes(out, dst)


def pullback_layout(src: tuple[int, ...], dst: tuple[int, ...], out_layout: tuple[int, ...]) -> tuple[int, ...] | None:
    """The layout `src` needs so that reshaping it to `dst` lands in `out_layout` with no further move."""
    groups = _groups(src, dst)
    if groups is None:
        return None
    order = _map_runs([b for b in out_layout if dst[b] != 1], [(gd, gs) for gs, gd in groups])
    return None if order is None else _with_unit_axes(order, src)


def _map_runs(seq: list[int], groups: list[tuple[list[int], list[int]]]) -> list[int] | None:
    """Replace each run `a` of `seq` by its partner `b` (groups are (a, b) pairs); None if `seq` splits a run."""
    by_first = {a[0]: (a, b) for a, b in groups}
    out: list[int] = []
    k = 0
    while k < len(seq):
        if seq[k] not in by_first:
            return None
        a, b = by_first[seq[k]]
        if seq[k:k + len(a)] != list(a):
            return None
        out.extend(b)
        k += len(a)
    return out


def _with_unit_axes(order: list[int], shape: tuple[int, ...]) -> tuple[int, ...]:
    """A full layout: `order` for the non-unit axes, unit axes where the canonical layout puts them."""
    it = iter(order)
    return tuple(next(it) if shape[c] != 1 else c for c in canonical(len(shape)))


def reshape_to(ctx: LoweringContext, x: TTensor, new_shape: tuple[int, ...], output_of: str | None = None,
               target: tuple[int, ...] | None = None) -> TTensor:
    """Reshape by the logical (ONNX) shape; a TRANSPOSE only if the layout makes the order differ.

    When one is needed, x is transposed straight into the order whose reshape is
    the result in `target` (default: its canonical layout, NHWC for rank 4), so the consumer needs no second move.
    """
    new_shape = tuple(int(s) for s in new_shape)
    layout = reshape_layout(x.logical_shape, x.perm, new_shape)
    if layout is None:
        want = pullback_layout(x.logical_shape, new_shape, target or canonical(len(new_shape)))
        x = to_layout(ctx, x, want if want is not None else identity(len(x.shape)))
        layout = reshape_layout(x.logical_shape, x.perm, new_shape)
        assert layout is not None
    phys = tuple(new_shape[i] for i in layout)
    if phys == x.shape and not ctx.is_graph_output(output_of):
        return relabel(x, layout)
    out = ctx.new_tensor(phys, x.dtype, layout, x.q, output_of=output_of)
    ctx.op(Op.RESHAPE, [x.name, ctx.shape_const(phys)], [out.name], attr("Reshape"))
    return out


def phys_reshape(ctx: LoweringContext, x: TTensor, phys: tuple[int, ...], perm: tuple[int, ...] | None = None,
                 output_of: str | None = None) -> TTensor:
    """RESHAPE to a physical shape (for internal views); no operator if nothing changes."""
    phys = tuple(int(s) for s in phys)
    perm = perm if perm is not None else identity(len(phys))
    if phys == x.shape and not ctx.is_graph_output(output_of):
        return relabel(x, perm)
    out = ctx.new_tensor(phys, x.dtype, perm, x.q, output_of=output_of)
    ctx.op(Op.RESHAPE, [x.name, ctx.shape_const(phys)], [out.name], attr("Reshape"))
    return out


def slice_phys(ctx: LoweringContext, x: TTensor, start: list[int], size: list[int],
               output_of: str | None = None) -> TTensor:
    """SLICE in physical coordinates; no operator if it takes everything."""
    if list(size) == list(x.shape) and not ctx.is_graph_output(output_of):
        return x
    out = ctx.new_tensor(tuple(size), x.dtype, x.perm, x.q, output_of=output_of)
    ctx.op(Op.SLICE, [x.name, ctx.shape_const(start), ctx.shape_const(size)], [out.name], attr("Slice"))
    return out


def slice_axis(ctx: LoweringContext, x: TTensor, axis: int, start: int, size: int,
               output_of: str | None = None) -> TTensor:
    """Slice logical axis `axis` (>= 0) to [start, start + size)."""
    p = phys_axis(x, axis)
    begin = [0] * len(x.shape)
    sizes = list(x.shape)
    begin[p], sizes[p] = start, size
    return slice_phys(ctx, x, begin, sizes, output_of)


def concat_phys(ctx: LoweringContext, parts: list[TTensor], p: int, output_of: str | None = None) -> TTensor:
    """CONCAT along physical axis p of tensors sharing one layout and quantisation."""
    if len(parts) == 1:
        return parts[0] if not ctx.is_graph_output(output_of) else slice_phys(ctx, parts[0], [0] * len(parts[0].shape),
                                                                              list(parts[0].shape), output_of)
    shape = list(parts[0].shape)
    shape[p] = sum(t.shape[p] for t in parts)
    out = ctx.new_tensor(tuple(shape), parts[0].dtype, parts[0].perm, parts[0].q, output_of=output_of)
    ctx.op(Op.CONCAT, [t.name for t in parts], [out.name], attr("Concat", p))
    return out


def result_q(ctx: LoweringContext, q_in: QParams | None, i: int = 0) -> QParams | None:
    """The quantisation output i must have: its QuantizeLinear's, else the input's (values are unchanged)."""
    if ctx.profile != "int":
        return None
    return ctx.output_q(i) or q_in


def direct(ctx: LoweringContext, q_in: QParams | None, i: int = 0) -> str | None:
    """Output i's ONNX name if the op's result can be the output as is (no requantization needed)."""
    q = result_q(ctx, q_in, i)
    if q is not None and q_in is not None and not q_in.same_as(q):
        return None
    return ctx.current.output[i]


def finish(ctx: LoweringContext, t: TTensor, i: int = 0) -> None:
    """Bind output i: requantize if its QuantizeLinear asks for other parameters; copy if it is a graph output."""
    name = ctx.current.output[i]
    q = result_q(ctx, t.q, i)
    if q is not None and t.q is not None and not t.q.same_as(q):
        t = requantize(ctx, t, q, output_of=name)
    elif ctx.is_graph_output(name) and t.name not in {o.tosa_name for o in ctx.outputs}:
        out = ctx.new_tensor(t.shape, t.dtype, t.perm, t.q, output_of=name)
        ctx.op(Op.IDENTITY, [t.name], [out.name], attr("Identity"))
        t = out
    ctx.set_output(i, t)


def input_in_layout(ctx: LoweringContext, i: int, layout: tuple[int, ...], q: QParams | None) -> TTensor:
    """Input i in `layout`; constants are laid out (and, in int8, quantized to `q`) at compile time."""
    v = ctx.value(ctx.current.input[i])
    if isinstance(v, QConst | np.ndarray) and (ctx.profile == "fp" or q is not None):
        real = v.real() if isinstance(v, QConst) else np.asarray(v, np.float32)
        data = q.quantize(real) if ctx.profile == "int" and q is not None else real.astype(np.float32)
        phys = np.ascontiguousarray(np.transpose(data, layout))
        return TTensor(ctx.const(phys, "const"), phys.shape, phys.dtype, tuple(layout), q)
    return to_layout(ctx, ctx.tensor(i), tuple(layout))


def constant_ints(ctx: LoweringContext, i: int, what: str) -> list[int] | None:
    """Integer constant input i as a list (None if absent); must be a constant."""
    if not ctx.has_input(i):
        return None
    c = ctx.constant(i)
    if c is None:
        raise ctx.unsupported(f"{what} must be a constant")
    return [int(v) for v in np.asarray(c).reshape(-1)]


def _pad_const(ctx: LoweringContext, x: TTensor, value: float) -> str:
    if x.q is not None:
        return ctx.const(x.q.quantize(np.array([value])).astype(x.dtype), "pad_const")
    return ctx.const(np.array([value], x.dtype), "pad_const")


def pad_phys(ctx: LoweringContext, x: TTensor, before: list[int], after: list[int], value: float = 0.0,
             output_of: str | None = None) -> TTensor:
    """PAD by physical amounts with the (quantized) constant `value`."""
    shape = tuple(d + b + a for d, b, a in zip(x.shape, before, after, strict=True))
    out = ctx.new_tensor(shape, x.dtype, x.perm, x.q, output_of=output_of)
    padding = [v for b, a in zip(before, after, strict=True) for v in (b, a)]
    ctx.op(Op.PAD, [x.name, ctx.shape_const(padding), _pad_const(ctx, x, value)], [out.name], attr("Pad"))
    return out


def decimate(ctx: LoweringContext, x: TTensor, axis: int, lo: int, step: int, count: int) -> TTensor:
    """Elements lo, lo + step, ... (count of them) of a logical axis: SLICE, RESHAPE to expose the step, SLICE."""
    if step == 1 or count == 1:
        return slice_axis(ctx, x, axis, lo, count)
    p = phys_axis(x, axis)
    dim = x.shape[p]
    if lo + count * step <= dim:
        x = slice_axis(ctx, x, axis, lo, count * step)
    else:  # the last stride runs past the end: pad it (the padded values are never read)
        x = slice_axis(ctx, x, axis, lo, (count - 1) * step + 1)
        after = [0] * len(x.shape)
        after[p] = step - 1
        x = pad_phys(ctx, x, [0] * len(x.shape), after)
    outer, inner = int(np.prod(x.shape[:p])), int(np.prod(x.shape[p + 1:]))
    view = phys_reshape(ctx, x, (outer, count, step, inner))
    picked = slice_phys(ctx, view, [0, 0, 0, 0], [outer, count, 1, inner])
    shape = list(x.shape)
    shape[p] = count
    return phys_reshape(ctx, picked, tuple(shape), x.perm)
