"""Reductions beyond sum/mean/max/min (ReduceSumSquare, L1, L2, LogSum, LogSumExp, Prod), index selection
(ArgMax, ArgMin, Hardmax, TopK) and the variadic Sum and Mean: FP against onnxruntime, INT against the
QDQ graph's own semantics, Vela placement on U55 and U85, npu-sim bit-exactness of the U55 stream."""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np
import onnx
import pytest
from lowering.test_ops_compute import wrapped
from npbtest.npusim import assert_bitexact, vela_raw
from npbtest.ops import calib, check_fp, check_int, io_dict, quantize_model, rand, vela_op_counts
from onnx import TensorProto, helper

from npubuild.errors import UnsupportedOpError
from npubuild.lowering.driver import lower_model

ACCELS = ("ethos-u55-128", "ethos-u85-256")


def on_npu_and_bitexact(lowered) -> None:
    for accel in ACCELS:
        npu, cpu = vela_op_counts(lowered.tosa, accel)
        assert cpu == 0 and npu >= 1, (accel, npu, cpu)
    with tempfile.TemporaryDirectory() as tmp:
        assert_bitexact(lowered.tosa, io_dict(lowered), vela_raw(lowered.tosa, Path(tmp)))


REDUCTIONS = [
    ("ReduceSumSquare", [1, 4, 6, 6], [1], 1, (-1, 1), [1, 1, 6, 6], 0),
    ("ReduceL1", [2, 8], [1], 0, (-1, 1), [2], 0),
    ("ReduceL2", [2, 8], [1], 1, (-1, 1), [2, 1], 0),
    ("ReduceL2", [1, 4, 6, 6], [2, 3], 1, (-1, 1), [1, 4, 1, 1], 0),
    ("ReduceLogSum", [2, 8], [1], 1, (0.05, 1), [2, 1], 0),
    ("ReduceLogSumExp", [2, 8], [1], 1, (-2, 2), [2, 1], 1),
    ("ReduceLogSumExp", [1, 4, 6, 6], [1], 1, (-2, 2), [1, 1, 6, 6], 1),
    ("ReduceProd", [4, 2], [1], 1, (0.5, 1.5), [4, 1], 0),
    ("ReduceProd", [2, 3, 5], [0], 0, (-1.5, 1.5), [3, 5], 0),
]


@pytest.mark.parametrize("op,shape,axes,keep,rng,out,lsb", REDUCTIONS,
                         ids=lambda v: v if isinstance(v, str) else None)
def test_reduction(op, shape, axes, keep, rng, out, lsb):
    """Exact int32 transform and sum, one rounding (LogSumExp: the log softmax's 15-bit exp, <= 1 LSB)."""
    model = wrapped(op, shape, out, inits={"ax": np.array(axes, np.int64)}, extra_inputs=["ax"], keepdims=keep)
    model.opset_import[0].version = 18
    lo, hi = rng
    check_fp(model, {"x": rand(shape, 1, lo, hi)}, rtol=1e-4, atol=1e-4)
    lowered, _ = check_int(model, calib("x", shape, low=lo, high=hi), {"x": rand(shape, 2, lo, hi)}, max_lsb=lsb,
                           qdq_semantics=True)
    on_npu_and_bitexact(lowered)


def test_int8_product_of_more_than_two_factors_is_refused():
    """Three int32 MULs matched the TOSA reference but not U55's command stream (npu-sim): left to the host."""
    model = wrapped("ReduceProd", [2, 4], [2, 1], inits={"ax": np.array([1], np.int64)}, extra_inputs=["ax"], keepdims=1)
    model.opset_import[0].version = 18
    check_fp(model, {"x": rand([2, 4], 1)})
    with pytest.raises(UnsupportedOpError, match="factors"):
        lower_model(quantize_model(model, calib("x", [2, 4])), "int")


