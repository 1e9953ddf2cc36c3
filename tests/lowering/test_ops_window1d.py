"""Convolution and pooling windows beyond plain 2-D: 1-D ops (rank-3 inputs, as H = 1 2-D ops), dilated
pools, ceil_mode as ONNX defines it, 1-D and dilated ConvTranspose, and the cases refused with a reason.

FP against onnxruntime, INT against onnxruntime's QDQ graph in LSB, Vela placement on U55 and U85, and
npu-sim bit-exactness of the U55 command stream where U55 runs it.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np
import onnx
import pytest
from npbtest.npusim import assert_bitexact, vela_raw
from npbtest.ops import (
    calib,
    check_fp,
    check_int,
    io_dict,
    prepare,
    quantize_model,
    rand,
    single_op_model,
    vela_op_counts,
)
from onnx import TensorProto, helper

from npubuild.errors import UnsupportedOpError
from npubuild.ethosu.support import check_node
from npubuild.lowering.driver import lower_model
from npubuild.tosa.graph import read_tosa

ACCELS = ("ethos-u55-128", "ethos-u85-256")
RNG = np.random.default_rng(0)


def ops_of(lowered) -> set[str]:
    return {op for ops in lowered.node_ops.values() for op in ops}


def on_npu(lowered, accels=ACCELS) -> None:
    for accel in accels:
        npu, cpu = vela_op_counts(lowered.tosa, accel)
        assert cpu == 0 and npu >= 1, (accel, npu, cpu)


def bitexact_u55(lowered) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        assert_bitexact(lowered.tosa, io_dict(lowered), vela_raw(lowered.tosa, Path(tmp)))


def full_check(model, shape, qdq_semantics: bool = True, npu: bool = True):
    check_fp(model, {"x": rand(shape, 1)})
    lowered, _ = check_int(model, calib("x", shape), {"x": rand(shape, 2)}, max_lsb=1, qdq_semantics=qdq_semantics)
    if npu:
        on_npu(lowered)
        bitexact_u55(lowered)
    return lowered


CONV1D = [
    dict(cout=6, k=3, pads=[1, 1]),
    dict(cout=6, k=3, strides=[2], dilations=[2], pads=[2, 1]),
    dict(cout=8, k=5, pads=[4, 0], bias=False),
    dict(cout=4, k=3, group=4, dilations=[4], pads=[8, 0]),  # depthwise, causal
    dict(cout=6, k=3, group=2, pads=[1, 1]),
    dict(cout=6, k=3, auto_pad="SAME_UPPER", strides=[2]),
]


@pytest.mark.parametrize("case", CONV1D, ids=lambda c: "-".join(f"{k}{v}" for k, v in c.items()))
def test_conv1d_is_an_h1_conv2d_without_transposes(case):
    case = dict(case)
    cout, k, group, bias = case.pop("cout"), case.pop("k"), case.pop("group", 1), case.pop("bias", True)
    shape = [1, 4, 20]
    inits = {"w": RNG.normal(0, 0.4, (cout, 4 // group, k)).astype(np.float32)}
    if bias:
        inits["b"] = RNG.normal(0, 0.1, cout).astype(np.float32)
    model = single_op_model("Conv", {"x": shape}, {"y": None}, inits, kernel_shape=[k], group=group, **case)
    lowered = full_check(model, shape)
    assert "TRANSPOSE" not in ops_of(lowered)
    assert lowered.inputs[0].perm == (0, 2, 1)  # fed channels-last, as interleaved sensor samples come


def causal_tcn(channels: int = 6, length: int = 32, k: int = 3, dilations=(1, 2, 4)) -> onnx.ModelProto:
    """Pad (left only) + dilated Conv1d + Relu per layer, as torch exports a causal TCN."""
    nodes, inits, x = [], [], "x"
    for i, d in enumerate(dilations):
        inits += [onnx.numpy_helper.from_array(np.array([0, 0, (k - 1) * d, 0, 0, 0], np.int64), f"p{i}"),
                  onnx.numpy_helper.from_array(RNG.normal(0, 0.4, (channels, channels, k)).astype(np.float32), f"w{i}"),
                  onnx.numpy_helper.from_array(RNG.normal(0, 0.1, channels).astype(np.float32), f"b{i}")]
        nodes += [helper.make_node("Pad", [x, f"p{i}"], [f"pd{i}"]),
                  helper.make_node("Conv", [f"pd{i}", f"w{i}", f"b{i}"], [f"c{i}"], dilations=[d], kernel_shape=[k]),
                  helper.make_node("Relu", [f"c{i}"], [f"r{i}"])]
        x = f"r{i}"
    shape = [1, channels, length]
    graph = helper.make_graph(nodes, "tcn", [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
                              [helper.make_tensor_value_info(x, TensorProto.FLOAT, shape)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def test_causal_tcn_pads_fold_into_the_convs():
    model = causal_tcn()
    assert [n.op_type for n in prepare(model).graph.node] == ["Conv", "Relu"] * 3
    lowered = full_check(model, [1, 6, 32])
    assert ops_of(lowered) <= {"CONV2D", "RESCALE", "RESHAPE", "CLAMP"}


def test_a_nonzero_pad_is_not_folded():
    model = causal_tcn(dilations=(2,))
    model.graph.initializer.append(onnx.numpy_helper.from_array(np.array(0.5, np.float32), "pv"))
    model.graph.node[0].input.append("pv")
    assert [n.op_type for n in prepare(model).graph.node] == ["Pad", "Conv", "Relu"]
    check_fp(model, {"x": rand([1, 6, 32], 1)})


@pytest.mark.parametrize("op,attrs", [
    ("MaxPool", dict(kernel_shape=[2])),
    ("MaxPool", dict(kernel_shape=[3], strides=[2], pads=[1, 1])),
    ("AveragePool", dict(kernel_shape=[3], strides=[2], pads=[1, 1])),
    ("AveragePool", dict(kernel_shape=[4], strides=[4])),
    ("GlobalAveragePool", {}),
    ("GlobalMaxPool", {}),
], ids=lambda v: v if isinstance(v, str) else "-".join(f"{k}{x}" for k, x in v.items()))
def test_pool1d(op, attrs):
    """These crashed in emit.to_layout (IndexError) before."""
    shape = [1, 3, 32]
    lowered = full_check(single_op_model(op, {"x": shape}, {"y": None}, **attrs), shape)
    assert "TRANSPOSE" not in ops_of(lowered)


@pytest.mark.parametrize("op,opset,attrs", [
    ("MaxPool", 17, dict(kernel_shape=[2, 2], dilations=[2, 2])),
    ("MaxPool", 17, dict(kernel_shape=[3, 3], dilations=[2, 2], strides=[2, 2], pads=[2, 2, 2, 2])),
    ("AveragePool", 19, dict(kernel_shape=[2, 2], dilations=[2, 2], ceil_mode=1)),
    ("AveragePool", 19, dict(kernel_shape=[3, 3], dilations=[2, 2], pads=[1, 1, 1, 1], count_include_pad=1)),
], ids=["max", "max-strided-padded", "avg-ceil", "avg-padded-counted"])
def test_dilated_pool_is_a_stack_of_taps(op, opset, attrs):
    """TOSA pools have no dilation: the kernel's taps are strided slices reduced by one (K, 1) pool.
    (onnxruntime's fused QLinearAveragePool lacks dilations, so INT compares with the QDQ semantics.)"""
    shape = [1, 2, 8, 8]
    model = single_op_model(op, {"x": shape}, {"y": None}, opset=opset, **attrs)
    full_check(model, shape, qdq_semantics=True)


def test_dilated_average_pool_not_counting_padding_is_refused():
    model = single_op_model("AveragePool", {"x": [1, 2, 8, 8]}, {"y": None}, opset=19, kernel_shape=[3, 3],
                            dilations=[2, 2], pads=[1, 1, 1, 1])
    with pytest.raises(UnsupportedOpError, match="dilated AveragePool"):
        lower_model(prepare(model), "fp")


@pytest.mark.parametrize("op,shape,attrs,out_hw", [
    # the last window would start in the padding: ONNX (and torch) drop it -> [1, 3, 1, 1], not [1, 3, 2, 2]
    ("AveragePool", [1, 3, 2, 2], dict(kernel_shape=[3, 3], strides=[3, 3], pads=[1, 1, 1, 1], ceil_mode=1,
                                       count_include_pad=1), (1, 1)),
    # ceil_output_size_reduce_by_one: was an invalid graph (a pad larger than the kernel)
    ("MaxPool", [1, 1, 2, 2], dict(kernel_shape=[1, 1], strides=[2, 2], ceil_mode=1), (1, 1)),
    ("AveragePool", [1, 1, 4, 4], dict(kernel_shape=[3, 3], strides=[2, 2], ceil_mode=1), (2, 2)),
    ("MaxPool", [1, 2, 7, 7], dict(kernel_shape=[2, 2], strides=[2, 2], ceil_mode=1), (4, 4)),
])
def test_ceil_mode_output_size_is_onnx_s(op, shape, attrs, out_hw):
    model = single_op_model(op, {"x": shape}, {"y": None}, **attrs)
    lowered = check_fp(model, {"x": rand(shape, 1)})
    assert lowered.outputs[0].onnx_shape[2:] == out_hw
    check_int(model, calib("x", shape), {"x": rand(shape, 2)}, max_lsb=1)


def test_ceil_mode_padding_with_count_include_pad_is_refused():
    """The ceil windows would count fewer elements than count_include_pad says; refused, not wrong."""
    model = single_op_model("AveragePool", {"x": [1, 1, 4, 4]}, {"y": None}, kernel_shape=[3, 3], strides=[2, 2],
                            ceil_mode=1, count_include_pad=1, pads=[1, 1, 1, 1])
    with pytest.raises(UnsupportedOpError, match="ceil_mode"):
        lower_model(prepare(model), "fp")


@pytest.mark.parametrize("op", ["MaxPool", "AveragePool", "GlobalAveragePool"])
def test_3d_pools_are_refused_cleanly(op):
    """A 2-D pool on a rank-5 tensor was emitted before (invalid TOSA); now the node is refused with a
    reason, so the host can run it."""
    attrs = {} if op.startswith("Global") else {"kernel_shape": [2, 2, 2]}
    model = single_op_model(op, {"x": [1, 2, 4, 4, 4]}, {"y": None}, **attrs)
    with pytest.raises(UnsupportedOpError, match="only 1-D and 2-D pools"):
        lower_model(prepare(model), "fp")


def test_conv_transpose_1d_runs_on_u55():
    """Laid out along H with the stride on both axes (W = 1), so U55's 2x2-only TRANSPOSE_CONV2D takes it."""
    shape = [1, 4, 6]
    model = single_op_model("ConvTranspose", {"x": shape}, {"y": None},
                            {"w": RNG.normal(0, 0.4, (4, 3, 3)).astype(np.float32)}, strides=[2], pads=[1, 0])
    full_check(model, shape)


def test_dilated_conv_transpose():
    shape = [1, 2, 4, 4]
    model = single_op_model("ConvTranspose", {"x": shape}, {"y": None},
                            {"w": RNG.normal(0, 0.4, (2, 3, 3, 3)).astype(np.float32)}, dilations=[2, 2], strides=[2, 2])
    full_check(model, shape)


def test_conv_transpose_stride_3x2_is_placed_on_the_host_for_u55():
    """Placed on the U55 NPU before, where Vela then failed the build; the support rule now says so, and
    U85 still runs it."""
    shape = [1, 2, 4, 4]
    model = single_op_model("ConvTranspose", {"x": shape}, {"y": None},
                            {"w": RNG.normal(0, 0.4, (2, 3, 3, 3)).astype(np.float32)}, strides=[3, 2])
    check_fp(model, {"x": rand(shape, 1)})
    lowered, _ = check_int(model, calib("x", shape), {"x": rand(shape, 2)}, max_lsb=1)
    graph = read_tosa(lowered.tosa)
    ops = [o for o in graph.ops if o.op not in ("CONST", "CONST_SHAPE")]
    assert check_node(ops, graph, "u55") == ("u55-transpose-conv-stride", check_node(ops, graph, "u55")[1])
    assert check_node(ops, graph, "u85") is None
    on_npu(lowered, ("ethos-u85-256",))


def test_pow_with_an_int64_exponent():
    """KeyError: dtype('int64') in context.const before."""
    model = single_op_model("Pow", {"x": [3]}, {"y": None}, {"e": np.array([1, 2, 3], np.int64)})
    check_fp(model, {"x": rand([3], 1, 0.5, 2.0)})
    model = single_op_model("Pow", {"x": [2, 3]}, {"y": None}, {"e": np.array([2, 2, 2], np.int64)})
    check_fp(model, {"x": rand([2, 3], 1)})
    lowered, _ = check_int(model, calib("x", [2, 3]), {"x": rand([2, 3], 2)})
    assert ops_of(lowered) == {"TABLE"}


def test_a_non_finite_quantisation_scale_is_refused_with_the_node_named():
    """A Q node with an inf scale (calibration over data with inf) raised `rescale factor must be positive and
    finite, got nan` from inside the lowering before."""
    qdq = quantize_model(single_op_model("Sigmoid", {"x": [1, 4]}, {"y": None}), calib("x", [1, 4]))
    scale = next(i for i in qdq.graph.initializer if i.name.endswith("_scale"))
    scale.CopyFrom(onnx.numpy_helper.from_array(np.array(np.inf, np.float32), scale.name))
    with pytest.raises(UnsupportedOpError, match="not positive and finite"):
        lower_model(qdq, "int")
