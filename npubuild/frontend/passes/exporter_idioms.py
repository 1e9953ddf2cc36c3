"""Rewrite, at import, exporters' spellings of one function into the op the lowering runs on the NPU.

- torch's pixel_shuffle, exported as DepthToSpace mode CRD, after the Conv that feeds it (a sub-pixel
  convolution, ESPCN's upsampler): the Conv's output channels reordered to DCR order and the DepthToSpace
  made DCR, the same function (each channel's weights, bias and so its quantisation move with it). DCR is
  the order whose rows are whole channel ranges: U85 runs it with no TRANSPOSE (LoweringOptions.
  depth_to_space_rows), and CRD needed a rank-5 one everywhere.

- torch's softplus (F.softplus, and Mish through it) exported by torch.export / dynamo as
  Where(Greater(x, 20), x, Softplus(x)): torch's own threshold branch, x where softplus(x) = x. For a
  threshold T >= 15 the branch changes nothing a float32 tensor can hold (softplus(x) - x = log1p(exp(-x))
  < exp(-15) = 3.1e-7, under half the float32 step at 15, which is 9.5e-7; onnxruntime's Softplus and the
  lowering's are computed so that exp never overflows), so the Where is Softplus(x). Left as it is,
  U55 and U65 run the GREATER and SELECT on the host (Vela has neither there): the graph splits around them.

- hard-swish written out as x * Clip(x + 3, 0, 6) / 6 (Paddle2ONNX below opset 14, Keras' x * relu6(x + 3) / 6
  through tf2onnx; the / 6 as a Div by 6 or a Mul by 1/6, on the product or on the Clip): HardSwish(x) from
  opset 14, x * HardSigmoid(x) (alpha 1/6, beta 1/2, torch's own export below 14) before it. The lowering
  runs such a chain as one TABLE either way, but its entries then repeat the quantised model's rounding of
  x + 3, of the product and of the quotient, each to int8; written as the function it is, the TABLE rounds
  once and the QDQ model quantises two tensors where it quantised three (HardSwish: one). On PP-OCR's models
  what that does to accuracy against float is within the quantiser's recipe spread (bench/real_idioms.md).
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


def _single_reader(value: ir.Value | None) -> bool:
    """A value only the pattern reads: the rewrite may drop its producer."""
    return value is not None and not value.is_graph_output() and len(value.uses()) == 1


def _near(value: ir.Value | None, want: float) -> bool:
    got = _scalar(value)
    return got is not None and abs(got - want) <= 1e-6 * max(1.0, abs(want))


def _times_sixth(node: ir.Node | None) -> ir.Value | None:
    """The value `node` divides by 6 (Div by 6, or Mul by 1/6 either way round), else None."""
    if node is None or node.domain not in ("", "ai.onnx") or len(node.inputs) != 2:
        return None
    if node.op_type == "Div" and _near(node.inputs[1], 6.0):
        return node.inputs[0]
    if node.op_type == "Mul":
        for i in (0, 1):
            if _near(node.inputs[1 - i], 1.0 / 6.0):
                return node.inputs[i]
    return None


def _relu6_of_x_plus_3(value: ir.Value | None) -> tuple[ir.Value, list[ir.Node]] | None:
    """(x, [Clip, Add]) where `value` = Clip(x + 3, 0, 6) and only the pattern reads the sum and the clip."""
    clip = value.producer() if value is not None else None
    if clip is None or clip.op_type != "Clip" or len(clip.inputs) != 3 or not _single_reader(value):
        return None
    if not (_near(clip.inputs[1], 0.0) and _near(clip.inputs[2], 6.0)):
        return None
    add = clip.inputs[0].producer() if clip.inputs[0] is not None else None
    if add is None or add.op_type != "Add" or len(add.inputs) != 2 or not _single_reader(clip.inputs[0]):
        return None
    for i in (0, 1):
        if _near(add.inputs[1 - i], 3.0) and add.inputs[i] is not None:
            return add.inputs[i], [clip, add]
    return None


def _hard_swish_of(last: ir.Node) -> tuple[ir.Value, list[ir.Node]] | None:
    """(x, the pattern's nodes, `last` first) where `last` ends x * Clip(x + 3, 0, 6) / 6: the division on the
    product, or the product of x and the divided Clip."""
    divided = _times_sixth(last)
    product = divided.producer() if divided is not None and _single_reader(divided) else None
    if product is not None and product.op_type == "Mul" and len(product.inputs) == 2:
        for i in (0, 1):
            got = _relu6_of_x_plus_3(product.inputs[1 - i])
            if got is not None and got[0] is product.inputs[i]:
                return got[0], [last, product, *got[1]]
    if last.op_type == "Mul" and len(last.inputs) == 2:
        for i in (0, 1):
            inner = last.inputs[1 - i].producer() if _single_reader(last.inputs[1 - i]) else None
            clipped = _times_sixth(inner)
            got = _relu6_of_x_plus_3(clipped)
            if inner is not None and got is not None and got[0] is last.inputs[i]:
                return got[0], [last, inner, *got[1]]
    return None


def _hard_swish(model: ir.Model, last: ir.Node) -> bool:
    """x * Clip(x + 3, 0, 6) / 6 -> HardSwish(x) (opset >= 14) or x * HardSigmoid(x, 1/6, 1/2)."""
    found = _hard_swish_of(last)
    if found is None:
        return False
    x, nodes = found
    graph = model.graph
    out = last.outputs[0]
    name = last.name or "hard_swish"
    if model.opset_imports.get("", 0) >= 14:
        new = [ir.node("HardSwish", [x], name=f"{name}_hard_swish")]
    else:
        gate = ir.node("HardSigmoid", [x], attributes={"alpha": 1.0 / 6.0, "beta": 0.5}, name=f"{name}_hard_sigmoid")
        new = [gate, ir.node("Mul", [x, gate.outputs[0]], name=f"{name}_hard_swish")]
    graph.insert_before(last, new)
    new[-1].outputs[0].shape, new[-1].outputs[0].type = out.shape, out.type
    replace_value(out, new[-1].outputs[0])
    for node in nodes:  # last first: each one's readers are gone before it goes
        graph.remove(node, safe=True)
    return True


CHANNELWISE = {"Relu", "Sigmoid", "Tanh", "LeakyRelu", "HardSigmoid", "HardSwish", "Elu", "Selu", "Softplus"}


def _pixel_shuffle_dcr(depth_to_space: ir.Node) -> bool:
    """Conv (-> per-element activations) -> DepthToSpace(CRD) -> the Conv's output channels in DCR order, DCR."""
    if depth_to_space.attributes.get_string("mode", "DCR") != "CRD":
        return False
    b = depth_to_space.attributes.get_int("blocksize", 0)
    value = depth_to_space.inputs[0]
    chain: list[ir.Node] = []
    producer = value.producer() if value is not None else None
    while producer is not None and producer.op_type in CHANNELWISE and len(producer.inputs) == 1:
        chain.append(producer)
        producer = producer.inputs[0].producer() if producer.inputs[0] is not None else None
    conv = producer
    if conv is None or conv.op_type != "Conv" or conv.domain not in ("", "ai.onnx") or b < 1 or \
            conv.attributes.get_int("group", 1) != 1:  # a grouped conv's output channels belong to their groups
        return False
    for n in [conv, *chain]:
        out = n.outputs[0]
        if out.is_graph_output() or len(out.uses()) != 1:
            return False  # another reader sees the channels in their first order
    w = conv.inputs[1]
    bias = conv.inputs[2] if len(conv.inputs) > 2 else None
    if w is None or w.const_value is None or (bias is not None and bias.const_value is None):
        return False
    if len(w.uses()) != 1 or (bias is not None and len(bias.uses()) != 1):
        return False  # a shared initializer keeps its order
    weights = w.const_value.numpy()
    c = weights.shape[0]
    if c % (b * b):
        return False
    co = c // (b * b)
    dcr = np.arange(c)
    crd_of = (dcr % co) * b * b + dcr // co  # DCR channel (i * b + j) * co + k is CRD channel k * b * b + i * b + j
    w.const_value = ir.tensor(np.ascontiguousarray(weights[crd_of]), name=w.const_value.name)
    if bias is not None:
        bias.const_value = ir.tensor(np.ascontiguousarray(bias.const_value.numpy()[crd_of]), name=bias.const_value.name)
    depth_to_space.attributes["mode"] = ir.AttrString("mode", "DCR")
    return True


@register("exporter_idioms")
class ExporterIdioms(ir.passes.InPlacePass):
    def call(self, model: ir.Model) -> ir.passes.PassResult:
        modified = False
        for node in list(model.graph):
            if node.domain not in ("", "ai.onnx") or node.graph is not model.graph:  # removed by a rewrite here
                continue
            if node.op_type == "Where":
                modified |= _softplus_threshold(model.graph, node)
            elif node.op_type == "DepthToSpace":
                modified |= _pixel_shuffle_dcr(node)
            elif node.op_type in ("Div", "Mul"):
                modified |= _hard_swish(model, node)
        return ir.passes.PassResult(model, modified)
