"""Put the Concat inputs Vela has to copy first, with the reading Conv's weights permuted to match.

Vela lowers a Concat to one write per input, in input order, and schedules each
input's whole producer chain before the next. An input that other nodes read
too (a U-Net skip connection) cannot be written in place, so it is copied; as
the last input, its copy waits behind the other input's chain (the bilinear
upsample with its replicated intermediate), and the skip tensor is live at
that chain's SRAM peak. Copied first, it is dead by then; and the skip's 8
channels first put the upsample at channel 8, so Vela keeps the Concat output
NHWC instead of padding 24 channels to 32 in NHCWB16. The Conv reading the
Concat gets its weights' input channels in the same order, so its result is
unchanged bit for bit. U-Net on U55-128: SRAM 214.3 -> 177.5 KiB, same cycles.
On U85 the order alone costs 0.1% in time, so it goes with the copy as an
elementwise MAXIMUM (concat_copy). There too the Concat stays NHWC (64x64x24:
96 KiB, not 128 KiB of NHCWB16), which is the SRAM gain: Vela's own copy runs
after the last Resize even when first (order alone: SRAM 176.0 KiB), the
MAXIMUM right after the skip's conv, so the Concat is live from there (177.6).
unet / unet_torch on U85-256: 0.2532 -> 0.2451 ms, SRAM 208.0 -> 177.6 KiB, same
off-chip; the widest U85s lose time (lowering/options.py says who takes it and why).
"""

from __future__ import annotations

import copy
import functools

import numpy as np
import onnx
from onnx import numpy_helper

from npubuild.frontend.graph_index import GraphIndex


class _Graph(GraphIndex):
    """The graph index plus inferred shapes and the Concat/Conv questions the reordering asks."""

    def __init__(self, model: onnx.ModelProto) -> None:
        super().__init__(model)
        self.model = model

    @functools.cached_property
    def shapes(self) -> dict[str, list[int]]:
        """Inferred shapes, only for a Concat that would move (shape inference is most of this pass's cost, and it
        runs on every lowering of the families that take it)."""
        inferred = onnx.shape_inference.infer_shapes(self.model)
        return {v.name: [d.dim_value for d in v.type.tensor_type.shape.dim]
                for v in [*inferred.graph.value_info, *inferred.graph.input, *inferred.graph.output]}

    def copied(self, name: str) -> bool:
        """Vela copies this Concat input rather than having its producer write it in place."""
        return name in self.inputs or len(self.consumers.get(name, [])) > 1

    def only_reader(self, name: str, node: onnx.NodeProto) -> bool:
        return self.only_user(name) == node

    def weight_init(self, conv: onnx.NodeProto) -> onnx.TensorProto | None:
        """The (int8 or float) initializer behind a Conv's weights, if only this Conv reads it."""
        w = conv.input[1]
        dq = self.producer.get(w)
        if dq is not None:
            if dq.op_type != "DequantizeLinear" or dq.input[1] not in self.inits:
                return None
            axis = next((a.i for a in dq.attribute if a.name == "axis"), 1)
            per_channel = numpy_helper.to_array(self.inits[dq.input[1]]).size > 1
            if (per_channel and axis != 0) or not self.only_reader(w, conv):
                return None
            w, conv = dq.input[0], dq
        t = self.inits.get(w)
        return t if t is not None and self.only_reader(w, conv) else None

    def conv_readers(self, cat: onnx.NodeProto) -> list[onnx.NodeProto] | None:
        """The Convs (group 1) that read the Concat, directly or through one Q/DQ pair; None if anything else does."""
        names = [cat.output[0]]
        qs = self.consumers.get(cat.output[0], [])
        if len(qs) == 1 and qs[0].op_type == "QuantizeLinear":
            if cat.output[0] in self.outputs or qs[0].output[0] in self.outputs:
                return None
            dqs = self.consumers.get(qs[0].output[0], [])
            if not dqs or any(d.op_type != "DequantizeLinear" for d in dqs):
                return None
            names = [d.output[0] for d in dqs]
        convs = []
        for name in names:
            readers = self.consumers.get(name, [])
            if name in self.outputs or not readers:
                return None
            for n in readers:
                group = next((a.i for a in n.attribute if a.name == "group"), 1)
                if n.op_type != "Conv" or list(n.input).count(name) != 1 or n.input[0] != name or group != 1 \
                        or self.weight_init(n) is None:
                    return None
                convs.append(n)
        return convs


def copied_inputs_first(model: onnx.ModelProto) -> onnx.ModelProto:
    """The model with each channel Concat read only by Convs reordered copied-inputs-first (a copy; or `model`)."""
    return reordered(model)[0]


def reordered(model: onnx.ModelProto) -> tuple[onnx.ModelProto, GraphIndex | None]:
    """copied_inputs_first, and an index of the model it returns when that is `model` itself (no Concat moves:
    the lowering reads that index instead of building its own, and `model` is not copied)."""
    if not any(n.op_type == "Concat" for n in model.graph.node):
        return model, None
    g = _Graph(model)
    if not any(_moved(g, cat) for cat in model.graph.node):
        return model, g  # what the copy below would have been: no Concat of it moves before one has moved
    model = copy.deepcopy(model)
    g = _Graph(model)
    for cat in model.graph.node:
        move = _moved(g, cat)
        if move is None:
            continue
        order, channels, convs = move
        starts = np.cumsum([0] + [s[1] for s in channels])
        idx = np.concatenate([np.arange(starts[i], starts[i + 1]) for i in order])
        for conv in convs:
            t = g.weight_init(conv)
            assert t is not None
            t.CopyFrom(numpy_helper.from_array(np.ascontiguousarray(numpy_helper.to_array(t)[:, idx]), t.name))
        names = [cat.input[i] for i in order]
        del cat.input[:]
        cat.input.extend(names)
    return model, None


def _moved(g: _Graph, cat: onnx.NodeProto) -> tuple[list[int], list[list[int]], list[onnx.NodeProto]] | None:
    """A channel Concat whose inputs move: their new order, their shapes and the Convs reading it; else None."""
    axis = next((a.i for a in cat.attribute if a.name == "axis"), None)
    if cat.op_type != "Concat" or axis not in (1, -3) or any(not n for n in cat.input):
        return None
    order = sorted(range(len(cat.input)), key=lambda i: not g.copied(cat.input[i]))
    if order == sorted(order):
        return None
    channels = [g.shapes.get(n, []) for n in cat.input]
    if any(len(s) != 4 or s[1] <= 0 for s in channels):
        return None
    convs = g.conv_readers(cat)
    return None if convs is None else (order, channels, convs)
