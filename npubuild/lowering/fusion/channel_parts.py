"""A result made of channel groups that a channel Concat takes as separate inputs.

Vela writes each CONCAT input in place into the output (MoveConcatSliceToProducer),
but only when the input's producer is a real op: an input that is itself a
CONCAT is copied again, whole. So a lowering that computes its result in channel
groups (the U55 bilinear upsample, to keep only one group's intermediate live)
hands the groups over as a `PartsTensor`, and the Concat lowering splices them
into its own input list (`concat_inputs`). A `PartsTensor` exists only when that
Concat is the one reader (`feeds_channel_concat`); `materialize` makes it a
plain tensor (one CONCAT) for any other use.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from npubuild.lowering.context import LoweringContext, TTensor
from npubuild.lowering.emit import Op, attr
from npubuild.lowering.movement import input_in_layout
from npubuild.lowering.quant import QParams

CHANNEL_AXES = (1, -3)


@dataclass
class PartsTensor(TTensor):
    """A tensor never emitted as a whole: `parts`, concatenated along physical axis `axis`."""

    parts: list[TTensor] = field(default_factory=list)
    axis: int = 3


def feeds_channel_concat(ctx: LoweringContext) -> bool:
    """Whether the current node's only reader is a channel Concat (directly or through one Q -> DQ pair)."""
    assert ctx.current is not None
    name = ctx.current.output[0]
    if ctx.is_graph_output(name):
        return False
    for _ in range(3):
        readers = ctx.consumers.get(name, [])
        if len(readers) != 1:
            return False
        node = readers[0]
        if node.op_type == "Concat":
            axis = next((a.i for a in node.attribute if a.name == "axis"), None)
            return axis in CHANNEL_AXES
        if node.op_type not in ("QuantizeLinear", "DequantizeLinear"):
            return False
        name = node.output[0]
    return False


def concat_inputs(ctx: LoweringContext, i: int, layout: tuple[int, ...], axis: int, q: QParams | None) -> list[TTensor]:
    """Concat input i in `layout`: a PartsTensor split along the Concat's physical `axis` as its parts (any
    other PartsTensor joined first: the Concat took another layout than the parts')."""
    name = ctx.current.input[i]
    v = ctx.value(name)
    if isinstance(v, PartsTensor):
        if v.perm == layout and v.axis == axis:
            return list(v.parts)
        ctx.values[name] = materialize(ctx, v)
    return [input_in_layout(ctx, i, layout, q)]


def materialize(ctx: LoweringContext, t: TTensor) -> TTensor:
    """A PartsTensor as one real tensor (a CONCAT of its parts); other tensors as they are."""
    if not isinstance(t, PartsTensor):
        return t
    out = ctx.new_tensor(t.shape, t.dtype, t.perm, t.q)
    ctx.op(Op.CONCAT, [p.name for p in t.parts], [out.name], attr("Concat", t.axis))
    return out
