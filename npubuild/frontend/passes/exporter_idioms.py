"""Rewrite, at import, exporters' spellings of one function into the op the lowering runs on the NPU.

- torch's softplus (F.softplus, and Mish through it) exported by torch.export / dynamo as
  Where(Greater(x, 20), x, Softplus(x)): torch's own threshold branch, x where softplus(x) = x. For a
  threshold T >= 15 the branch changes nothing a float32 tensor can hold (softplus(x) - x = log1p(exp(-x))
  < exp(-15) = 3.1e-7, under half the float32 step at 15, which is 9.5e-7; onnxruntime's Softplus and the
  lowering's are computed so that exp never overflows), so the Where is Softplus(x). Left as it is,
  U55 and U65 run the GREATER and SELECT on the host (Vela has neither there): the graph splits around them.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from npubuild.frontend.passes import register
from npubuild.frontend.passes._rewrite import replace_value

SOFTPLUS_IS_IDENTITY_FROM = 15.0  # softplus(x) rounds to x in float32 for every x above this


def _scalar(value: ir.Value | None) -> float | None:
    if value is None or value.const_value is None:
        return None
    a = value.const_value.numpy()
    return float(a.reshape(-1)[0]) if a.size == 1 and np.issubdtype(a.dtype, np.floating) else None


def _softplus_threshold(graph: ir.Graph, where: ir.Node) -> bool:
    """Where(Greater(x, T), x, Softplus(x)), T >= 15 -> Softplus(x)."""
    if len(where.inputs) != 3 or any(v is None for v in where.inputs):
        return False
    cond, taken, other = where.inputs
    greater, softplus = cond.producer(), other.producer()
    if greater is None or greater.op_type != "Greater" or softplus is None or softplus.op_type != "Softplus":
        return False
    x = softplus.inputs[0]
    threshold = _scalar(greater.inputs[1])
    if greater.inputs[0] is not x or taken is not x or threshold is None or threshold < SOFTPLUS_IS_IDENTITY_FROM:
        return False
    out = where.outputs[0]
    if out.is_graph_output() and other.is_graph_output():
        return False  # one value cannot be two graph outputs
    replace_value(out, other)
    graph.remove(where, safe=True)
    if not cond.uses() and not cond.is_graph_output():
        graph.remove(greater, safe=True)
    return True


@register("exporter_idioms")
class ExporterIdioms(ir.passes.InPlacePass):
    def call(self, model: ir.Model) -> ir.passes.PassResult:
        modified = False
        for node in list(model.graph):
            if node.domain in ("", "ai.onnx") and node.op_type == "Where":
                modified |= _softplus_threshold(model.graph, node)
        return ir.passes.PassResult(model, modified)
