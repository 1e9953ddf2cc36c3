"""Shape-only ops: Reshape, Flatten, Squeeze, Unsqueeze, Transpose, Identity, Dropout, Constant, Cast.

None of these moves data when the layout allows it. A reshape keeps the
physical element order whenever the merged/split axis runs are contiguous in
the current layout (e.g. [N, C, 1, 1] -> [N, C] after a global pool, or
[N, C, H, W] -> [N, C, H*W] of an NHWC tensor, which stays channels-last);
a Transpose only relabels the layout, so the TRANSPOSE is emitted later, and
only if a consumer needs the element order it implies.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from npubuild.lowering.context import GraphInput, LoweringContext, QConst, TTensor, inverse
from npubuild.lowering.movement import (
    constant_ints,
    direct,
    finish,
    norm_axis,
    phys_reshape,
    preferred_layout,
    relabel,
    reshape_layout,
    reshape_to,
)
from npubuild.lowering.registry import lowers


def reshape_logical(ctx: LoweringContext, x: TTensor, new_shape: tuple[int, ...]) -> None:
    """Bind output 0 to x reshaped to the logical shape `new_shape`."""
    if reshape_layout(x.logical_shape, x.perm, new_shape) is None:
        t = flatten_into_fc(ctx, x, new_shape)
        if t is not None:
            finish(ctx, t)
            return
    target = preferred_layout(ctx, len(new_shape), ctx.current.output[0])
    finish(ctx, reshape_to(ctx, x, new_shape, output_of=direct(ctx, x.q), target=target))


def flatten_into_fc(ctx: LoweringContext, x: TTensor, new_shape: tuple[int, ...]) -> TTensor | None:
    """Flatten an NHWC tensor feeding only fully connected layers without a TRANSPOSE.

    The rows are taken in physical (H, W, C) order and each reader's constant
    weight gets its K axis permuted to match, at compile time: A_phys @ B[perm]
    = A @ B. Only when every reader is a Gemm/MatMul (through Q/DQ) whose
    weight initializer nothing else reads. Returns None when that does not hold.
    """
    shape = x.logical_shape
    if len(new_shape) != 2 or len(shape) < 3 or x.perm[0] != 0 or new_shape[0] != shape[0]:
        return None
    readers = _fc_readers(ctx, ctx.current.output[0])
    if readers is None:
        return None
    producers = {o: n for n in ctx.model.graph.node for o in n.output}
    sources = [_weight_source(ctx, r, producers) for r in readers]
    if any(src is None for src in sources):
        return None
    rest = shape[1:]
    perm_k = np.arange(int(np.prod(rest))).reshape(rest).transpose([a - 1 for a in x.perm[1:]]).reshape(-1)
    for reader, (init, k_axis) in zip(readers, sources, strict=True):
        w = np.ascontiguousarray(np.take(ctx.values[init], perm_k, axis=k_axis))
        ctx.values[init] = w
        lowered = ctx.values.get(reader.input[1])  # the weight's DequantizeLinear may have run already
        if isinstance(lowered, QConst):
            ctx.values[reader.input[1]] = QConst(w, lowered.q)
    return phys_reshape(ctx, x, tuple(new_shape), (0, 1), output_of=direct(ctx, x.q))


def _fc_readers(ctx: LoweringContext, name: str) -> list[onnx.NodeProto] | None:
    """The Gemm/MatMul nodes reading `name` (through Q/DQ) as their A operand, None if anything else reads it."""
    readers, frontier = [], [name]
    while frontier:
        v = frontier.pop()
        if v in ctx.graph_outputs:
            return None
        for c in ctx.consumers.get(v, []):
            if c.op_type in ("QuantizeLinear", "DequantizeLinear") and c.input[0] == v:
                frontier.append(c.output[0])
            elif c.op_type in ("Gemm", "MatMul") and c.input[0] == v and v not in c.input[1:] and not any(
                    a.name == "transA" and a.i for a in c.attribute):
                readers.append(c)
            else:
                return None
    return readers or None


def _weight_source(ctx: LoweringContext, node: onnx.NodeProto, producers: dict) -> tuple[str, int] | None:
    """(initializer, K axis) of a Gemm/MatMul's constant 2-D weight that only this node reads, else None."""
    k_axis = 1 if node.op_type == "Gemm" and any(a.name == "transB" and a.i for a in node.attribute) else 0
    src = node.input[1]
    dq = producers.get(src)
    if dq is not None:
        scale = ctx.values.get(dq.input[1]) if len(dq.input) > 1 else None
        axis = next((a.i for a in dq.attribute if a.name == "axis"), 1)
        per_k = isinstance(scale, np.ndarray) and scale.size > 1 and axis % 2 == k_axis
        if dq.op_type != "DequantizeLinear" or per_k or len(ctx.consumers.get(src, [])) != 1:
            return None
        src = dq.input[0]
    inits = {i.name for i in ctx.model.graph.initializer}
    w = ctx.values.get(src)
    if src not in inits or not isinstance(w, np.ndarray) or w.ndim != 2 or len(ctx.consumers.get(src, [])) != 1:
        return None
    return src, k_axis


