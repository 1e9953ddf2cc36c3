"""Housekeeping passes wrapping onnx-ir's common passes under pipeline names."""

from __future__ import annotations

import onnx_ir as ir
from onnx_ir.passes import common

from npubuild.frontend.passes import register


@register("eliminate_identity")
class EliminateIdentity(common.IdentityEliminationPass):
    """Identity nodes carry no computation; drop them (and Dropout in inference, see below)."""


@register("remove_unused")
class RemoveUnused(common.RemoveUnusedNodesPass):
    """Nodes whose outputs nobody reads."""


@register("topological_sort")
class TopologicalSort(common.TopologicalSortPass):
    """The lowering walks nodes in order: make sure producers come first."""


@register("eliminate_dropout")
class EliminateDropout(ir.passes.InPlacePass):
    """Dropout is the identity at inference; rewire its readers to its input."""

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        modified = False
        for node in list(model.graph):
            if node.op_type == "Dropout" and node.domain in ("", "ai.onnx"):
                if len(node.outputs) > 1 and node.outputs[1].uses():
                    continue
                out = node.outputs[0]
                if out.is_graph_output():
                    continue
                ir.convenience.replace_all_uses_with(out, node.inputs[0])
                model.graph.remove(node, safe=True)
                modified = True
        return ir.passes.PassResult(model, modified)


@register("castlike_to_cast")
class CastLikeToCast(ir.passes.InPlacePass):
    """CastLike reads only its second input's element type: a Cast to that type, so that the second input (a
    tensor the function bodies of ONNX ops pass just for its type) is no data dependency. Without this, a host
    or NPU partition boundary can run through a tensor nobody reads."""

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        modified = False
        for node in list(model.graph):
            if node.op_type != "CastLike" or node.domain not in ("", "ai.onnx") or len(node.inputs) < 2:
                continue
            like = node.inputs[1]
            if like is None or like.dtype is None:
                continue
            node.op_type = "Cast"
            node.attributes["to"] = ir.AttrInt64("to", like.dtype.value)
            node.resize_inputs(1)
            modified = True
        return ir.passes.PassResult(model, modified)
