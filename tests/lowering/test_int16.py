"""16x8 lowering forms, one per op family: onnxruntime's own 16-bit QDQ model (QInt16 symmetric activations,
int8 weights) lowered to TOSA EXT-INT16, within 1 LSB of the 16-bit output scale of the QDQ model on the TOSA
reference model, compiled by Vela for U55 and U85 and bit-exact in npu-sim against the reference model."""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np
import onnx
import pytest
from npbtest.npusim import assert_bitexact, vela_raw
from npbtest.ops import (
    _save,
    calib,
    check_qdq,
    io_dict,
    quantize_model,
    quantize_model16,
    rand,
    run_onnx,
    single_op_model,
)
from onnx import TensorProto, helper

from npubuild.frontend.precision.qdq import QdqModel
from npubuild.frontend.precision.rewrite import PrecisionPlan, apply_plan
from npubuild.lowering.driver import lower_model
from npubuild.tosa.run import run_tosa

FAMILIES = {"u55": "ethos-u55-128", "u85": "ethos-u85-256"}


def _graph(nodes, inputs: dict[str, list[int]], outputs: dict[str, list[int] | None], inits=None, opset=17):
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in inputs.items()],
                          [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in outputs.items()],
                          [onnx.numpy_helper.from_array(np.asarray(v, np.float32), k) for k, v in (inits or {}).items()])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 8
    return m


def _w(shape, seed=0, scale=0.3):
    return np.random.default_rng(seed).normal(0, scale, shape).astype(np.float32)