def folded(ctx: LoweringContext, fn: Callable[[np.ndarray], np.ndarray],
           axis_map: Callable[[int], int | None] | None = None) -> bool:
    """Apply a shape op to a constant input at compile time (e.g. DequantizeLinear(weight) -> Transpose, as
    other quantizers write it), so the consumer still sees a constant. `axis_map` moves a per-axis scale."""
    v = ctx.value(ctx.current.input[0])
    if isinstance(v, np.ndarray):
        ctx.set_output(0, np.asarray(fn(v)))
        return True
    if isinstance(v, QConst):
        if v.q.axis is None or v.q.is_per_tensor:
            ctx.set_output(0, QConst(np.asarray(fn(v.data)), v.q))
            return True
        axis = axis_map(v.q.axis % v.data.ndim) if axis_map is not None else None
        if axis is not None:
            ctx.set_output(0, QConst(np.asarray(fn(v.data)), replace(v.q, axis=axis)))
            return True
    return False


def _in_shape(ctx: LoweringContext) -> tuple[int, ...]:
    """Logical shape of input 0, whatever it is (activation, graph input, constant)."""
    v = ctx.value(ctx.current.input[0])
    if isinstance(v, TTensor):
        return v.logical_shape
    return tuple(v.data.shape if isinstance(v, QConst) else v.shape)


def _target_shape(ctx: LoweringContext, src: tuple[int, ...], spec: np.ndarray) -> tuple[int, ...]:
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
    spec = ctx.constant(1)
    if spec is None:
        raise ctx.unsupported("the target shape must be a constant (static shapes are set at import)")
    new = _target_shape(ctx, _in_shape(ctx), spec.astype(np.int64).reshape(-1))
    if not folded(ctx, lambda a: a.reshape(new)):
        reshape_logical(ctx, ctx.tensor(0), new)


@lowers("Flatten")
def lower_flatten(ctx: LoweringContext) -> None:
    shape = _in_shape(ctx)
    axis = int(ctx.attr("axis", 1))
    axis = axis + len(shape) if axis < 0 else axis
    new = (int(np.prod(shape[:axis])), int(np.prod(shape[axis:])))
    if not folded(ctx, lambda a: a.reshape(new)):
        reshape_logical(ctx, ctx.tensor(0), new)


def _axes(ctx: LoweringContext) -> list[int] | None:
    """Axes from input 1 (opset >= 13) or the `axes` attribute (older opsets)."""
    axes = constant_ints(ctx, 1, "axes")
    if axes is None:
        a = ctx.attr("axes")
        axes = [int(v) for v in a] if a is not None else None
    return axes


@lowers("Squeeze")
def lower_squeeze(ctx: LoweringContext) -> None:
    shape = _in_shape(ctx)
    axes = _axes(ctx)
    if axes is None:
        axes = [i for i, d in enumerate(shape) if d == 1]
    axes = {norm_axis(ctx, a, len(shape)) for a in axes}
    if any(shape[a] != 1 for a in axes):
        raise ctx.unsupported(f"cannot squeeze non-unit axes {sorted(axes)} of shape {list(shape)}")
    kept = [i for i in range(len(shape)) if i not in axes]
    new = tuple(shape[i] for i in kept)
    if not folded(ctx, lambda a: a.reshape(new), lambda a: kept.index(a) if a in kept else None):
        reshape_logical(ctx, ctx.tensor(0), new)


