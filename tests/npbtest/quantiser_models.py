"""A small float model that exercises what onnxruntime's QDQ quantiser does to a graph: the tests of npubuild's
faster quantiser paths (ort_quantiser, qdq_template) compare their bytes with onnxruntime's own on it."""

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
