"""Regression tests for what ONNX's node tests (tests/conformance) found crashing or wrong outside the op
lowerings' own arithmetic: each once raised a Python exception out of npubuild or gave a wrong shape."""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np
import onnx
import pytest
from npbtest.ops import calib, check_fp, check_int, prepare, rand, single_op_model
from onnx import TensorProto, helper, numpy_helper

from npubuild.errors import InputError
from npubuild.frontend.quantize import quantize, vector_gemm_biases
from npubuild.lowering.fallback import lower_lowerable
from npubuild.tosa.run import run_tosa

Q = {"per_channel": True, "method": "minmax", "symmetric_activations": False}


def _graph(nodes, inputs, outputs, inits=(), opset: int = 17) -> onnx.ModelProto:
    m = helper.make_model(helper.make_graph(nodes, "g", inputs, outputs, list(inits)),
                          opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 8
    return m


def test_pow_with_an_int64_exponent_constant():
    """was KeyError: dtype('int64') in context.const"""
    m = single_op_model("Pow", {"x": [2, 3]}, {"y": [2, 3]}, {"e": np.array([1, 2, 3], np.int64)})
    check_fp(m, {"x": rand([2, 3], low=0.5, high=2.0)})


def test_less_of_a_rank0_tensor_and_a_tensor():
    """was an invalid TOSA graph: Less(max, x) took the rank-0 operand for the compared tensor (Clip expanded)"""
    vi = helper.make_tensor_value_info
    m = _graph([helper.make_node("Less", ["m", "x"], ["y"], name="lt")],
               [vi("m", TensorProto.FLOAT, []), vi("x", TensorProto.FLOAT, [3, 4])], [vi("y", TensorProto.BOOL, [3, 4])])
    check_fp(m, {"m": np.array(0.25, np.float32), "x": rand([3, 4])})
    c = _graph([helper.make_node("Less", ["c", "x"], ["y"], name="lt")], [vi("x", TensorProto.FLOAT, [3, 4])],
               [vi("y", TensorProto.BOOL, [3, 4])], [numpy_helper.from_array(np.array(0.25, np.float32), "c")])
    check_fp(c, {"x": rand([3, 4])})  # a constant first: Greater(x, c)


def test_a_scalar_constant_of_a_rank0_tensor_stays_rank0():
    """was an invalid TOSA graph: POW of a rank-0 tensor with a [1] constant (np.ascontiguousarray of a 0-d array)"""
    vi = helper.make_tensor_value_info
    m = _graph([helper.make_node("Sqrt", ["x"], ["y"], name="sq")], [vi("x", TensorProto.FLOAT, [])],
               [vi("y", TensorProto.FLOAT, [])])
    lowered = check_fp(m, {"x": np.array(2.0, np.float32)})
    assert lowered.outputs[0].shape == ()


def test_calibration_data_with_inf_is_one_input_error():
    """was `rescale factor must be positive and finite, got nan` (a ValueError out of the lowering)"""
    m = single_op_model("Sigmoid", {"x": [1, 8]}, {"y": [1, 8]})
    data = rand([4, 1, 8])
    data[0, 0, 3] = np.inf
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "m.onnx"
        onnx.save(prepare(m), path)
        with pytest.raises(InputError, match="non-finite range"):
            quantize(path, {"x": data}, Q)


def test_a_rank0_input_calibrates():
    """was `Unable to handle object of type numpy.float32` from onnxruntime's calibration reader"""
    vi = helper.make_tensor_value_info
    m = _graph([helper.make_node("Mul", ["x", "s"], ["y"], name="mul")],
               [vi("x", TensorProto.FLOAT, [1, 8]), vi("s", TensorProto.FLOAT, [])], [vi("y", TensorProto.FLOAT, [1, 8])])
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "m.onnx"
        onnx.save(prepare(m), path)
        qdq = quantize(path, {"x": rand([4, 1, 8]), "s": rand([4], low=0.5, high=1.0)}, Q)
    assert any(n.op_type == "QuantizeLinear" for n in qdq.graph.node)


def test_zero_size_tensors_put_the_node_on_the_host():
    vi = helper.make_tensor_value_info
    empty = _graph([helper.make_node("Relu", ["x"], ["y"], name="relu")], [vi("x", TensorProto.FLOAT, [2, 0, 4])],
                   [vi("y", TensorProto.FLOAT, [2, 0, 4])])
    partial = lower_lowerable(empty, "fp")
    assert "zero-size" in partial.host["relu"].reason and partial.lowered is None


def test_a_graph_output_no_tosa_op_computes_puts_its_node_on_the_host():
    """was an input error (exit 2): ReduceSum with empty axes and noop_with_empty_axes passes its input through,
    Dropout's mask is a constant; no TOSA graph can have them as outputs, the host can (Dropout/ReduceSum tests)"""
    vi = helper.make_tensor_value_info
    noop = _graph([helper.make_node("Relu", ["x"], ["r"], name="relu"),
                   helper.make_node("ReduceSum", ["r"], ["y"], noop_with_empty_axes=1, name="noop")],
                  [vi("x", TensorProto.FLOAT, [2, 4])], [vi("y", TensorProto.FLOAT, [2, 4])])
    partial = lower_lowerable(noop, "fp")
    assert set(partial.host) == {"noop"} and partial.lowered is not None  # Relu still lowers
    assert "its output 'y' is a graph output that no TOSA op computes" in partial.host["noop"].reason
    mask = _graph([helper.make_node("Dropout", ["x"], ["y", "m"], name="drop")], [vi("x", TensorProto.FLOAT, [2, 4])],
                  [vi("y", TensorProto.FLOAT, [2, 4]), vi("m", TensorProto.BOOL, [2, 4])])
    assert set(lower_lowerable(mask, "fp").host) == {"drop"}


def test_clip_with_min_above_max_gives_max_everywhere():
    """was an invalid TOSA CLAMP (min > max); ONNX sets every value to max (test_clip_min_greater_than_max)"""
    m = single_op_model("Clip", {"x": [2, 3]}, {"y": [2, 3]},
                        {"lo": np.array(1.0, np.float32), "hi": np.array(0.5, np.float32)})
    check_fp(m, {"x": rand([2, 3], low=-2.0, high=2.0)})


def test_pool_ceil_mode_last_window_must_start_inside_the_input():
    """MaxPool: was an invalid graph (pad larger than the kernel); AveragePool: shape [1,3,2,2] for [1,3,1,1]"""
    mp = single_op_model("MaxPool", {"x": [1, 1, 2, 2]}, {"y": None}, kernel_shape=[1, 1], strides=[2, 2],
                         ceil_mode=1)  # ceil gives 2 windows, the second would start past the input: 1
    assert check_fp(mp, {"x": rand([1, 1, 2, 2])}).outputs[0].onnx_shape == (1, 1, 1, 1)
    ap = single_op_model("AveragePool", {"x": [1, 3, 2, 2]}, {"y": None}, kernel_shape=[3, 3], strides=[3, 3],
                         pads=[1, 1, 1, 1], ceil_mode=1, count_include_pad=1)
    lowered, _ = check_int(ap, calib("x", [1, 3, 2, 2]), {"x": rand([1, 3, 2, 2])})
    assert lowered.outputs[0].onnx_shape == (1, 3, 1, 1)


def test_resize_with_axes_3_2_takes_sizes_in_axes_order():
    """was shape [1, 1, 8, 7] for ONNX's [1, 1, 7, 8]"""
    m = single_op_model("Resize", {"x": [1, 1, 2, 2]}, {"y": None}, {"sizes": np.array([8, 7], np.int64)},
                        opset=19, node_inputs=["x", "", "", "sizes"], axes=[3, 2], mode="nearest")
    lowered = check_fp(m, {"x": rand([1, 1, 2, 2])})
    assert lowered.outputs[0].onnx_shape == (1, 1, 7, 8)


def test_gemm_row_and_scalar_biases_quantize():
    """onnxruntime's quantiser failed on a [1, N] or scalar Gemm bias; npubuild hands it a [N] vector"""
    for bias in (rand([1, 4]), np.array(0.5, np.float32)):
        m = single_op_model("Gemm", {"a": [2, 3]}, {"y": [2, 4]}, {"b": rand([3, 4]), "c": bias})
        vectored = vector_gemm_biases(m)
        name = vectored.graph.node[0].input[2]
        assert name == f"{m.graph.node[0].input[2]}_vector"
        assert list(next(t for t in vectored.graph.initializer if t.name == name).dims) == [4]
        check_int(m, calib("a", [2, 3]), {"a": rand([2, 3])})


def test_cut_keeps_a_loop_body_outer_scope_input():
    """a Loop body reading an outer tensor: the host partition must carry it in (was an invalid host model). The
    trip count is an input: a constant one is unrolled at import (frontend/passes/control_flow.py)."""
    vi = helper.make_tensor_value_info
    body = helper.make_graph([helper.make_node("Add", ["acc", "step"], ["acc_out"]),
                              helper.make_node("Identity", ["cond"], ["cond_out"])], "body",
                             [vi("i", TensorProto.INT64, []), vi("cond", TensorProto.BOOL, []),
                              vi("acc", TensorProto.FLOAT, [1, 4])],
                             [vi("cond_out", TensorProto.BOOL, []), vi("acc_out", TensorProto.FLOAT, [1, 4])])
    nodes = [helper.make_node("Relu", ["x"], ["step"], name="relu"),
             helper.make_node("Loop", ["n", "", "x"], ["y"], body=body, name="loop")]
    m = _graph(nodes, [vi("x", TensorProto.FLOAT, [1, 4]), vi("n", TensorProto.INT64, [])],
               [vi("y", TensorProto.FLOAT, [1, 4])], [])
    from npubuild.ethosu.families import lower_families
    from npubuild.verify.tosa_check import graph_runner

    with tempfile.TemporaryDirectory() as tmp:
        io, _ = lower_families(prepare(m), "fp", Path(tmp))
        assert [p.kind for p in io.portable.partitions] == ["npu", "host"]
        assert "step" in io.portable.partitions[1].inputs
        x = rand([1, 4])
        got = graph_runner(io, Path(tmp))({"x": x, "n": np.array(3, np.int64)})["y"]
    np.testing.assert_allclose(got, x + 3 * np.maximum(x, 0), rtol=1e-6)


def test_run_tosa_turns_a_rejected_graph_into_a_stage_error():
    from npubuild.errors import StageError

    m = single_op_model("Relu", {"x": [1, 4]}, {"y": [1, 4]})
    lowered = check_fp(m, {"x": rand([1, 4])})
    with pytest.raises(StageError, match="TOSA reference model rejected the graph"):
        run_tosa(lowered.tosa[:-16] + b"\x00" * 16, lowered, {"x": rand([1, 4])})
