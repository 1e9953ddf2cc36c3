"""TFLite custom ops that tf2onnx cannot convert, rewritten as the ONNX ops they are.

tf2onnx converts a TFLite model op by op; a custom op it has no handler for is left as a node of the
default domain named `TFL_<custom name>`, its inputs in place and its custom options dropped. ONNX's
checker refuses such a node ("No Op registered"), so this pass runs on the loaded model before the
checker (frontend/normalise.py), and for each op it knows writes the ONNX form:

- MediaPipe's `Convolution2DTransposeBias` (its segmentation and hair models' upsampler; mediapipe
  0.10.14's selfie_segmentation.tflite): a transposed convolution with bias on an NHWC tensor, weights
  OHWI. Its stride and padding were in the custom options tf2onnx drops; they follow from the kernel and
  the input and output sizes (TFLite's SAME: out = in * stride; VALID: out = (in - 1) * stride + k). It
  becomes ConvTranspose on the NCHW tensor and a Transpose back to NHWC (the layout pass removes the pair
  of transposes tf2onnx put around it). When the output size is not known (no declared shape, none
  reached through elementwise ops), the node stays and the checker's line names it.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper, numpy_helper

SHAPE_KEEPING = frozenset({"Sigmoid", "Relu", "Tanh", "Identity", "Clip", "HardSigmoid", "HardSwish", "LeakyRelu"})


def _dims(vi: onnx.ValueInfoProto | None) -> list[int] | None:
    if vi is None or not vi.type.tensor_type.HasField("shape"):
        return None
    dims = [d.dim_value if d.HasField("dim_value") and d.dim_value > 0 else None for d in vi.type.tensor_type.shape.dim]
    return dims if dims and all(d is not None for d in dims) else None


def _output_shape(graph: onnx.GraphProto, name: str, known: dict[str, onnx.ValueInfoProto]) -> list[int] | None:
    """The declared shape of `name`, or of the value a chain of one-input elementwise ops turns it into."""
    readers: dict[str, list[onnx.NodeProto]] = {}
    for n in graph.node:
        for i in n.input:
            readers.setdefault(i, []).append(n)
    for _ in range(8):
        dims = _dims(known.get(name))
        if dims is not None:
            return dims
        users = readers.get(name, [])
        if len(users) != 1 or users[0].op_type not in SHAPE_KEEPING:
            return None
        name = users[0].output[0]
    return None


def _transpose_conv_params(in_hw: list[int], out_hw: list[int], kernel: list[int]) -> tuple[list[int], list[int]] | None:
    """(strides, pads [top, left, bottom, right]) with which a transposed conv of `kernel` maps in_hw to out_hw."""
    strides, begin, end = [], [], []
    for i, o, k in zip(in_hw, out_hw, kernel, strict=True):
        if o % i == 0:  # SAME: out = in * stride, the surplus cropped half before (more after)
            s = o // i
        elif i > 1 and (o - k) % (i - 1) == 0:  # VALID: out = (in - 1) * stride + k
            s = (o - k) // (i - 1)
        else:
            return None
        total = (i - 1) * s + k - o
        if s < 1 or total < 0:
            return None
        strides.append(s)
        begin.append(total // 2)
        end.append(total - total // 2)
    return strides, begin + end


def _mediapipe_transpose_conv(graph: onnx.GraphProto, node: onnx.NodeProto, known: dict, inits: dict) -> list | None:
    if len(node.input) != 3 or node.input[1] not in inits or node.input[2] not in inits:
        return None
    w = numpy_helper.to_array(inits[node.input[1]])  # O, kh, kw, I
    b = numpy_helper.to_array(inits[node.input[2]])
    x_dims = _dims(known.get(node.input[0]))
    out_dims = _output_shape(graph, node.output[0], known)
    if w.ndim != 4 or x_dims is None or out_dims is None or len(x_dims) != 4 or len(out_dims) != 4:
        return None
    o, kh, kw, i = w.shape
    if x_dims[3] != i or out_dims[3] != o:
        return None
    params = _transpose_conv_params(x_dims[1:3], out_dims[1:3], [kh, kw])
    if params is None:
        return None
    strides, pads = params
    base = node.name or node.output[0]
    w_name, b_name = f"{base}_weight_iohw", f"{base}_bias"
    tensors = [numpy_helper.from_array(np.ascontiguousarray(w.transpose(3, 0, 1, 2)), w_name),
               numpy_helper.from_array(np.ascontiguousarray(b.reshape(-1).astype(w.dtype)), b_name)]
    made = []
    nchw = _nchw_source(graph, node.input[0])  # tf2onnx's own NCHW -> NHWC Transpose before it: read past it
    if nchw is None:
        nchw = f"{base}_nchw_in"
        made.append(helper.make_node("Transpose", [node.input[0]], [nchw], name=f"{base}_to_nchw", perm=[0, 3, 1, 2]))
    made.append(helper.make_node("ConvTranspose", [nchw, w_name, b_name], [f"{base}_nchw"], name=base,
                                 kernel_shape=[kh, kw], strides=strides, pads=pads))
    made.append(helper.make_node("Transpose", [f"{base}_nchw"], list(node.output), name=f"{base}_to_nhwc",
                                 perm=[0, 2, 3, 1]))
    return [tensors, made]


def _nchw_source(graph: onnx.GraphProto, name: str) -> str | None:
    """The NCHW tensor behind `name` when `name` is a Transpose [0, 2, 3, 1] of it (the Transpose, if no one
    else reads it, is then dead and removed by the import's clean-up)."""
    producer = next((n for n in graph.node if name in n.output), None)
    if producer is None or producer.op_type != "Transpose":
        return None
    perm = next((list(a.ints) for a in producer.attribute if a.name == "perm"), None)
    return producer.input[0] if perm == [0, 2, 3, 1] else None


REWRITES = {"TFL_Convolution2DTransposeBias": _mediapipe_transpose_conv}


def rewrite_tflite_custom_ops(model: onnx.ModelProto) -> onnx.ModelProto:
    """The model with each TFLite custom op this module knows rewritten (unchanged if it has none)."""
    if not any(n.op_type in REWRITES and n.domain in ("", "ai.onnx") for n in model.graph.node):
        return model
    inferred = onnx.shape_inference.infer_shapes(model, strict_mode=False)  # up to the custom op: its input
    known = {vi.name: vi for vi in [*inferred.graph.input, *inferred.graph.value_info, *inferred.graph.output]}
    inits = {t.name: t for t in model.graph.initializer}
    nodes: list[onnx.NodeProto] = []
    for node in model.graph.node:
        made = REWRITES[node.op_type](model.graph, node, known, inits) \
            if node.op_type in REWRITES and node.domain in ("", "ai.onnx") else None
        if made is None:
            nodes.append(node)
            continue
        tensors, new_nodes = made
        model.graph.initializer.extend(tensors)
        nodes.extend(new_nodes)
    del model.graph.node[:]
    model.graph.node.extend(nodes)
    return model
