"""TFLite custom ops tf2onnx leaves unconverted (frontend/tflite_custom.py).

MediaPipe's selfie segmentation ends in its custom Convolution2DTransposeBias; tf2onnx 1.17 writes it as a
default-domain node `TFL_Convolution2DTransposeBias` without its options, which the ONNX checker refuses
("No Op registered"), so the original conversion did not import. It is a ConvTranspose with bias on an
NHWC tensor, weights OHWI; stride and padding follow from the shapes."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from npubuild.errors import InputError
from npubuild.frontend.normalise import normalise
from npubuild.tosa.run import OnnxSession


def transpose_conv_nhwc(x: np.ndarray, w: np.ndarray, b: np.ndarray, stride: int, out: int) -> np.ndarray:
    """TFLite's TRANSPOSE_CONV + bias, SAME: the full scatter of each input pixel, cropped (more after)."""
    n, h, wd, _ = x.shape
    o, k, _, _ = w.shape
    full = np.zeros((n, (h - 1) * stride + k, (wd - 1) * stride + k, o), np.float64)
    for i in range(h):
        for j in range(wd):
            full[:, i * stride:i * stride + k, j * stride:j * stride + k, :] += np.einsum("nc,oabc->nabo", x[:, i, j, :], w)
    top = (full.shape[1] - out) // 2
    return (full[:, top:top + out, top:top + out, :] + b).astype(np.float32)


def mediapipe_model(kernel: int, out: int | None) -> tuple[onnx.ModelProto, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    w = rng.normal(size=(2, kernel, kernel, 3)).astype(np.float32)
    b = rng.normal(size=(2,)).astype(np.float32)
    nodes = [helper.make_node("TFL_Convolution2DTransposeBias", ["x", "w", "b"], ["segment"], name="segment"),
             helper.make_node("Sigmoid", ["segment"], ["y"], name="activation")]
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, out, out, 2] if out else [1, "h", "w", 2])
    graph = helper.make_graph(nodes, "selfie", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 4, 3])],
                              [y], [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), w, b


@pytest.mark.parametrize("kernel", [2, 4], ids=["2x2-stride2", "4x4-stride2-same"])
def test_mediapipe_transpose_conv_becomes_a_conv_transpose(kernel: int):
    model, w, b = mediapipe_model(kernel, 8)
    out = normalise(model, {}, "selfie.onnx")
    assert "ConvTranspose" in [n.op_type for n in out.graph.node]
    x = np.random.default_rng(1).normal(size=(1, 4, 4, 3)).astype(np.float32)
    want = 1 / (1 + np.exp(-transpose_conv_nhwc(x, w, b, 2, 8)))
    np.testing.assert_allclose(OnnxSession(out.SerializeToString())({"x": x})["y"], want, rtol=1e-5, atol=1e-6)


def test_without_an_output_size_the_node_stays_and_the_checker_names_it():
    model, _, _ = mediapipe_model(2, None)
    with pytest.raises(InputError, match="TFL_Convolution2DTransposeBias"):
        normalise(model, {}, "selfie.onnx")
