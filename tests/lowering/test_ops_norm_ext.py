"""RMSNormalization, GroupNormalization, LpNormalization, LRN (FP), LayerNormalization over several axes,
and Gemm with a [1, N] or scalar bias (the last two rewritten at import into forms onnxruntime's quantiser
takes: frontend/passes/quantiser_forms.py). FP against onnxruntime, INT against the QDQ graph, Vela on
U55 and U85, npu-sim bit-exact."""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np
import onnx
import pytest
from npbtest.npusim import assert_bitexact, vela_raw
from npbtest.ops import calib, check_fp, check_int, io_dict, prepare, rand, single_op_model, vela_op_counts

from npubuild.errors import UnsupportedOpError
from npubuild.lowering.driver import lower_model

RNG = np.random.default_rng(0)


def gamma(*shape):
    return RNG.uniform(0.5, 1.5, shape).astype(np.float32)


def beta(*shape):
    return RNG.normal(0, 0.2, shape).astype(np.float32)


CASES = [
    ("RMSNormalization", [2, 6, 16], {"g": gamma(16)}, 23, {}),
    ("RMSNormalization", [2, 4, 8], {"g": gamma(4, 8)}, 23, {"axis": -2}),
    ("GroupNormalization", [1, 8, 4, 4], {"g": gamma(8), "b": beta(8)}, 21, {"num_groups": 2}),
    ("GroupNormalization", [2, 6, 5], {"g": gamma(6), "b": beta(6)}, 21, {"num_groups": 3}),
    ("LpNormalization", [2, 10], {}, 17, {"p": 2, "axis": 1}),
    ("LpNormalization", [2, 10], {}, 17, {"p": 1, "axis": 1}),
    ("LpNormalization", [1, 4, 5, 5], {}, 17, {"p": 2, "axis": 1}),
    ("LayerNormalization", [2, 3, 4, 5], {"g": gamma(4, 5), "b": beta(4, 5)}, 17, {"axis": -2}),
    ("LayerNormalization", [2, 3, 4, 5], {"g": gamma(5)}, 17, {"axis": 1}),  # scale broadcast over [3, 4, 5]
]


@pytest.mark.parametrize("op,shape,inits,opset,attrs", CASES, ids=lambda v: v if isinstance(v, str) else None)
def test_normalisation_within_one_lsb(op, shape, inits, opset, attrs):
    model = single_op_model(op, {"x": shape}, {"y": shape}, inits, opset=opset, **attrs)
    check_fp(model, {"x": rand(shape, 1)}, rtol=1e-4, atol=1e-4)
    lowered, _ = check_int(model, calib("x", shape), {"x": rand(shape, 2)}, max_lsb=1, qdq_semantics=True)
    for accel in ("ethos-u55-128", "ethos-u85-256"):
        npu, cpu = vela_op_counts(lowered.tosa, accel)
        assert cpu == 0 and npu >= 1, accel
    with tempfile.TemporaryDirectory() as tmp:
        assert_bitexact(lowered.tosa, io_dict(lowered), vela_raw(lowered.tosa, Path(tmp)))


def test_multi_axis_layer_norm_is_one_axis_after_import():
    model = single_op_model("LayerNormalization", {"x": [2, 3, 4, 5]}, {"y": [2, 3, 4, 5]},
                            {"g": gamma(4, 5), "b": beta(4, 5)}, axis=-2)
    ops = [(n.op_type, [a.i for a in n.attribute if a.name == "axis"]) for n in prepare(model).graph.node]
    assert ops == [("Reshape", []), ("LayerNormalization", [-1]), ("Reshape", [])]


def test_lrn_fp_and_int_refused():
    model = single_op_model("LRN", {"x": [1, 6, 4, 4]}, {"y": [1, 6, 4, 4]}, size=3, alpha=0.01, beta=0.75, bias=1.0)
    check_fp(model, {"x": rand([1, 6, 4, 4], 1)})
    model = single_op_model("LRN", {"x": [1, 6, 4, 4]}, {"y": [1, 6, 4, 4]}, size=5)
    with pytest.raises(UnsupportedOpError, match="FP profile only"):
        lower_model(prepare(model), "int")


@pytest.mark.parametrize("bias", [RNG.normal(0, 0.2, (1, 5)).astype(np.float32), np.array(0.3, np.float32),
                                  np.array([0.3], np.float32)], ids=["1xN", "scalar", "one"])
def test_gemm_bias_shapes_the_quantiser_fails_on(bias):
    """onnxruntime's quantiser failed on these; the import broadcasts C to [N] (the same Gemm)."""
    model = single_op_model("Gemm", {"x": [3, 8]}, {"y": [3, 5]}, {"w": RNG.normal(0, 0.4, (8, 5)).astype(np.float32),
                                                                   "c": bias})
    assert [i.dims for i in prepare(model).graph.initializer if i.name.endswith("bias_vector")] == [[5]]
    check_fp(model, {"x": rand([3, 8], 1)})
    check_int(model, calib("x", [3, 8]), {"x": rand([3, 8], 2)}, max_lsb=1)


def test_layer_norm_with_mean_and_inv_std_dev_outputs():
    """Written out as the ONNX function body at import, so all three outputs are ordinary int8 tensors."""
    from onnx import TensorProto, helper

    shape = [2, 3, 4]
    node = helper.make_node("LayerNormalization", ["x", "g", "b"], ["y", "mean", "inv"], axis=1, epsilon=1e-3)
    graph = helper.make_graph([node], "ln", [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
                              [helper.make_tensor_value_info(n, TensorProto.FLOAT, s)
                               for n, s in (("y", shape), ("mean", [2, 1, 1]), ("inv", [2, 1, 1]))],
                              [onnx.numpy_helper.from_array(gamma(3, 4), "g"), onnx.numpy_helper.from_array(beta(3, 4), "b")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    check_fp(model, {"x": rand(shape, 1)})
    check_int(model, calib("x", shape), {"x": rand(shape, 2)}, max_lsb=1, qdq_semantics=True)


def test_same_type_cast_is_dropped_at_import():
    """A float32 -> float32 Cast (stash_type in exported norms) is not quantised by onnxruntime; dropped."""
    from onnx import TensorProto, helper

    nodes = [helper.make_node("Sigmoid", ["x"], ["s"]), helper.make_node("Cast", ["s"], ["c"], to=TensorProto.FLOAT),
             helper.make_node("Tanh", ["c"], ["y"])]
    graph = helper.make_graph(nodes, "cast", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    assert [n.op_type for n in prepare(model).graph.node] == ["Sigmoid", "Tanh"]
    check_int(model, calib("x", [2, 4]), {"x": rand([2, 4], 2)}, max_lsb=0)
