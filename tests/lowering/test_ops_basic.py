"""Per-op checks for the skeleton's op set (FP and INT vs onnxruntime, INT compiled by Vela)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from npbtest.ops import calib, check_fp, check_int, rand, single_op_model, vela_op_counts
from onnx import TensorProto, helper


def _conv(shape, cout, k, stride=1, pads=None, group=1, dilation=1, auto_pad=None, seed=0):
    rng = np.random.default_rng(seed)
    cin = shape[1]
    w = rng.normal(0, 0.3, (cout, cin // group, k, k)).astype(np.float32)
    b = rng.normal(0, 0.1, cout).astype(np.float32)
    attrs = {"kernel_shape": [k, k], "strides": [stride, stride], "group": group, "dilations": [dilation, dilation]}
    if auto_pad:
        attrs["auto_pad"] = auto_pad
    else:
        attrs["pads"] = pads if pads is not None else [k // 2] * 4
    return single_op_model("Conv", {"x": shape}, {"y": None}, {"w": w, "b": b}, **attrs)


CONV_CASES = [
    dict(shape=[1, 3, 9, 9], cout=8, k=3),
    dict(shape=[1, 4, 10, 10], cout=6, k=3, stride=2),
    dict(shape=[1, 4, 11, 11], cout=4, k=5, stride=2, pads=[1, 2, 2, 1]),
    dict(shape=[1, 8, 9, 9], cout=8, k=3, group=8),
    dict(shape=[1, 8, 12, 12], cout=8, k=3, group=8, stride=2),
    dict(shape=[1, 4, 12, 12], cout=4, k=3, dilation=2, pads=[2, 2, 2, 2]),
    dict(shape=[1, 4, 9, 9], cout=4, k=3, stride=2, auto_pad="SAME_UPPER"),
    dict(shape=[1, 4, 8, 8], cout=4, k=1),
]


@pytest.mark.parametrize("case", CONV_CASES, ids=lambda c: "-".join(f"{k}{v}" for k, v in c.items()))
def test_conv(case):
    model = _conv(**case)
    shape = case["shape"]
    check_fp(model, {"x": rand(shape, 1)})
    lowered, _ = check_int(model, calib("x", shape), {"x": rand(shape, 2)})
    assert "TRANSPOSE" not in {op for ops in lowered.node_ops.values() for op in ops}
    for accel in ("ethos-u55-128", "ethos-u85-256"):
        npu, cpu = vela_op_counts(lowered.tosa, accel)
        assert cpu == 0 and npu >= 1


@pytest.mark.parametrize("op,attrs", [
    ("MaxPool", {"kernel_shape": [2, 2], "strides": [2, 2]}),
    ("MaxPool", {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]}),
    ("MaxPool", {"kernel_shape": [3, 3], "strides": [2, 2], "ceil_mode": 1}),
    ("AveragePool", {"kernel_shape": [2, 2], "strides": [2, 2]}),
    ("AveragePool", {"kernel_shape": [3, 3], "strides": [1, 1], "pads": [1, 1, 1, 1]}),
    ("AveragePool", {"kernel_shape": [3, 3], "strides": [1, 1], "pads": [1, 1, 1, 1], "count_include_pad": 1}),
    ("GlobalAveragePool", {}),
])
def test_pooling(op, attrs):
    shape = [1, 4, 9, 9]
    model = single_op_model(op, {"x": shape}, {"y": None}, **attrs)
    if not attrs.get("count_include_pad"):
        check_fp(model, {"x": rand(shape, 3)})
    lowered, _ = check_int(model, calib("x", shape), {"x": rand(shape, 4)})
    for accel in ("ethos-u55-128", "ethos-u85-256"):
        assert vela_op_counts(lowered.tosa, accel)[1] == 0


@pytest.mark.parametrize("op", ["Relu", "Clip"])
def test_clamp_activations_after_conv(op):
    """onnxruntime folds a Relu/Clip into the quantisation of the op before it, so test them after a Conv."""
    shape = [1, 4, 6, 6]
    rng = np.random.default_rng(0)
    extra = [helper.make_tensor("lo", TensorProto.FLOAT, [], [0.0]), helper.make_tensor("hi", TensorProto.FLOAT, [], [0.5])]
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], name="conv", kernel_shape=[1, 1]),
             helper.make_node(op, ["c", "lo", "hi"] if op == "Clip" else ["c"], ["y"], name="act")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, shape)],
                              [onnx.numpy_helper.from_array(rng.normal(0, 0.5, (4, 4, 1, 1)).astype(np.float32), "w"),
                               *(extra if op == "Clip" else [])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    check_fp(model, {"x": rand(shape, 5)})
    check_int(model, calib("x", shape), {"x": rand(shape, 6)})


def test_add_with_broadcast_constant():
    shape = [1, 4, 6, 6]
    model = single_op_model("Add", {"x": shape}, {"y": None}, {"c": rand([1, 4, 1, 1], 9)})
    check_fp(model, {"x": rand(shape, 7)})
    lowered, _ = check_int(model, calib("x", shape), {"x": rand(shape, 8)})
    assert vela_op_counts(lowered.tosa, "ethos-u55-128")[1] == 0


def test_add_two_activations():
    shape = [1, 4, 6, 6]
    model = single_op_model("Add", {"a": shape, "b": shape}, {"y": None})
    feeds = {"a": rand(shape, 1), "b": rand(shape, 2, -2, 2)}
    check_fp(model, feeds)
    cal = {**calib("a", shape), **calib("b", shape, seed=5, low=-2, high=2)}
    check_int(model, cal, feeds)


@pytest.mark.parametrize("trans_b", [0, 1])
def test_gemm(trans_b):
    rng = np.random.default_rng(0)
    w = rng.normal(0, 0.3, (10, 16) if trans_b else (16, 10)).astype(np.float32)
    model = single_op_model("Gemm", {"x": [2, 16]}, {"y": None}, {"w": w, "b": rng.normal(0, 0.1, 10).astype(np.float32)},
                            transB=trans_b)
    check_fp(model, {"x": rand([2, 16], 1)})
    lowered, _ = check_int(model, calib("x", [2, 16]), {"x": rand([2, 16], 2)})
    assert vela_op_counts(lowered.tosa, "ethos-u55-128")[1] == 0


def test_matmul_constant_weight():
    w = np.random.default_rng(0).normal(0, 0.3, (16, 8)).astype(np.float32)
    model = single_op_model("MatMul", {"x": [3, 16]}, {"y": None}, {"w": w})
    check_fp(model, {"x": rand([3, 16], 1)})
    check_int(model, calib("x", [3, 16]), {"x": rand([3, 16], 2)})


@pytest.mark.parametrize("op,attrs,init", [
    ("Flatten", {"axis": 1}, {}),
    ("Reshape", {}, {"s": np.array([1, -1], np.int64)}),
    ("Reshape", {}, {"s": np.array([1, 4, 36], np.int64)}),
])
def test_reshapes_keep_semantics(op, attrs, init):
    shape = [1, 4, 6, 6]
    model = single_op_model(op, {"x": shape}, {"y": None}, init, **attrs)
    check_fp(model, {"x": rand(shape, 1)})
    check_int(model, calib("x", shape), {"x": rand(shape, 2)}, max_lsb=0)