def index_model(op: str, shape, out_shape, **attrs) -> onnx.ModelProto:
    """Sigmoid (so the input is quantised) -> op with an int64 output."""
    nodes = [helper.make_node("Sigmoid", ["x"], ["s"]), helper.make_node(op, ["s"], ["y"], **attrs)]
    graph = helper.make_graph(nodes, "idx", [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
                              [helper.make_tensor_value_info("y", TensorProto.INT64, out_shape)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


@pytest.mark.parametrize("op,shape,out,attrs", [
    ("ArgMax", [2, 10], [2, 1], dict(axis=1)),
    ("ArgMax", [1, 4, 6, 6], [1, 1, 6, 6], dict(axis=1)),  # the channel axis of NHWC: no transpose needed
    ("ArgMin", [2, 10], [2], dict(axis=1, keepdims=0)),
    ("ArgMax", [3, 7], [1, 7], dict(axis=0, select_last_index=1)),
    ("ArgMin", [1, 3, 12], [1, 3, 1], dict(axis=2, select_last_index=1)),
], ids=lambda v: v if isinstance(v, str) else None)
def test_argmax_argmin_exact_on_the_npu(op, shape, out, attrs):
    """Indices equal onnxruntime's (ties: the first, or the last with select_last_index). npu-sim does not model
    REVERSE (select_last_index), so those run through Vela for placement only."""
    model = index_model(op, shape, out, **attrs)
    check_fp(model, {"x": rand(shape, 1)})
    lowered, _ = check_int(model, calib("x", shape), {"x": rand(shape, 2)}, max_lsb=0, qdq_semantics=True)
    if attrs.get("select_last_index"):
        for accel in ACCELS:
            npu, cpu = vela_op_counts(lowered.tosa, accel)
            assert cpu == 0 and npu >= 1, accel
    else:
        on_npu_and_bitexact(lowered)


@pytest.mark.parametrize("shape,axis", [([2, 10], 1), ([1, 4, 6, 6], 1), ([3, 5], 0)])
def test_hardmax_marks_only_the_first_maximum(shape, axis):
    model = wrapped("Hardmax", shape, shape, axis=axis)
    check_fp(model, {"x": rand(shape, 1)})
    x = np.round(rand(shape, 2) * 2) / 2  # many ties
    lowered, _ = check_int(model, calib("x", shape), {"x": x}, max_lsb=0, qdq_semantics=True)
    on_npu_and_bitexact(lowered)


def topk_model(shape, k: int, largest: int = 1) -> onnx.ModelProto:
    out = [*shape[:-1], k]
    nodes = [helper.make_node("Sigmoid", ["x"], ["s"]),
             helper.make_node("TopK", ["s", "k"], ["v", "i"], axis=-1, largest=largest)]
    graph = helper.make_graph(nodes, "topk", [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
                              [helper.make_tensor_value_info("v", TensorProto.FLOAT, out),
                               helper.make_tensor_value_info("i", TensorProto.INT64, out)],
                              [onnx.numpy_helper.from_array(np.array([k], np.int64), "k")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


@pytest.mark.parametrize("largest", [1, 0])
def test_top1_in_int8_on_the_npu(largest):
    shape = [3, 10]
    model = topk_model(shape, 1, largest)
    check_fp(model, {"x": rand(shape, 1)})
    lowered, _ = check_int(model, calib("x", shape), {"x": rand(shape, 2)}, max_lsb=0, qdq_semantics=True)
    on_npu_and_bitexact(lowered)


def test_topk_fp_any_static_k():
    check_fp(topk_model([2, 12], 4), {"x": rand([2, 12], 1)})
    check_fp(topk_model([2, 12], 3, largest=0), {"x": rand([2, 12], 3)})


@pytest.mark.parametrize("op", ["Sum", "Mean"])
@pytest.mark.parametrize("shapes", [([1, 4, 6, 6],) * 3, ([1, 4, 6, 6], [1, 4, 1, 1]), ([2, 8],)],
                         ids=["three", "broadcast", "one"])
def test_variadic_sum_and_mean_round_once(op, shapes):
    names = [f"x{i}" for i in range(len(shapes))]
    graph = helper.make_graph([helper.make_node(op, names, ["y"])], "s",
                              [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in zip(names, shapes, strict=True)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, shapes[0])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    feeds = {n: rand(s, i + 1, -1 - i, 1 + 2 * i) for i, (n, s) in enumerate(zip(names, shapes, strict=True))}
    cal = {n: rand((16, *s), 10 + i, -1 - i, 1 + 2 * i) for i, (n, s) in enumerate(zip(names, shapes, strict=True))}
    check_fp(model, feeds)
    lowered, _ = check_int(model, cal, feeds, max_lsb=1)
    on_npu_and_bitexact(lowered)