def conv(k=3, cin=8, cout=16, group=1, stride=1):
    return single_op_model("Conv", {"x": [1, cin, 10, 10]}, {"y": None},
                           {"w": _w((cout, cin // group, k, k)), "b": _w((cout,), 1)},
                           pads=[k // 2] * 4, group=group, strides=[stride, stride])


def fc():
    return single_op_model("Gemm", {"x": [1, 32]}, {"y": None}, {"w": _w((16, 32)), "b": _w((16,), 1)}, transB=1)


def conv_then(op, **attrs):
    """A conv feeding a unary op: the op's input is a conv output, as in a network."""
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], name="conv", kernel_shape=[1, 1]),
             helper.make_node(op, ["c"], ["y"], name="op", **attrs)]
    return _graph(nodes, {"x": [1, 4, 6, 6]}, {"y": [1, 4, 6, 6]}, {"w": _w((4, 4, 1, 1), scale=0.8)})


def unary(op, **attrs):
    return single_op_model(op, {"x": [1, 4, 6, 6]}, {"y": None}, **attrs)


def binary(op, b_shape=(1, 4, 6, 6)):
    return single_op_model(op, {"a": [1, 4, 6, 6], "b": list(b_shape)}, {"y": None})


def matmul():
    return single_op_model("MatMul", {"a": [1, 8, 16], "b": [1, 16, 12]}, {"y": None})


def pool(op, **attrs):
    return single_op_model(op, {"x": [1, 4, 9, 9]}, {"y": None}, **attrs)


def resize(mode):
    scales = np.array([1, 1, 2, 2], np.float32)
    return single_op_model("Resize", {"x": [1, 4, 5, 5]}, {"y": None}, node_inputs=["x", "", "scales"],
                           initializers={"scales": scales}, mode=mode,
                           coordinate_transformation_mode="half_pixel" if mode == "linear" else "asymmetric",
                           **({"nearest_mode": "floor"} if mode == "nearest" else {}))


def conv_transpose():
    return single_op_model("ConvTranspose", {"x": [1, 4, 5, 5]}, {"y": None}, {"w": _w((4, 6, 2, 2)), "b": _w((6,), 1)},
                           strides=[2, 2])


def concat():
    return single_op_model("Concat", {"a": [1, 4, 6, 6], "b": [1, 3, 6, 6]}, {"y": None}, axis=1)


def movement():
    nodes = [helper.make_node("Transpose", ["x"], ["t"], perm=[0, 2, 3, 1], name="tr"),
             helper.make_node("Reshape", ["t", "shape"], ["y"], name="rs")]
    g = _graph(nodes, {"x": [1, 4, 6, 6]}, {"y": [1, 36, 4]})
    g.graph.initializer.append(onnx.numpy_helper.from_array(np.array([1, 36, 4], np.int64), "shape"))
    return g


def softmax():
    return single_op_model("Softmax", {"x": [1, 4, 16]}, {"y": None}, axis=-1)


def reduce_mean():
    return single_op_model("ReduceMean", {"x": [1, 4, 6, 6]}, {"y": None}, {"axes": np.array([2, 3], np.int64)},
                           keepdims=1, opset=18)


CASES = {
    "conv": (conv, {"x": [1, 8, 10, 10]}),
    "conv_stride2": (lambda: conv(stride=2), {"x": [1, 8, 10, 10]}),
    "depthwise": (lambda: conv(cin=8, cout=8, group=8), {"x": [1, 8, 10, 10]}),
    "fully_connected": (fc, {"x": [1, 32]}),
    "conv_transpose": (conv_transpose, {"x": [1, 4, 5, 5]}),
    "matmul": (matmul, {"a": [1, 8, 16], "b": [1, 16, 12]}, 2.0, ("u85",)),  # U55/U65: int8 only (rules.py)
    "add": (lambda: binary("Add"), {"a": [1, 4, 6, 6], "b": [1, 4, 6, 6]}),
    "sub_broadcast": (lambda: binary("Sub", (1, 4, 1, 1)), {"a": [1, 4, 6, 6], "b": [1, 4, 1, 1]}),
    "mul": (lambda: binary("Mul"), {"a": [1, 4, 6, 6], "b": [1, 4, 6, 6]}),
    "max": (lambda: binary("Max"), {"a": [1, 4, 6, 6], "b": [1, 4, 6, 6]}),
    "relu": (lambda: conv_then("Relu"), {"x": [1, 4, 6, 6]}),
    "leaky_relu": (lambda: unary("LeakyRelu", alpha=0.1), {"x": [1, 4, 6, 6]}),
    "sigmoid": (lambda: unary("Sigmoid"), {"x": [1, 4, 6, 6]}),
    "tanh": (lambda: unary("Tanh"), {"x": [1, 4, 6, 6]}),
    "hard_swish": (lambda: unary("HardSwish"), {"x": [1, 4, 6, 6]}, 6.0),  # its kinks at +-3 inside the range
    "prelu_channels": (lambda: single_op_model("PRelu", {"x": [1, 4, 6, 6]}, {"y": None},
                                               {"slope": np.array([0.1, -0.2, 0.5, 1.5], np.float32).reshape(4, 1, 1)}),
                       {"x": [1, 4, 6, 6]}),
    "max_pool": (lambda: pool("MaxPool", kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1]), {"x": [1, 4, 9, 9]}),
    "avg_pool": (lambda: pool("AveragePool", kernel_shape=[3, 3], strides=[1, 1], pads=[1, 1, 1, 1]),
                 {"x": [1, 4, 9, 9]}),
    "global_avg_pool": (lambda: pool("GlobalAveragePool"), {"x": [1, 4, 9, 9]}),
    "resize_nearest": (lambda: resize("nearest"), {"x": [1, 4, 5, 5]}),
    "resize_bilinear": (lambda: resize("linear"), {"x": [1, 4, 5, 5]}),
    "concat": (concat, {"a": [1, 4, 6, 6], "b": [1, 3, 6, 6]}),
    "transpose_reshape": (movement, {"x": [1, 4, 6, 6]}),
    "softmax": (softmax, {"x": [1, 4, 16]}),
    "reduce_mean": (reduce_mean, {"x": [1, 4, 6, 6]}),
}


def _cal(shapes: dict[str, list[int]], span: float = 2.0) -> dict[str, np.ndarray]:
    out: dict[str, np.ndarray] = {}
    for k, (name, shape) in enumerate(shapes.items()):
        out.update(calib(name, shape, seed=100 + k, low=-span, high=span))
    return out


@pytest.mark.parametrize("name", list(CASES))
def test_int16_form(name):
    build, shapes, *more = CASES[name]
    span = more[0] if more else 2.0
    families = more[1] if len(more) > 1 else tuple(FAMILIES)
    qdq = quantize_model16(build(), _cal(shapes, span))
    feeds = {k: rand(s, 7 + i, -span, span) for i, (k, s) in enumerate(shapes.items())}
    for family in families:
        accel = FAMILIES[family]
        lowered, _ = check_qdq(qdq, feeds, max_lsb=1.0, family=family)
        assert any(o.dtype == "int16" for o in lowered.outputs), "the output is not int16"
        with tempfile.TemporaryDirectory() as tmp:
            assert_bitexact(lowered.tosa, io_dict(lowered), vela_raw(lowered.tosa, Path(tmp), accel), seeds=(0,))


def _every_code(op: str, span: float = 6.0, qdq: onnx.ModelProto | None = None, **attrs) -> tuple[float, float]:
    """(max, share of inputs more than 1 LSB off) of a unary op over all 65536 int16 input codes."""
    qdq = qdq or quantize_model16(single_op_model(op, {"x": [1, 65536]}, {"y": None}, **attrs),
                                  calib("x", [1, 65536], n=4, low=-span, high=span))
    spec = lower_model(qdq, "int", "u85").inputs[0]
    x = (np.arange(-32768, 32768, dtype=np.float64) * spec.scale).astype(np.float32).reshape(1, -1)
    assert np.array_equal(spec.to_tosa(x).reshape(-1), np.arange(-32768, 32768))  # every code exactly once
    feeds = {"x": x}
    lowered, worst = check_qdq(qdq, feeds, max_lsb=np.inf, family="u85")
    with tempfile.TemporaryDirectory() as tmp:
        ref = run_onnx(str(_save(qdq, Path(tmp), "q.onnx")), feeds, qdq_semantics=True)
    out = lowered.outputs[0]
    err = np.abs(out.quantize_reference(ref[out.onnx_name]) - run_tosa(lowered.tosa, lowered, feeds)[out.onnx_name])
    return worst, float(np.mean(err > 1))


@pytest.mark.parametrize("op,attrs,max_lsb,share", [
    ("Sigmoid", {}, 1, 0.0), ("LeakyRelu", {"alpha": 0.1}, 1, 0.0), ("Elu", {}, 1, 0.0),
    ("HardSwish", {}, 1, 0.0), ("HardSigmoid", {}, 1, 0.0),  # integer forms: no kink inside a table segment
    ("Tanh", {}, 2, 0.005), ("Exp", {}, 2, 0.005),  # the curvature over one of 512 segments: 1.7 LSB of sag
])
def test_int16_function_every_code(op, attrs, max_lsb, share):
    """The int16 forms of unary functions over every int16 input: the interpolating TABLE within 1 LSB of the
    16-bit scale (2 LSB on a few inputs per thousand for the most curved), HardSwish/HardSigmoid exact forms."""
    worst, above_one = _every_code(op, **attrs)
    assert worst <= max_lsb and above_one <= share, (worst, above_one)


@pytest.mark.parametrize("op", ["HardSwish", "HardSigmoid"])
def test_bends_on_knots_make_one_table(op):
    """npubuild's own int16 model puts a hard swish's (hard sigmoid's) input on a scale with its bends on the int16
    TABLE's knots: one TABLE, within 1 LSB of the QDQ model over every input code."""
    model = single_op_model(op, {"x": [1, 65536]}, {"y": None})
    int8 = quantize_model(model, calib("x", [1, 65536], n=4, low=-6.0, high=6.0))
    qdq = apply_plan(int8, PrecisionPlan(frozenset(QdqModel(int8).groups)), ("u55", "u85"))
    ops = {o for ops in lower_model(qdq, "int", "u55").node_ops.values() for o in ops}
    assert "TABLE" in ops and "MUL" not in ops and "MAXIMUM" not in ops
    worst, above_one = _every_code(op, qdq=qdq)
    assert worst <= 1 and above_one == 0.0


def test_an_add_of_an_int8_and_an_int16_operand_is_bit_exact_on_u55():
    """BlazeFace's residual Add of a channel-padded int8 input and an int16 conv output (mp_face_detection's
    `precision: auto` build): both operands go onto the int16 grid before the ADD. With the int8 operand
    rescaled straight to int32, Vela 5.2's U55 command stream and the TOSA reference model disagreed (npu-sim)."""
    pads = helper.make_tensor("pads", TensorProto.INT64, [8], [0, 0, 0, 0, 0, 2, 0, 0])
    nodes = [helper.make_node("Pad", ["x", "pads"], ["p"], name="channel_pad"),
             helper.make_node("Conv", ["x", "w"], ["c"], name="conv", kernel_shape=[1, 1]),
             helper.make_node("Add", ["p", "c"], ["y"], name="add")]
    model = _graph(nodes, {"x": [1, 6, 8, 8]}, {"y": [1, 8, 8, 8]}, {"w": _w((8, 6, 1, 1))})
    model.graph.initializer.append(pads)
    int8 = quantize_model(model, calib("x", [1, 6, 8, 8], low=0.0, high=2.0))  # zero point -128, as after a ReLU
    conv_group = next(g for g, members in QdqModel(int8).groups.items() if "conv" in members.layers)
    qdq = apply_plan(int8, PrecisionPlan(frozenset({conv_group})), ("u55",))
    lowered, _ = check_qdq(qdq, {"x": rand([1, 6, 8, 8], 3, 0.0, 2.0)}, max_lsb=1.0, family="u55")
    assert [s.dtype for s in lowered.inputs] == ["int8"] and lowered.outputs[0].dtype == "int8"
    with tempfile.TemporaryDirectory() as tmp:
        assert_bitexact(lowered.tosa, io_dict(lowered), vela_raw(lowered.tosa, Path(tmp), FAMILIES["u55"]))


def gru_gates() -> onnx.ModelProto:
    """A GRU step's gates in 16x8: one sigmoid over the update and reset pre-activations, split in two, the
    reset gate times the state, the update gate times that product."""
    split = helper.make_tensor("split", TensorProto.INT64, [2], [48, 48])
    nodes = [helper.make_node("Sigmoid", ["x"], ["s"], name="gates"),
             helper.make_node("Split", ["s", "split"], ["z", "r"], name="split", axis=1),
             helper.make_node("Mul", ["r", "h"], ["rh"], name="reset"),
             helper.make_node("Mul", ["z", "rh"], ["y"], name="update")]
    model = _graph(nodes, {"x": [1, 96], "h": [1, 48]}, {"y": [1, 48]})
    model.graph.initializer.append(split)
    return model


@pytest.mark.parametrize("family", list(FAMILIES))
def test_a_split_sigmoid_feeding_two_muls_is_bit_exact(family):
    """configs/kws_recurrent.yaml's GRU in 16x8 on U55: the int16 sigmoid's RESCALE (from the TABLE's int32) read
    by two SLICEs. Vela 5.2 moved both slices ahead of the RESCALE and ran it as a MUL over all 96 channels, from
    channel 0, for each (the reset gate read the update gate: 48/48 outputs wrong); the U55/U65 lowering reads the
    slices from a full-range CLAMP Vela fuses into the RESCALE, and the MULs take the int16 gates as they are."""
    shapes = {"x": [1, 96], "h": [1, 48]}
    qdq = quantize_model16(gru_gates(), _cal(shapes, 4.0))
    lowered, _ = check_qdq(qdq, {k: rand(s, 7 + i, -4.0, 4.0) for i, (k, s) in enumerate(shapes.items())},
                           max_lsb=1.0, family=family)
    with tempfile.TemporaryDirectory() as tmp:
        assert_bitexact(lowered.tosa, io_dict(lowered), vela_raw(lowered.tosa, Path(tmp), FAMILIES[family]))


def test_an_activation_concatenated_after_another_input_is_bit_exact_on_u55():
    """ppocrv4_rec_48x160 in 16x8 on U55: an int16 sigmoid (TABLE, then the RESCALE of its int32 result) written
    into a Concat after another input. Vela 5.2 wrote the RESCALE at the Concat's channel 0, over the first input
    (128/256 outputs wrong; 132493/132500 in ppocrv4_rec); the U55/U65 lowering puts a full-range CLAMP between,
    which Vela fuses into the RESCALE's op (ppocrv4_rec: 866 NPU ops and Vela's cycles the same as without)."""
    nodes = [helper.make_node("Sigmoid", ["b"], ["s"], name="act"),
             helper.make_node("Concat", ["a", "s"], ["y"], name="cat", axis=1)]
    shapes = {"a": [1, 8, 4, 4], "b": [1, 8, 4, 4]}
    int8 = quantize_model(_graph(nodes, shapes, {"y": [1, 16, 4, 4]}), _cal(shapes, 3.0))
    qdq = apply_plan(int8, PrecisionPlan(frozenset(QdqModel(int8).groups)), ("u55",))  # the concat's one scale
    lowered, _ = check_qdq(qdq, {k: rand(s, 7 + i, -3.0, 3.0) for i, (k, s) in enumerate(shapes.items())},
                           max_lsb=1.0, family="u55")
    with tempfile.TemporaryDirectory() as tmp:
        assert_bitexact(lowered.tosa, io_dict(lowered), vela_raw(lowered.tosa, Path(tmp), FAMILIES["u55"]))
