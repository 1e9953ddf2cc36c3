"""Greater / Less / GreaterOrEqual / LessOrEqual / Where lowerings: FP and INT against onnxruntime, and Vela on U85
(U55 has no GREATER/SELECT). Threshold 0.0 sits on the int8 grid (the zero point): the or-equal forms must move the
integer bound by one step there (openWakeWord's GreaterOrEqual(score, 0.5) gate ran on the host before)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from npbtest.ops import calib, check_fp, check_int, rand, vela_op_counts
from onnx import TensorProto, helper, numpy_helper


def select_model(cmp: str, threshold: float) -> onnx.ModelProto:
    """y = Where(cmp(x, threshold), x, Relu(x)) after a Conv, so every operand is an int8 activation."""
    w = np.random.default_rng(3).uniform(-1, 1, (4, 4, 1, 1)).astype(np.float32)
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], name="conv"),
             helper.make_node(cmp, ["c", "t"], ["g"], name="cmp"),
             helper.make_node("Relu", ["c"], ["r"], name="relu"),
             helper.make_node("Where", ["g", "c", "r"], ["y"], name="where")]
    graph = helper.make_graph(nodes, "sel", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 6, 6])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 6, 6])],
                              [numpy_helper.from_array(w, "w"),
                               numpy_helper.from_array(np.array(threshold, np.float32), "t")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


@pytest.mark.parametrize("cmp", ["Greater", "Less", "GreaterOrEqual", "LessOrEqual"])
@pytest.mark.parametrize("threshold", [-0.3, 0.0, 0.41])
def test_compare_and_select(cmp: str, threshold: float):
    model = select_model(cmp, threshold)
    check_fp(model, {"x": rand((1, 4, 6, 6), 11)})
    lowered, _ = check_int(model, calib("x", [1, 4, 6, 6]), {"x": rand((1, 4, 6, 6), 12)}, max_lsb=1)
    assert {"GREATER", "SELECT"} <= {op for ops in lowered.node_ops.values() for op in ops}
    npu, cpu = vela_op_counts(lowered.tosa, "ethos-u85-256")
    assert npu > 0 and cpu == 0


@pytest.mark.parametrize("cmp", ["Greater", "Less"])
def test_constant_first_operand(cmp: str):
    """Less(0.2, c) is Greater(c, 0.2): a constant first operand was reshaped to rank 0 before (invalid TOSA)."""
    model = select_model(cmp, 0.2)
    model.graph.node[1].input[:] = ["t", "c"]
    check_fp(model, {"x": rand((1, 4, 6, 6), 11)})
    lowered, _ = check_int(model, calib("x", [1, 4, 6, 6]), {"x": rand((1, 4, 6, 6), 12)}, max_lsb=1)
    npu, cpu = vela_op_counts(lowered.tosa, "ethos-u85-256")
    assert npu > 0 and cpu == 0


@pytest.mark.parametrize("cmp", ["Greater", "GreaterOrEqual"])
def test_two_tensors_on_different_scales(cmp: str):
    """Greater(c, 0.5 * relu(c)): operands with unequal int8 scales meet on one int32 grid (GREATER_EQUAL for >=:
    c >= relu(c) / 2 holds with equality wherever c <= 0, both 0)."""
    w = np.random.default_rng(3).uniform(-1, 1, (4, 4, 1, 1)).astype(np.float32)
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], name="conv"),
             helper.make_node("Relu", ["c"], ["r"], name="relu"),
             helper.make_node("Mul", ["r", "half"], ["rh"], name="half"),
             helper.make_node(cmp, ["c", "rh"], ["g"], name="cmp"),
             helper.make_node("Where", ["g", "c", "rh"], ["y"], name="where")]
    graph = helper.make_graph(nodes, "cmp2", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 6, 6])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 6, 6])],
                              [numpy_helper.from_array(w, "w"), numpy_helper.from_array(np.array(0.5, np.float32), "half")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    check_fp(model, {"x": rand((1, 4, 6, 6), 11)})
    check_int(model, calib("x", [1, 4, 6, 6]), {"x": rand((1, 4, 6, 6), 12)}, max_lsb=1)
