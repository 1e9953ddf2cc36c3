"""Housekeeping passes wrapping onnx-ir's common passes under pipeline names."""

from __future__ import annotations

import onnx_ir as ir
from onnx_ir.passes import common

from npubuild.frontend.passes import register


@register("eliminate_identity")
class EliminateIdentity(common.IdentityEliminationPass):
    """Identity nodes carry no computation; drop them (and Dropout in inference, see below).

    Except where a subgraph (an If or Loop branch) returns a value it does not compute itself through an
    Identity: ONNX needs that Identity. Without it onnxruntime refuses the model ("Subgraph output is an outer
    scope value being returned directly": openWakeWord's head, whose else branch returns the first score), and
    onnx-ir 1.1 raises when the value is already another graph's output (Silero VAD's LSTM branches)."""

    def _try_eliminate_identity_node(self, node: ir.Node) -> bool:
        if node.op_type == "Identity" and node.domain == "" and len(node.inputs) == 1 and node.outputs \
                and node.inputs[0] is not None and node.outputs[0].is_graph_output() \
                and not _computed_in(node.inputs[0], node.graph):
            return False
        return super()._try_eliminate_identity_node(node)


def _computed_in(value: ir.Value, graph: ir.Graph | None) -> bool:
    """Whether `value` is made by a node of `graph` itself and is no graph's output yet."""
    producer = value.producer()
    return producer is not None and producer.graph is graph and not value.is_graph_output()


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