@lowers("Unsqueeze")
def lower_unsqueeze(ctx: LoweringContext) -> None:
    shape = list(_in_shape(ctx))
    axes = _axes(ctx)
    if axes is None:
        raise ctx.unsupported("Unsqueeze needs axes")
    rank = len(shape) + len(axes)
    new_axes = sorted(norm_axis(ctx, a, rank) for a in axes)
    kept = [i for i in range(rank) if i not in new_axes]  # output position of each input axis
    for a in new_axes:
        shape.insert(a, 1)
    new = tuple(shape)
    if not folded(ctx, lambda a: a.reshape(new), lambda a: kept[a]):
        reshape_logical(ctx, ctx.tensor(0), new)


@lowers("Transpose")
def lower_transpose(ctx: LoweringContext) -> None:
    """Relabel the layout: physical = logical_out.transpose(q) with the same data, so no operator here."""
    rank = len(_in_shape(ctx))
    p = tuple(int(a) for a in ctx.attr("perm", list(range(rank))[::-1]))
    if sorted(p) != list(range(rank)):
        raise ctx.unsupported(f"perm {list(p)} is not a permutation of rank {rank}")
    if folded(ctx, lambda a: np.transpose(a, p), p.index):
        return
    x = ctx.tensor(0)
    inv_p = inverse(p)
    finish(ctx, relabel(x, tuple(inv_p[a] for a in x.perm)))


@lowers("Identity")
def lower_identity(ctx: LoweringContext) -> None:
    v = ctx.value(ctx.current.input[0])
    if isinstance(v, np.ndarray | QConst):
        ctx.set_output(0, v)
        return
    finish(ctx, ctx.tensor(0))


@lowers("Dropout")
def lower_dropout(ctx: LoweringContext) -> None:
    """Inference Dropout is the identity; its mask output is not produced."""
    if len(ctx.current.output) > 1 and ctx.current.output[1] and ctx.consumers.get(ctx.current.output[1]):
        raise ctx.unsupported("the Dropout mask output is not supported")
    if ctx.constant(2) is not None and bool(np.asarray(ctx.constant(2)).reshape(-1)[0]):
        raise ctx.unsupported("training_mode=True is not supported (inference only)")
    finish(ctx, ctx.tensor(0))


@lowers("Constant")
def lower_constant(ctx: LoweringContext) -> None:
    for a in ctx.current.attribute:
        if a.name == "value":
            ctx.set_output(0, numpy_helper.to_array(a.t))
            return
        if a.name in ("value_float", "value_floats", "value_int", "value_ints"):
            dtype = np.float32 if "float" in a.name else np.int64
            ctx.set_output(0, np.asarray(helper.get_attribute_value(a), dtype))
            return
    raise ctx.unsupported("only value, value_float(s) and value_int(s) Constants are supported")


FLOATS = {TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.DOUBLE, TensorProto.BFLOAT16}
NARROWER_FLOATS = {TensorProto.FLOAT16, TensorProto.BFLOAT16}


@lowers("Cast")
def lower_cast(ctx: LoweringContext) -> None:
    """Constants are cast at compile time; float -> float on activations is a no-op (fp32 or int8 inside)."""
    _cast(ctx, int(ctx.attr("to")))


@lowers("CastLike")
def lower_cast_like(ctx: LoweringContext) -> None:
    """Cast to the element type of input 1 (only its type is read)."""
    _cast(ctx, _elem_type(ctx, ctx.current.input[1]))


def _elem_type(ctx: LoweringContext, name: str) -> int:
    v = ctx.value(name)
    if isinstance(v, GraphInput):
        return v.elem_type
    if isinstance(v, QConst):
        return TensorProto.FLOAT
    if isinstance(v, np.ndarray):
        return helper.np_dtype_to_tensor_dtype(v.dtype)
    return TensorProto.FLOAT if v.q is not None or v.dtype == np.float32 else helper.np_dtype_to_tensor_dtype(v.dtype)


def _cast(ctx: LoweringContext, to: int) -> None:
    v = ctx.value(ctx.current.input[0])
    if isinstance(v, np.ndarray | QConst):
        real = v.real() if isinstance(v, QConst) else v
        ctx.set_output(0, np.asarray(real).astype(helper.tensor_dtype_to_np_dtype(to)))
        return
    x = ctx.tensor(0)
    if to in NARROWER_FLOATS and x.q is None:  # rounds fp32 values: not a no-op on a float activation
        raise ctx.unsupported(f"casting a float32 activation to {TensorProto.DataType.Name(to)} is not supported")
    if to in FLOATS and (x.dtype == np.float32 or x.q is not None):
        finish(ctx, x)
        return
    raise ctx.unsupported(f"casting a {x.dtype} activation to {TensorProto.DataType.Name(to)} is not supported")
