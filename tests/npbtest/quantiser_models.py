"""Small float models for the quantiser's tests: one that exercises what onnxruntime's QDQ quantiser does to a graph
(the tests of npubuild's faster quantiser paths, ort_quantiser and qdq_template, compare their bytes with
onnxruntime's own on it), one whose channels cross-layer equalisation evens out."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


def conv_concat_gemm(rng: np.random.Generator, bias_scale: float = 0.3) -> onnx.ModelProto:
    """conv -> relu -> maxpool, a second conv beside it, concat, gemm: input rewiring, a removed Relu, shared
    scales, per-channel weights and int32 biases (`bias_scale`: conv1's bias spread, small to make its scale
    adjust)."""
    def init(name: str, *shape: int, scale: float = 0.3) -> onnx.TensorProto:
        return numpy_helper.from_array(rng.normal(0, scale, shape).astype(np.float32), name)

    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1], name="conv1"),
             helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
             helper.make_node("MaxPool", ["r1"], ["p1"], kernel_shape=[2, 2], strides=[2, 2], name="pool"),
             helper.make_node("Conv", ["x", "w2", "b2"], ["c2"], strides=[2, 2], name="conv2"),
             helper.make_node("Concat", ["p1", "c2"], ["cat"], axis=1, name="cat"),
             helper.make_node("Flatten", ["cat"], ["flat"], name="flat"),
             helper.make_node("Gemm", ["flat", "wg", "bg"], ["y"], transB=1, name="fc")]
    inits = [init("w1", 8, 3, 3, 3), init("b1", 8, scale=bias_scale), init("w2", 4, 3, 2, 2), init("b2", 4),
             init("wg", 10, 12 * 64), init("bg", 10)]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 16, 16])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 10])], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def unequal_channels_model(c=16) -> onnx.ModelProto:
    """conv 3x3 -> relu -> depthwise 3x3 -> conv 1x1: the first conv's output channels span 300x in range (its
    rows scaled so, the depthwise weights scaled back: the float function of a trained net whose channels
    drifted apart), so the per-tensor activation between them leaves the small channels a few levels."""
    rng = np.random.default_rng(5)
    gain = np.geomspace(0.02, 6.0, c)
    w1 = (rng.normal(0, 0.4, (c, 3, 3, 3)) * gain[:, None, None, None]).astype(np.float32)
    wd = (rng.normal(0, 0.4, (c, 1, 3, 3)) / gain[:, None, None, None]).astype(np.float32)
    w2 = rng.normal(0, 0.4, (8, c, 1, 1)).astype(np.float32)
    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["h"], pads=[1, 1, 1, 1], name="conv1"),
             helper.make_node("Relu", ["h"], ["r"], name="relu"),
             helper.make_node("Conv", ["r", "wd", "bd"], ["d"], group=c, pads=[1, 1, 1, 1], name="dw"),
             helper.make_node("Conv", ["d", "w2", "b2"], ["y"], name="pw")]
    inits = [numpy_helper.from_array(w1, "w1"), numpy_helper.from_array((0.01 * gain).astype(np.float32), "b1"),
             numpy_helper.from_array(wd, "wd"), numpy_helper.from_array(np.zeros(c, np.float32), "bd"),
             numpy_helper.from_array(w2, "w2"), numpy_helper.from_array(np.zeros(8, np.float32), "b2")]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 12, 12])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8, 12, 12])], inits)
    return helper.make_model(g)
