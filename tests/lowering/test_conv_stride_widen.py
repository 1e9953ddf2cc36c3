"""U85: a strided conv whose stride never reaches the last input row/col gets zero taps instead of a SLICE.

TOSA wants (in - 1 + pads - (k - 1)) to divide by the stride where ONNX floors,
so a 1x1 stride-2 shortcut over a 16x16 map must not read row/col 15. Slicing
the input to 15x15 leaves the block input with two readers of different widths
(the 3x3 stride-2 branch reads all 16), which makes Vela give up its brick
format and pick a worse block; a 2x2 kernel whose extra taps are zero computes
the same integers from the full-width input. Checked against onnxruntime, the
portable graph and Vela.
"""

from __future__ import annotations

import numpy as np
from onnx import TensorProto, helper, numpy_helper
from ophelpers import calib, check_int, quantize_model, vela_run
from test_depthwise_requantize import assert_same_reference, ops

from npubuild.lowering.driver import lower_model


def _downsampling_block(c: int = 32, o: int = 64, hw: int = 16):
    """A conv, then ResNet's downsampling block: 3x3 stride-2 conv and a 1x1 stride-2 shortcut from one input, then Add."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.normal(0, 0.1, (o, c, 3, 3)).astype(np.float32), "w3"),
             numpy_helper.from_array(rng.normal(0, 0.1, (o, c, 1, 1)).astype(np.float32), "w1"),
             numpy_helper.from_array(rng.normal(0, 0.1, o).astype(np.float32), "b3"),
             numpy_helper.from_array(rng.normal(0, 0.1, o).astype(np.float32), "b1"),
             numpy_helper.from_array(rng.normal(0, 0.2, (c, c, 1, 1)).astype(np.float32), "w0")]
    nodes = [helper.make_node("Conv", ["x", "w0"], ["p"], name="conv0"),
             helper.make_node("Relu", ["p"], ["r"], name="relu"),
             helper.make_node("Conv", ["r", "w3", "b3"], ["a"], name="conv3", strides=[2, 2], pads=[1, 1, 1, 1]),
             helper.make_node("Conv", ["r", "w1", "b1"], ["s"], name="shortcut", strides=[2, 2]),
             helper.make_node("Add", ["a", "s"], ["y"], name="add")]
    g = helper.make_graph(nodes, "block", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, c, hw, hw])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, o, hw // 2, hw // 2])], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def test_u85_zero_taps_identical_to_the_slice_and_faster():
    model = _downsampling_block()
    shape = [1, 32, 16, 16]
    cal = calib("x", shape)
    check_int(model, cal, {"x": np.random.default_rng(3).uniform(-1, 1, shape).astype(np.float32)})
    qdq = quantize_model(model, cal)
    portable, u85 = lower_model(qdq, "int"), lower_model(qdq, "int", family="u85")
    assert "SLICE" in ops(portable) and "SLICE" not in ops(u85)
    assert_same_reference(portable, u85)
    assert vela_run(u85.tosa, "ethos-u85-256").cycles < vela_run(portable.tosa, "ethos-u85-256").cycles


def test_u55_keeps_the_slice():
    """On U55 the zero taps cost more MAC cycles than the brick format saves."""
    qdq = quantize_model(_downsampling_block(), calib("x", [1, 32, 16, 16]))
    assert "SLICE" in ops(lower_model(qdq, "int", family="u55"))
