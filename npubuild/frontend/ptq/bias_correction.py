"""Bias correction (Nagel et al. 2019, section 4.2; NNCF's fast bias correction): rounding a layer's weights
(few per channel in a depthwise conv) and its input shifts the mean of its output per channel, and a
shifted mean is a bias every later layer sees. Measured per layer on the calibration data, and added back
into the layer's int32 bias.

Each layer is measured alone: a copy of the QDQ layer (its input's Q/DQ pair, its int8 weights and bias) is
fed the float model's own input to it, beside the float layer. Correcting every layer by what the whole
QDQ model shows at its output instead counts each upstream shift again in every layer below it (it made
BlazeFace 25 dB worse, bench/ptq_real.md).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx
from onnx import numpy_helper

from npubuild.frontend.ptq.session import session_options
from npubuild.frontend.ptq.stats import exposing

LAYERS = {"Conv": 1, "ConvTranspose": 1, "Gemm": -1}  # op -> channel axis of its output
SUFFIX = "__npubuild_bc"


@dataclass
class BiasedLayer:
    node: onnx.NodeProto  # the QDQ model's layer
    float_output: str  # its output in the float model
    bias: str  # the int32 initializer its bias DequantizeLinear reads
    scale: str  # that DequantizeLinear's scale initializer
    axis: int


def biased_layers(qdq: onnx.ModelProto, float_model: onnx.ModelProto) -> list[BiasedLayer]:
    """Conv/ConvTranspose/Gemm nodes whose activation input is a Q/DQ pair and whose bias is an int32 DQ."""
    inits = {t.name: t for t in qdq.graph.initializer}
    prod = {o: n for n in qdq.graph.node for o in n.output}
    float_nodes = {n.name: n for n in float_model.graph.node if n.name}
    layers = []
    for n in qdq.graph.node:
        f = float_nodes.get(n.name)
        if n.op_type not in LAYERS or f is None or f.op_type != n.op_type or len(n.input) < 3:
            continue
        dq, bias_dq = prod.get(n.input[0]), prod.get(n.input[2])
        q = prod.get(dq.input[0]) if dq is not None and dq.op_type == "DequantizeLinear" else None
        if q is None or q.op_type != "QuantizeLinear" or bias_dq is None or bias_dq.op_type != "DequantizeLinear":
            continue
        b = inits.get(bias_dq.input[0])
        if b is None or b.data_type != onnx.TensorProto.INT32 or bias_dq.input[1] not in inits:
            continue
        layers.append(BiasedLayer(n, f.output[0], bias_dq.input[0], bias_dq.input[1], LAYERS[n.op_type]))
    return layers


def local_model(qdq: onnx.ModelProto, float_model: onnx.ModelProto, layers: list[BiasedLayer]) -> onnx.ModelProto:
    """The float model plus, for each layer, its QDQ copy reading the float model's input to it (output
    `<float output>__npubuild_bc`)."""
    prod = {o: n for n in qdq.graph.node for o in n.output}
    float_inputs = {n.name: n.input[0] for n in float_model.graph.node if n.name}
    qinits = {t.name: t for t in qdq.graph.initializer}
    m = onnx.ModelProto()
    m.CopyFrom(float_model)
    have = {t.name for t in m.graph.initializer}
    for la in layers:
        chain = [prod[la.node.input[0]]]  # DQ of the input, then its Q
        chain.append(prod[chain[0].input[0]])
        chain += [prod[i] for i in la.node.input[1:] if i in prod]  # weight and bias DQs
        tag = f"{SUFFIX}{len(m.graph.node)}"
        for node in [*chain, la.node]:
            copy = onnx.NodeProto()
            copy.CopyFrom(node)
            copy.name = node.name + tag
            for k, name in enumerate(copy.input):
                if name in prod:
                    copy.input[k] = name + tag
                elif name in qinits and name not in have:
                    m.graph.initializer.append(qinits[name])
                    have.add(name)
            copy.output[:] = [o + tag for o in copy.output]
            if node is chain[1]:  # the Q reads the float model's own tensor
                copy.input[0] = float_inputs[la.node.name]
            m.graph.node.append(copy)
        la_out = la.node.output[0] + tag
        m.graph.node.append(onnx.helper.make_node("Identity", [la_out], [la.float_output + SUFFIX]))
    del m.graph.value_info[:]  # the copies' tensors have no value_info; onnxruntime infers them
    return m


def _channel_means(x: np.ndarray, axis: int) -> np.ndarray:
    x = np.moveaxis(np.asarray(x, np.float64), axis, 0)
    return x.reshape(x.shape[0], -1).mean(axis=1)


def correct_biases(qdq: onnx.ModelProto, float_model: onnx.ModelProto, arrays: dict[str, np.ndarray]) -> int:
    """Add each layer's measured per-channel output shift back into its int32 bias, in place; returns how many
    biases changed."""
    import onnxruntime as ort

    layers = biased_layers(qdq, float_model)
    if not layers:
        return 0
    names = [n for la in layers for n in (la.float_output, la.float_output + SUFFIX)]
    session = ort.InferenceSession(exposing(local_model(qdq, float_model, layers), names), session_options(),
                                   providers=["CPUExecutionProvider"])
    feeds_names = {i.name for i in session.get_inputs()}
    n = next(iter(arrays.values())).shape[0]
    shift: list[np.ndarray | None] = [None] * len(layers)
    for i in range(n):
        outs = session.run(names, {k: np.asarray(v[i]) for k, v in arrays.items() if k in feeds_names})
        for j, la in enumerate(layers):
            d = (_channel_means(outs[2 * j], la.axis) - _channel_means(outs[2 * j + 1], la.axis)) / n
            shift[j] = d if shift[j] is None else shift[j] + d
    inits = {t.name: t for t in qdq.graph.initializer}
    changed = 0
    for la, d in zip(layers, shift, strict=True):
        bias = numpy_helper.to_array(inits[la.bias]).astype(np.int64)
        scale = np.broadcast_to(numpy_helper.to_array(inits[la.scale]).astype(np.float64), bias.shape)
        if d is None or d.shape != bias.shape:
            continue
        step = np.round(d / scale)
        if np.any(step):
            new = np.clip(bias + step, -(2**31), 2**31 - 1).astype(np.int32)
            inits[la.bias].CopyFrom(numpy_helper.from_array(new, la.bias))
            changed += 1
    return changed
