"""Host partitions as TFLite builtins, run in TensorFlow Lite Micro's interpreter, against onnxruntime on the same
QDQ partition: within 1 LSB. The partitions are built as the lower stage writes them: float inputs (the NPU side's
DequantizeLinear outputs), the node, then QuantizeLinear -> DequantizeLinear to the output; the boundary tensors
are int8 in the NPU layout (NHWC for a 4-D tensor)."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper
from tflite_micro.python.tflite_micro import runtime

from npubuild.deploy.host_ops import NotDeployable, Value, emit_host_partition
from npubuild.deploy.tflite_graph import Quant, TflGraph

NHWC = (0, 2, 3, 1)


def host_partition(nodes: list[onnx.NodeProto], inputs: dict[str, list[int]], out_shape: list[int],
                   out_q: Quant, inits: list[onnx.TensorProto] = (), domain: str = "") -> onnx.ModelProto:
    """Graph inputs `inputs` (floats), `nodes` ending in 'y', then y -> Q -> DQ -> 'out'."""
    q = [numpy_helper.from_array(np.array(out_q.scale, np.float32), "out_scale"),
         numpy_helper.from_array(np.array(out_q.zero_point, np.dtype(out_q.dtype)), "out_zp")]
    nodes = [*nodes, helper.make_node("QuantizeLinear", ["y", "out_scale", "out_zp"], ["yq"]),
             helper.make_node("DequantizeLinear", ["yq", "out_scale", "out_zp"], ["out"])]
    graph = helper.make_graph(nodes, "host", [helper.make_tensor_value_info(n, TensorProto.FLOAT, s)
                                              for n, s in inputs.items()],
                              [helper.make_tensor_value_info("out", TensorProto.FLOAT, out_shape)], [*q, *inits])
    opset = 21 if out_q.dtype == "int16" else 17  # int16 QuantizeLinear: opset 21
    opsets = [helper.make_opsetid("", opset)] + ([helper.make_opsetid(domain, 1)] if domain else [])
    model = helper.make_model(graph, opset_imports=opsets)
    model.ir_version = 10 if opset >= 21 else 8
    return model if domain else onnx.shape_inference.infer_shapes(model)


def _perm(shape) -> tuple[int, ...]:
    return NHWC if len(shape) == 4 else tuple(range(len(shape)))


def run_both(model: onnx.ModelProto, in_q: dict[str, Quant], out_q: Quant, samples: int = 4) -> int:
    """Translate, run in TFLite Micro and in onnxruntime on the same int8 (int16) inputs; the max LSB difference."""
    g = TflGraph()
    ins = {}
    for vi in model.graph.input:
        shape = tuple(d.dim_value for d in vi.type.tensor_type.shape.dim)
        perm = _perm(shape)
        t = g.tensor(vi.name, [shape[p] for p in perm], np.dtype(in_q[vi.name].dtype), in_q[vi.name])
        ins[vi.name] = Value(t, shape, perm, in_q[vi.name])
    out_shape = tuple(d.dim_value for d in model.graph.output[0].type.tensor_type.shape.dim)
    perm = _perm(out_shape)
    out = Value(g.tensor("out", [out_shape[p] for p in perm], np.dtype(out_q.dtype), out_q), out_shape, perm, out_q)
    emit_host_partition(g, model, ins, {"out": out})
    g.sg.inputs, g.sg.outputs = [v.tensor for v in ins.values()], [out.tensor]
    interpreter = runtime.Interpreter.from_bytes(g.build(), arena_size=1 << 22)
    session = ort.InferenceSession(model.SerializeToString())
    worst = 0
    rng = np.random.default_rng(0)
    for _ in range(samples):
        feeds = {}
        for k, (name, v) in enumerate(ins.items()):
            info = np.iinfo(np.dtype(v.quant.dtype))
            codes = rng.integers(info.min, info.max + 1, v.shape).astype(info.dtype)
            interpreter.set_input(np.transpose(codes, v.perm), k)
            feeds[name] = ((codes.astype(np.float32) - v.quant.zero_point) * np.float32(v.quant.scale))
        interpreter.invoke()
        got = np.transpose(np.asarray(interpreter.get_output(0)), np.argsort(out.perm)).astype(np.int64)
        ref = session.run(None, feeds)[0]
        info = np.iinfo(np.dtype(out_q.dtype))
        want = np.clip(np.round(ref / out_q.scale) + out_q.zero_point, info.min, info.max)
        worst = max(worst, int(np.abs(want - got).max()))
    return worst


def test_lrn_matches_onnxruntime():
    lrn = helper.make_node("LRN", ["x"], ["y"], name="lrn", size=5, alpha=1e-4, beta=0.75, bias=2.0)
    model = host_partition([lrn], {"x": [1, 32, 8, 8]}, [1, 32, 8, 8], Quant(0.0106, -128))
    assert run_both(model, {"x": Quant(0.0179, -128)}, Quant(0.0106, -128)) <= 1


@pytest.mark.parametrize("op,attrs,in_q,out_q", [
    ("Exp", {}, Quant(0.02, 0), Quant(0.05, -128)),
    ("Tanh", {}, Quant(0.03, 5), Quant(1 / 128, 0)),
    ("Sigmoid", {}, Quant(0.05, -3), Quant(1 / 256, -128)),
    ("HardSwish", {}, Quant(0.04, 0), Quant(0.03, -20)),
    ("Softmax", {"axis": 1}, Quant(0.1, 0), Quant(1 / 256, -128)),
])
def test_unary_ops_match_onnxruntime(op, attrs, in_q, out_q):
    node = helper.make_node(op, ["x"], ["y"], name=op.lower(), **attrs)
    model = host_partition([node], {"x": [1, 8, 4, 4]}, [1, 8, 4, 4], out_q)
    assert run_both(model, {"x": in_q}, out_q) <= 1


@pytest.mark.parametrize("op,attrs", [("Softmax", {"axis": 1}), ("Tanh", {})])
def test_int16_codes_cross_a_host_partition(op, attrs):
    """A 16x8 build's host partition: int16 codes (zero point 0) in and out, DEQUANTIZE/QUANTIZE in int16."""
    node = helper.make_node(op, ["x"], ["y"], name=op.lower(), **attrs)
    out_q = Quant(1 / 32768, 0, "int16")
    model = host_partition([node], {"x": [1, 8, 4, 4]}, [1, 8, 4, 4], out_q)
    assert run_both(model, {"x": Quant(0.0001, 0, "int16")}, out_q) <= 1


