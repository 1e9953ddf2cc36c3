"""An average pool's output keeps its input's quantisation (npubuild.frontend.qdq_pool), and what it buys.

onnxruntime gives a global average pool its own output scale, so the lowering sums exactly in int32
(U85: TRANSPOSE + REDUCE_SUM + RESCALE); with the input's parameters, as TFLite's quantiser sets them, the
pool is one AVG_POOL2D that rounds once. The TOSA graph matches onnxruntime on the rewritten QDQ model, the
QDQ model stays close to the float one, and Vela runs the squeeze-excite head in fewer cycles on U85.
"""

from __future__ import annotations

import copy
import tempfile
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from ophelpers import calib, quantize_model, rand, vela_run
from test_depthwise_requantize import ops

from npubuild.frontend.qdq_pool import share_pool_scales
from npubuild.lowering.driver import lower_model
from npubuild.tosa.run import run_onnx, run_tosa

SHAPE = [1, 16, 32, 32]


def se_head(mean: str = "GlobalAveragePool") -> onnx.ModelProto:
    """conv + relu -> the plane mean (GlobalAveragePool, or torch's ReduceMean over [-1, -2]) -> Flatten -> Gemm."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.normal(0, 0.3, (64, 16, 3, 3)).astype(np.float32), "w"),
             numpy_helper.from_array(rng.normal(0, 0.1, 64).astype(np.float32), "b"),
             numpy_helper.from_array(rng.normal(0, 0.2, (10, 64)).astype(np.float32), "fw"),
             numpy_helper.from_array(np.array([-1, -2], np.int64), "axes")]
    pool = helper.make_node("GlobalAveragePool", ["r"], ["m"]) if mean == "GlobalAveragePool" else \
        helper.make_node("ReduceMean", ["r", "axes"], ["m"], keepdims=1)
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c"], ["r"]), pool,
             helper.make_node("Flatten", ["m"], ["f"]),
             helper.make_node("Gemm", ["f", "fw"], ["y"], transB=1)]
    g = helper.make_graph(nodes, "se", [helper.make_tensor_value_info("x", TensorProto.FLOAT, SHAPE)],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 10])], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)])


def run(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> np.ndarray:
    with tempfile.TemporaryDirectory() as tmp:
        p = Path(tmp) / "m.onnx"
        onnx.save(model, p)
        return next(iter(run_onnx(str(p), feeds).values()))


def scales(model: onnx.ModelProto, tensor: str) -> tuple[float, int]:
    """The (scale, zero point) `tensor` is quantised with."""
    inits = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    q = next(n for n in model.graph.node if n.op_type == "QuantizeLinear" and n.input[0] == tensor)
    return float(inits[q.input[1]]), int(inits[q.input[2]])


@pytest.mark.parametrize("mean", ["GlobalAveragePool", "ReduceMean"])
def test_pool_keeps_its_input_scale_and_is_one_avg_pool(mean):
    model = se_head(mean)
    qdq = quantize_model(model, calib("x", SHAPE))
    assert scales(qdq, "m") != scales(qdq, "r")
    before = lower_model(copy.deepcopy(qdq), "int", family="u85")
    shared = copy.deepcopy(qdq)
    assert share_pool_scales(shared) == 1
    assert scales(shared, "m") == scales(shared, "r") == scales(shared, "f")  # Flatten keeps the pool's
    after = lower_model(copy.deepcopy(shared), "int", family="u85")
    assert "REDUCE_SUM" in ops(before) and "REDUCE_SUM" not in ops(after) and "AVG_POOL2D" in ops(after)
    feeds = {"x": rand(SHAPE, seed=3)}
    spec = after.outputs[0]
    ref = run(shared, feeds)
    assert np.max(np.abs(spec.quantize_reference(ref) - run_tosa(after.tosa, after, feeds)[spec.onnx_name])) <= 1
    out_scale = scales(shared, "y_QuantizeLinear_Input")[0]
    assert np.max(np.abs(ref - run(model, feeds))) <= 4 * out_scale  # the QDQ model stays close to the float one
    assert vela_run(after.tosa, "ethos-u85-256").cycles < vela_run(before.tosa, "ethos-u85-256").cycles


def test_parameters_shared_with_another_tensor_are_left():
    qdq = quantize_model(se_head(), calib("x", SHAPE))
    pool_q = next(n for n in qdq.graph.node if n.op_type == "QuantizeLinear" and n.input[0] == "m")
    for n in qdq.graph.node:  # the Gemm output quantised with the pool's parameters too
        if n.op_type in ("QuantizeLinear", "DequantizeLinear") and n.input[0] in ("y_QuantizeLinear_Input", "y_QuantizeLinear_Output"):
            n.input[1], n.input[2] = pool_q.input[1], pool_q.input[2]
    before = scales(qdq, "m")
    assert share_pool_scales(qdq) == 0 and scales(qdq, "m") == before
