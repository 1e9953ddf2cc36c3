"""onnxruntime's quantiser with npubuild's loops and remembered weight parameters writes the same bytes."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper
from onnxruntime import quantization as ortq

from npubuild.frontend.ort_quantiser import QuantiserCache, linear_quantiser
from npubuild.frontend.quantize import ArrayReader


def _model(rng) -> onnx.ModelProto:
    """conv -> relu -> maxpool, a second conv beside it, concat, gemm: rewiring, weights, shared scales."""
    def init(name: str, *shape: int) -> onnx.TensorProto:
        return numpy_helper.from_array(rng.normal(0, 0.3, shape).astype(np.float32), name)

    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1], name="conv1"),
             helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
             helper.make_node("MaxPool", ["r1"], ["p1"], kernel_shape=[2, 2], strides=[2, 2], name="pool"),
             helper.make_node("Conv", ["x", "w2", "b2"], ["c2"], strides=[2, 2], name="conv2"),
             helper.make_node("Concat", ["p1", "c2"], ["cat"], axis=1, name="cat"),
             helper.make_node("Flatten", ["cat"], ["flat"], name="flat"),
             helper.make_node("Gemm", ["flat", "wg", "bg"], ["y"], transB=1, name="fc")]
    inits = [init("w1", 8, 3, 3, 3), init("b1", 8), init("w2", 4, 3, 2, 2), init("b2", 4), init("wg", 10, 12 * 64),
             init("bg", 10)]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 16, 16])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 10])], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def _quantise(src: Path, out: Path, x: np.ndarray) -> bytes:
    ortq.quantize_static(str(src), str(out), ArrayReader({"x": x}), quant_format=ortq.QuantFormat.QDQ,
                         per_channel=True, activation_type=ortq.QuantType.QInt8, weight_type=ortq.QuantType.QInt8,
                         extra_options={"ActivationSymmetric": False, "WeightSymmetric": True,
                                        "ForceQuantizeNoInputCheck": True})
    return out.read_bytes()


def test_quantiser_shortcuts_write_onnxruntimes_own_model(tmp_path: Path):
    """The same QDQ model, byte for byte, from onnxruntime's own functions, from the replacements, and from
    the replacements again with every weight channel's parameters remembered from the first run."""
    rng = np.random.default_rng(5)
    src = tmp_path / "float.onnx"
    onnx.save(_model(rng), src)
    x = rng.uniform(-1, 1, (4, 1, 3, 16, 16)).astype(np.float32)
    own = _quantise(src, tmp_path / "own.onnx", x)
    cache = QuantiserCache(tmp_path)
    with linear_quantiser(cache):
        first = _quantise(src, tmp_path / "first.onnx", x)
    assert len(cache.results) > 8  # every weight channel's parameters and every weight
    with linear_quantiser(cache):
        second = _quantise(src, tmp_path / "second.onnx", x)
    assert own == first == second
    qdq = onnx.load_from_string(own)
    assert sum(n.op_type == "DequantizeLinear" for n in qdq.graph.node) > 8
    from onnxruntime.quantization import onnx_model, quant_utils
    assert onnx_model.find_by_name is quant_utils.find_by_name  # put back after the block