def test_binary_ops_with_a_constant_and_a_tensor_match_onnxruntime():
    bias = numpy_helper.from_array(np.linspace(-1, 1, 8, dtype=np.float32).reshape(1, 8, 1, 1), "bias")
    nodes = [helper.make_node("Add", ["x", "bias"], ["s"], name="add"),
             helper.make_node("Mul", ["s", "z"], ["y"], name="mul")]
    model = host_partition(nodes, {"x": [1, 8, 4, 4], "z": [1, 8, 4, 4]}, [1, 8, 4, 4], Quant(0.05, 0), [bias])
    assert run_both(model, {"x": Quant(0.02, 3), "z": Quant(0.03, -4)}, Quant(0.05, 0)) <= 1


def test_transpose_and_reshape_keep_values():
    nodes = [helper.make_node("Transpose", ["x"], ["t"], name="transpose", perm=[0, 2, 3, 1]),
             helper.make_node("Reshape", ["t", "shape"], ["y"], name="reshape")]
    shape = numpy_helper.from_array(np.array([1, 16, 8], np.int64), "shape")
    model = host_partition(nodes, {"x": [1, 8, 4, 4]}, [1, 16, 8], Quant(0.02, 3), [shape])
    assert run_both(model, {"x": Quant(0.02, 3)}, Quant(0.02, 3)) == 0


def test_a_comparison_and_a_where_match_onnxruntime():
    """Greater and Where: what Ethos-U55/U65 leave to the host (no GREATER or SELECT there)."""
    thr = numpy_helper.from_array(np.array(0.25, np.float32), "thr")
    nodes = [helper.make_node("Greater", ["x", "thr"], ["g"], name="gt"),
             helper.make_node("Relu", ["x"], ["r"], name="relu"),
             helper.make_node("Where", ["g", "x", "r"], ["y"], name="sel")]
    model = host_partition(nodes, {"x": [1, 8, 4, 4]}, [1, 8, 4, 4], Quant(0.02, -10), [thr])
    assert run_both(model, {"x": Quant(0.02, -10)}, Quant(0.02, -10)) <= 1


def test_a_matmul_by_a_constant_matrix_matches_onnxruntime():
    """A mel filterbank kept in float on the host: frames x bins @ bins x mels, a FULLY_CONNECTED keeping the frames."""
    w = numpy_helper.from_array(np.random.default_rng(2).uniform(0, 0.2, (16, 8)).astype(np.float32), "w")
    node = helper.make_node("MatMul", ["x", "w"], ["y"], name="mel")
    model = host_partition([node], {"x": [1, 5, 16]}, [1, 5, 8], Quant(0.05, -128), [w])
    assert run_both(model, {"x": Quant(0.02, 0)}, Quant(0.05, -128)) <= 1


