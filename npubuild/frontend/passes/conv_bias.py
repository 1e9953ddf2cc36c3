"""A per-channel constant added right after a Conv or ConvTranspose: the convolution's own bias.

Paddle2ONNX writes a convolution's bias as a separate `elementwise_add` of a [1, C, 1, 1] constant (PP-OCR's
classifier has 20 such Adds after its squeeze-excite convs, the orientation classifier 4, the PP-OCRv4
detector's head 2 after its ConvTransposes, one of them before a BatchNormalization). Left as an Add, the
int8 graph rounds the convolution's output to int8 before adding the bias and runs one more elementwise
op on the NPU; folded in, the bias is added in int32 at the accumulator's scale, as every other conv's.
Then fold_batchnorm folds a BatchNormalization after it too (it takes ConvTranspose as well as Conv).
`Sub` of a constant is the same with the constant negated. Only when the convolution's output has no other
reader and the constant varies along the channel axis alone.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from npubuild.frontend.passes import register
from npubuild.frontend.passes._rewrite import NodeRewrite, new_initializer, replace_value

CONVS = ("Conv", "ConvTranspose")


def channel_vector(value: ir.Value | None, channels: int, rank: int) -> np.ndarray | None:
    """The constant as one value per output channel, if it broadcasts along the channel axis only."""
    if value is None or value.const_value is None:
        return None
    c = value.const_value.numpy()
    if not np.issubdtype(c.dtype, np.floating) or c.ndim > rank:
        return None
    full = (1,) * (rank - c.ndim) + c.shape
    if any(d != 1 for i, d in enumerate(full) if i != 1) or full[1] not in (1, channels):
        return None
    return np.broadcast_to(c.reshape(-1), (channels,)).astype(np.float64)


def out_channels(conv: ir.Node) -> int | None:
    w = conv.inputs[1] if len(conv.inputs) > 1 else None
    if w is None or w.const_value is None:
        return None
    shape = w.const_value.shape
    return shape[0] if conv.op_type == "Conv" else shape[1] * conv.attributes.get_int("group", 1)


def _fold(graph: ir.Graph, add: ir.Node) -> bool:
    if add.op_type not in ("Add", "Sub") or len(add.inputs) != 2:
        return False
    for data_index in (0, 1):
        if add.op_type == "Sub" and data_index == 1:
            break  # c - conv is not a bias
        data, const = add.inputs[data_index], add.inputs[1 - data_index]
        conv = data.producer() if data is not None else None
        if conv is None or conv.op_type not in CONVS or conv.domain not in ("", "ai.onnx"):
            continue
        if data.is_graph_output() or len(data.uses()) != 1 or data.shape is None:
            continue
        channels = out_channels(conv)
        vector = channel_vector(const, channels, len(data.shape)) if channels else None
        if vector is None:
            continue
        bias = conv.inputs[2] if len(conv.inputs) > 2 else None
        if bias is not None and (bias.const_value is None or len(bias.uses()) != 1):
            continue
        old = bias.const_value.numpy().astype(np.float64) if bias is not None else np.zeros(channels)
        dtype = conv.inputs[1].const_value.numpy().dtype
        new = (old + (-vector if add.op_type == "Sub" else vector)).astype(dtype)
        value = new_initializer(graph, f"{conv.name or 'conv'}_bias_folded", new)
        if bias is not None:
            conv.replace_input_with(2, value)
        else:
            while len(conv.inputs) < 2:
                conv.resize_inputs(len(conv.inputs) + 1)
            conv.resize_inputs(3)
            conv.replace_input_with(2, value)
        replace_value(add.outputs[0], data)
        graph.remove(add, safe=True)
        return True
    return False


@register("conv_bias")
class ConvBias(NodeRewrite):
    def rewrite(self, graph: ir.Graph, node: ir.Node) -> bool:
        return _fold(graph, node)
