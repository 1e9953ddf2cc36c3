"""AveragePool with padding not counted (count_include_pad=0) onto a new output scale rounds once
(pooling._unpadded_mean), not in AVG_POOL2D and again in a requantise (issue 21). A QDQ model from another
tool can give the pool its own output scale (onnxruntime's quantiser keeps the input's)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from npbtest.ops import rand, vela_op_counts
from onnx import TensorProto, helper, numpy_helper

from npubuild.lowering.driver import lower_model
from npubuild.lowering.pooling import window_counts
from npubuild.tosa.run import OnnxSession, run_tosa


def _pool_qdq(out_scale: float, pads=(1, 1, 1, 1), stride: int = 1) -> onnx.ModelProto:
    inits = [numpy_helper.from_array(np.array(0.02, np.float32), "s1"),
             numpy_helper.from_array(np.array(out_scale, np.float32), "s2"),
             numpy_helper.from_array(np.array(3, np.int8), "z1"), numpy_helper.from_array(np.array(-5, np.int8), "z2")]
    nodes = [helper.make_node("QuantizeLinear", ["x", "s1", "z1"], ["xq"]),
             helper.make_node("DequantizeLinear", ["xq", "s1", "z1"], ["xd"]),
             helper.make_node("AveragePool", ["xd"], ["p"], kernel_shape=[3, 3], strides=[stride, stride],
                              pads=list(pads), count_include_pad=0, name="pool"),
             helper.make_node("QuantizeLinear", ["p", "s2", "z2"], ["pq"]),
             helper.make_node("DequantizeLinear", ["pq", "s2", "z2"], ["y"])]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, 12, 12])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 19)])
    m.ir_version = 9
    return onnx.shape_inference.infer_shapes(m)


def test_window_counts_are_the_unpadded_elements():
    c = window_counts((5, 4), (3, 3), (2, 1), [1, 1, 1, 1], (3, 4))
    assert c.tolist() == [[4, 6, 6, 4], [6, 9, 9, 6], [4, 6, 6, 4]]


@pytest.mark.parametrize("ratio, stride", [(0.7, 1), (1 / 3, 1), (0.7, 2)])
def test_padded_mean_onto_a_new_scale_rounds_once(ratio, stride):
    model = _pool_qdq(0.02 * ratio, stride=stride)
    lowered = lower_model(model, "int")
    ops = [op for v in lowered.node_ops.values() for op in v]
    assert "AVG_POOL2D" not in ops and ops.count("RESCALE") == 1
    ref, spec = OnnxSession(model.SerializeToString()), lowered.outputs[0]
    err = np.concatenate([spec.lsb_error(ref(f)["y"], run_tosa(lowered.tosa, lowered, f)["y"]).ravel()
                          for f in ({"x": rand([1, 8, 12, 12], seed=s, low=-2, high=2)} for s in range(4))])
    # pooled on the input's grid and requantised, the same pools were 2 LSB off on 63% (1/3) and 1 LSB on
    # 33% (0.7) of elements; what is left are exact ties (a third of the input scale: sum * 3 / 6) that
    # onnxruntime's float32 rounds to even and TOSA up
    assert err.max() <= 1
    assert np.mean(err > 0) < (0.06 if ratio < 0.5 else 0.005)


def test_the_rounded_once_mean_runs_on_the_u55_npu():
    npu, cpu = vela_op_counts(lower_model(_pool_qdq(0.014), "int", family="u55").tosa, "ethos-u55-128")
    assert npu >= 1 and cpu == 0


def test_a_bias_on_another_scale_is_requantised_not_taken_as_exact():
    from npubuild.lowering.convolution import Bias

    acc_scale = np.full(2, 5.7e-7)
    exact = np.array([-231034, 118683], np.int32)
    bias = Bias(exact * acc_scale * 0.9929, exact, acc_scale * 0.9929)  # 0.7% apart: inside atol=1e-8
    assert bias.int32(acc_scale).tolist() == np.round(exact * 0.9929).astype(int).tolist()
    assert Bias(exact * acc_scale, exact, acc_scale * (1 + 1e-8)).int32(acc_scale) is exact
