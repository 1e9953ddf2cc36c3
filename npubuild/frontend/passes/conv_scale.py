"""A constant multiplied into a Conv or ConvTranspose's output, per output channel or one for all: folded into
the convolution's weights and bias.

PP-LCNetV3 (PP-OCRv4's detector and recogniser backbones) ends each reparameterised conv with a learnable affine,
`conv * s + t` with scalar s and t, which Paddle2ONNX writes as a Mul and an Add after the Conv (28 of each in
ppocrv4_det_160). Left as they are, the int8 model rounds the convolution's output to int8, then the product, then
the sum: three roundings where the folded convolution has one, and two more elementwise ops on the NPU. Folded
(weights * s, bias * s; then conv_bias folds the Add), ppocrv4_det_160 U55-128 runs 9.851 -> 9.411 ms. What it does
to accuracy against float is within the quantiser's spread on PP-OCR's models: one recipe gains, another loses,
by up to 6 dB on the detector (bench/real_idioms.md).

Only where the convolution's output has no other reader and the constant varies along the channel axis alone.
In float the folded convolution is the same function up to the last bits, as a folded BatchNormalization is.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from npubuild.frontend.passes import register
from npubuild.frontend.passes._rewrite import NodeRewrite, new_initializer, replace_value
from npubuild.frontend.passes.conv_bias import CONVS, channel_vector, out_channels


def _scaled_weights(conv: ir.Node, weights: np.ndarray, scale: np.ndarray) -> np.ndarray:
    """The weights with each output channel's kernel times its scale: axis 0 of a Conv's; a ConvTranspose's
    [C_in, C_out / group, ...] holds output channel g * C_out / group + j at group g's rows, column j."""
    w = weights.astype(np.float64)
    if conv.op_type == "Conv":
        return w * scale.reshape(-1, *([1] * (w.ndim - 1)))
    group = conv.attributes.get_int("group", 1)
    per_group = w.reshape(group, w.shape[0] // group, *w.shape[1:])
    return (per_group * scale.reshape(group, 1, w.shape[1], *([1] * (w.ndim - 2)))).reshape(w.shape)


def _fold(graph: ir.Graph, mul: ir.Node) -> bool:
    if mul.op_type != "Mul" or len(mul.inputs) != 2:
        return False
    for data_index in (0, 1):
        data, const = mul.inputs[data_index], mul.inputs[1 - data_index]
        conv = data.producer() if data is not None else None
        if conv is None or conv.op_type not in CONVS or conv.domain not in ("", "ai.onnx"):
            continue
        if data.is_graph_output() or len(data.uses()) != 1 or data.shape is None:
            continue
        weights = conv.inputs[1] if len(conv.inputs) > 1 else None
        bias = conv.inputs[2] if len(conv.inputs) > 2 else None
        if weights is None or weights.const_value is None or (bias is not None and bias.const_value is None):
            continue
        channels = out_channels(conv)
        scale = channel_vector(const, channels, len(data.shape)) if channels else None
        if scale is None:
            continue
        w = weights.const_value.numpy()
        base = conv.name or "conv"
        scaled = _scaled_weights(conv, w, scale).astype(w.dtype)
        conv.replace_input_with(1, new_initializer(graph, f"{base}_weights_scaled", scaled))
        if bias is not None:  # a shared initializer stays as it was for its other readers: these are new values
            b = bias.const_value.numpy()
            scaled_bias = (b.astype(np.float64) * scale).astype(b.dtype)
            conv.replace_input_with(2, new_initializer(graph, f"{base}_bias_scaled", scaled_bias))
        replace_value(mul.outputs[0], data)
        graph.remove(mul, safe=True)
        return True
    return False


@register("conv_scale")
class ConvScale(NodeRewrite):
    def rewrite(self, graph: ir.Graph, node: ir.Node) -> bool:
        return _fold(graph, node)
