"""GatherElements with constant indices, MatMul whose batch dims each broadcast only partly, Resize with
axes = [3, 2] and align_corners with a non-integer scale (both gave wrong results before), CastLike."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from npbtest.ops import calib, check_fp, check_int, rand, single_op_model, vela_op_counts
from onnx import TensorProto, helper


def on_npu(lowered) -> None:
    for accel in ("ethos-u55-128", "ethos-u85-256"):
        npu, cpu = vela_op_counts(lowered.tosa, accel)
        assert cpu == 0 and npu >= 1, accel


@pytest.mark.parametrize("shape,idx,axis", [
    ([3, 4], [[0, 2, 1, 0], [2, 1, -1, 0]], 0),
    ([2, 3, 4], [[[3, 0], [1, 1], [0, 2]], [[2, 2], [0, 3], [1, 0]]], 2),
])
def test_gather_elements_constant_indices(shape, idx, axis):
    idx = np.array(idx, np.int64)
    model = single_op_model("GatherElements", {"x": shape}, {"y": list(idx.shape)}, {"i": idx}, axis=axis)
    check_fp(model, {"x": rand(shape, 1)})
    lowered, _ = check_int(model, calib("x", shape), {"x": rand(shape, 2)}, max_lsb=0)
    on_npu(lowered)


@pytest.mark.parametrize("sa,sb", [([2, 1, 3, 4], [1, 5, 4, 6]), ([3, 1, 2, 4], [2, 4, 5])])
def test_matmul_partial_batch_broadcast(sa, sb):
    graph = helper.make_graph([helper.make_node("MatMul", ["a", "b"], ["y"])], "mm",
                              [helper.make_tensor_value_info("a", TensorProto.FLOAT, sa),
                               helper.make_tensor_value_info("b", TensorProto.FLOAT, sb)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    model = onnx.shape_inference.infer_shapes(model)
    feeds = {"a": rand(sa, 1), "b": rand(sb, 2)}
    check_fp(model, feeds)
    lowered, _ = check_int(model, {"a": rand((16, *sa), 3), "b": rand((16, *sb), 4)}, feeds, max_lsb=1)
    on_npu(lowered)


def resize_model(shape, mode: str, coord: str, scales=None, sizes=None, axes=None, opset: int = 19):
    inits = {"roi": np.zeros(0, np.float32)}
    names = ["x", "roi"]
    if scales is not None:
        inits["scales"] = np.array(scales, np.float32)
        names.append("scales")
    else:
        inits["sizes"] = np.array(sizes, np.int64)
        names += ["", "sizes"]
    attrs = {"mode": mode, "coordinate_transformation_mode": coord}
    if axes is not None:
        attrs["axes"] = axes
    return single_op_model("Resize", {"x": shape}, {"y": None}, inits, opset=opset, node_inputs=names, **attrs)


def test_resize_axes_3_2_applies_each_scale_to_its_axis():
    """The first scale is W's when axes = [3, 2] (they were applied to H, W in order before)."""
    model = resize_model([1, 1, 2, 2], "nearest", "asymmetric", scales=[3.0, 2.0], axes=[3, 2])
    lowered = check_fp(model, {"x": rand([1, 1, 2, 2], 1)})
    assert lowered.outputs[0].onnx_shape == (1, 1, 4, 6)
    model = resize_model([1, 1, 2, 2], "nearest", "asymmetric", sizes=[6, 4], axes=[3, 2])
    assert check_fp(model, {"x": rand([1, 1, 2, 2], 1)}).outputs[0].onnx_shape == (1, 1, 4, 6)


def test_resize_align_corners_with_a_non_integer_scale_follows_onnxruntime():
    """onnxruntime (and torch) map x = out (in - 1) / (out - 1) with the floored output length; ONNX's reference
    implementation uses in * scale unrounded (3.142857 where onnxruntime gives 4.0 here). The build verifies
    against onnxruntime, so the lowering matches it (check_fp compares with onnxruntime)."""
    model = resize_model([1, 1, 2, 4], "linear", "align_corners", scales=[1.0, 1.0, 0.6, 0.6])
    check_fp(model, {"x": np.arange(1, 9, dtype=np.float32).reshape(1, 1, 2, 4)})
    model = resize_model([1, 1, 5, 5], "linear", "align_corners", scales=[1.0, 1.0, 0.7, 0.7])
    check_fp(model, {"x": rand([1, 1, 5, 5], 1)})


def test_cast_like_takes_the_type_of_its_second_input():
    graph = helper.make_graph([helper.make_node("Sigmoid", ["x"], ["s"]), helper.make_node("CastLike", ["s", "like"], ["y"])],
                              "c", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3, 4])],
                              [onnx.numpy_helper.from_array(np.zeros(1, np.float32), "like")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    check_fp(model, {"x": rand([3, 4], 1)})
    check_int(model, calib("x", [3, 4]), {"x": rand([3, 4], 2)}, max_lsb=0)