@pytest.mark.parametrize("op,keepdims", [("ReduceMax", 1), ("ReduceMin", 0)])
def test_reductions_over_constant_axes_match_onnxruntime(op, keepdims):
    node = helper.make_node(op, ["x"], ["y"], name=op.lower(), axes=[1, 3], keepdims=keepdims)
    out_shape = [1, 1, 4, 1] if keepdims else [1, 4]
    model = host_partition([node], {"x": [1, 8, 4, 6]}, out_shape, Quant(0.02, 0))
    assert run_both(model, {"x": Quant(0.02, 0)}, Quant(0.02, 0)) == 0  # a max of codes is a code


def test_a_matmul_of_two_tensors_is_not_deployable():
    node = helper.make_node("MatMul", ["x", "z"], ["y"], name="attn")
    model = host_partition([node], {"x": [1, 4, 8], "z": [1, 8, 4]}, [1, 4, 4], Quant(0.05, 0))
    with pytest.raises(NotDeployable, match=r"node 'attn' \(MatMul\): a MatMul whose second operand is not a constant"):
        run_both(model, {"x": Quant(0.02, 0), "z": Quant(0.02, 0)}, Quant(0.05, 0))


def test_an_op_with_no_builtin_is_not_deployable_naming_node_and_op():
    node = helper.make_node("Trilu", ["x"], ["y"], name="upper", domain="com.microsoft")
    model = host_partition([node], {"x": [1, 4, 4]}, [1, 4, 4], Quant(0.02, 0), domain="com.microsoft")
    with pytest.raises(NotDeployable, match=r"node 'upper' \(Trilu\): operator domain 'com.microsoft'"):
        run_both(model, {"x": Quant(0.02, 0)}, Quant(0.02, 0))


def test_an_integer_rate_input_picked_and_compared_selects_on_the_device():
    """Silero VAD's `sr == 16000` on the host: an int64 scalar input (int32 on the device), one element picked by
    a constant position (a SLICE: TFLite Micro's GATHER takes no int32 data), compared with an integer
    constant (of the input's type), the bool selecting between two float branches."""
    consts = [numpy_helper.from_array(np.array([1], np.int64), "one"), numpy_helper.from_array(np.array(0, np.int64), "i0"),
              numpy_helper.from_array(np.array(16000, np.int64), "rate")]
    nodes = [helper.make_node("Reshape", ["sr", "one"], ["sr1"], name="flat"),
             helper.make_node("Gather", ["sr1", "i0"], ["s"], name="pick", axis=0),
             helper.make_node("Equal", ["s", "rate"], ["is16k"], name="eq"),
             helper.make_node("Relu", ["x"], ["r"], name="relu"),
             helper.make_node("Where", ["is16k", "x", "r"], ["y"], name="sel")]
    model = host_partition(nodes, {"x": [1, 8]}, [1, 8], Quant(0.02, -10), consts)
    model.graph.input.append(helper.make_tensor_value_info("sr", TensorProto.INT64, []))
    model = onnx.shape_inference.infer_shapes(model)
    g = TflGraph()
    xq = Quant(0.02, -10)
    x = Value(g.tensor("x", [1, 8], np.int8, xq), (1, 8), (0, 1), xq)
    sr = Value(g.tensor("sr", [], np.int32, None), (), (), None, np.dtype(np.int32))
    out = Value(g.tensor("out", [1, 8], np.int8, xq), (1, 8), (0, 1), xq)
    emit_host_partition(g, model, {"x": x, "sr": sr}, {"out": out})
    g.sg.inputs, g.sg.outputs = [x.tensor, sr.tensor], [out.tensor]
    interpreter = runtime.Interpreter.from_bytes(g.build(), arena_size=1 << 20)
    session = ort.InferenceSession(model.SerializeToString())
    codes = np.arange(-64, 64, 16, dtype=np.int8).reshape(1, 8)
    for rate in (16000, 8000):
        interpreter.set_input(codes, 0)
        interpreter.set_input(np.array(rate, np.int32), 1)
        interpreter.invoke()
        got = np.asarray(interpreter.get_output(0)).astype(np.int64)
        ref = session.run(None, {"x": (codes.astype(np.float32) + 10) * np.float32(0.02), "sr": np.array(rate)})[0]
        assert np.array_equal(got, np.clip(np.round(ref / 0.02) - 10, -128, 127))
    assert not np.array_equal(*(np.maximum(codes, -10) if r == 8000 else codes for r in (16000, 8000)))
