"""Walk an ONNX graph in topological order and dispatch each node to its registered lowering."""

from __future__ import annotations

import traceback
from dataclasses import dataclass
from typing import Literal

import onnx

from npubuild.errors import InternalError, NpubuildError, UncomputedOutputError, UnsupportedOpError, one_line
from npubuild.frontend.concat_order import reordered
from npubuild.frontend.passes import HOST_REASON
from npubuild.lowering import load_all
from npubuild.lowering.context import LoweringContext, ModelArrays, TTensor
from npubuild.lowering.emit import Op, attr
from npubuild.lowering.options import LoweringOptions
from npubuild.lowering.quant import UnrepresentableScale
from npubuild.lowering.registry import LOWERINGS, op_key
from npubuild.records.iospec import IOSpec


@dataclass
class LoweredGraph:
    """A serialized TOSA graph plus what is needed to feed it and trace it back to ONNX."""

    tosa: bytes
    profile: Literal["int", "fp"]
    inputs: list[IOSpec]
    outputs: list[IOSpec]
    node_ops: dict[str, list[str]]  # ONNX node name -> TOSA op types it became

    @property
    def tosa_op_count(self) -> int:
        return sum(len(v) for v in self.node_ops.values())


def copy_to_output(ctx: LoweringContext, x: TTensor, name: str) -> None:
    """Graph output `name` as a copy of `x`: a TOSA graph output is written by an operator, never an input."""
    out = ctx.new_tensor(x.shape, x.dtype, x.perm, x.q, output_of=name)
    ctx.op(Op.IDENTITY, [x.name], [out.name], attr("Identity"))
    ctx.values[name] = out


def lower_model(model: onnx.ModelProto, profile: Literal["int", "fp"], family: str | None = None,
                options: LoweringOptions | None = None, arrays: ModelArrays | None = None) -> LoweredGraph:
    """Lower a whole (QDQ for INT, float for FP) ONNX model to one TOSA 1.0 graph.

    `family` ("u55", "u65", "u85" or "u85wide") lets a lowering choose the forms that NPU family runs best
    (options.FAMILY_OPTIONS); `options` gives them explicitly instead (tests, benchmarks). `arrays`: the
    model's initializers and QParams read once for several lowerings of it (used where the lowered model is
    that one).
    """
    load_all()
    for i, node in enumerate(model.graph.node):
        if not node.name:
            node.name = f"{node.op_type}_{i}"
    options = options or LoweringOptions.for_family(family)
    index = None
    if options.concat_order:  # Vela's Concat copies in input order: the SRAM peak depends on it
        model, index = reordered(model)
    ctx = LoweringContext(model, profile, options=options, given_index=index,
                          shared=arrays.for_model(model) if arrays is not None else None)
    for node in model.graph.node:
        if node.name in ctx.fused:  # lowered already, as part of a pattern (e.g. the Erf form of GELU)
            continue
        if node.doc_string.startswith(HOST_REASON):  # the host's, said on the node: control flow the import left
            # whole, or a layer the spec keeps in float (the precision stage), lowerable or not
            raise UnsupportedOpError(node.name, node.op_type, node.doc_string[len(HOST_REASON):])
        fn = LOWERINGS.get(op_key(node.domain, node.op_type))
        if fn is None and node.domain not in ("", "ai.onnx"):
            raise UnsupportedOpError(node.name, node.op_type, f"operator domain '{node.domain}' is not supported")
        if fn is None:
            raise UnsupportedOpError(node.name, node.op_type, "no lowering to TOSA for this op type")
        ctx.current = node
        try:
            fn(ctx)
        except UnrepresentableScale as exc:
            raise ctx.unsupported(str(exc)) from None
        except NpubuildError:
            raise
        except Exception as exc:  # a bug in this op's lowering: ours, named by its node, never the model's
            if isinstance(exc, MemoryError):
                raise
            raise InternalError(f"node '{node.name}' ({node.op_type}): its lowering failed: "
                                f"{one_line(f'{type(exc).__name__}: {exc}')}", detail=traceback.format_exc()) from None
        ctx.current = None
    for name in ctx.graph_outputs:
        v = ctx.values.get(name)
        if isinstance(v, TTensor) and v.name in {i.tosa_name for i in ctx.inputs} and \
                name not in {o.onnx_name for o in ctx.outputs}:
            copy_to_output(ctx, v, name)  # a graph input passed through (an Identity the passes dropped)
        elif not isinstance(v, TTensor) or name not in {o.onnx_name for o in ctx.outputs}:
            raise UncomputedOutputError(name)
    return LoweredGraph(
        tosa=ctx.ser.serialize(),
        profile=profile,
        inputs=ctx.inputs,
        outputs=ctx.outputs,  # in TOSA output order
        node_ops=ctx.node_ops,
    )
