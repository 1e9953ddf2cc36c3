"""Unary non-linear ops: FP (TOSA reference model vs onnxruntime on the float op) and INT (one int8 TABLE vs
onnxruntime on the QDQ op, in LSB, plus Vela placement on U55 and U85); the Erf form of GELU torch exports is
recognised as one TABLE."""

from __future__ import annotations

import io
import warnings

import numpy as np
import onnx
import pytest
from npbtest.ops import calib, check_fp, check_int, rand, single_op_model, vela_op_counts
from onnx import TensorProto, helper

from npubuild.lowering.options import FAMILY_OPTIONS
from npubuild.lowering.quant import QParams
from npubuild.lowering.table import build_table

ACCELS = ("ethos-u55-128", "ethos-u85-256")
SHAPES = {"nchw": [1, 4, 8, 8], "2d": [2, 16], "3d": [1, 3, 10]}

# op, attributes, input range, opset
CASES = [
    ("Sigmoid", {}, (-6, 6), 17),
    ("Tanh", {}, (-3, 3), 17),
    ("HardSigmoid", {}, (-4, 4), 17),
    ("HardSigmoid", {"alpha": 0.25, "beta": 0.4}, (-4, 4), 17),
    ("HardSwish", {}, (-5, 5), 17),
    ("Gelu", {}, (-4, 4), 20),
    ("Gelu", {"approximate": "tanh"}, (-4, 4), 20),
    ("Erf", {}, (-2, 2), 17),
    ("Exp", {}, (-3, 2), 17),
    ("Log", {}, (0.05, 4), 17),
    ("Sqrt", {}, (0.0, 4), 17),
    ("Reciprocal", {}, (0.25, 4), 17),
    ("Abs", {}, (-2, 3), 17),
    ("Neg", {}, (-2, 3), 17),
    ("LeakyRelu", {}, (-3, 3), 17),
    ("LeakyRelu", {"alpha": 0.2}, (-3, 3), 17),
]


def sweep(shape, low: float, high: float, seed: int = 0) -> np.ndarray:
    """Values spread evenly over the calibrated range (so most of the 256 int8 codes are hit), shuffled."""
    n = int(np.prod(shape))
    v = np.linspace(low, high, n, dtype=np.float32)
    return np.random.default_rng(seed).permutation(v).reshape(shape)


def _id(case) -> str:
    op, attrs, _, _ = case
    return op + "".join(f"-{k}{v}" for k, v in attrs.items())


def _tosa_ops(lowered) -> list[str]:
    return [op for ops in lowered.node_ops.values() for op in ops]


def _assert_on_npu(lowered) -> None:
    for accel in ACCELS:
        npu, cpu = vela_op_counts(lowered.tosa, accel)
        assert cpu == 0 and npu >= 1, accel


@pytest.mark.parametrize("case", CASES, ids=_id)
@pytest.mark.parametrize("layout", ["nchw", "2d"])
def test_unary_table_op(case, layout):
    op, attrs, (low, high), opset = case
    shape = SHAPES[layout]
    model = single_op_model(op, {"x": shape}, {"y": None}, opset=opset, **attrs)
    check_fp(model, {"x": rand(shape, 1, low, high)}, rtol=1e-4, atol=1e-5)
    lowered, _ = check_int(model, calib("x", shape, low=low, high=high), {"x": sweep(shape, low, high)}, max_lsb=1)
    assert _tosa_ops(lowered) == ["TABLE"]
    if layout == "nchw":
        _assert_on_npu(lowered)


@pytest.mark.parametrize("exponent,low", [(2.0, -2.0), (0.5, 0.0), (3.0, -1.5)])
def test_pow_constant_exponent(exponent, low):
    shape = SHAPES["3d"]
    model = single_op_model("Pow", {"x": shape}, {"y": None}, {"e": np.array(exponent, np.float32)})
    check_fp(model, {"x": rand(shape, 1, low, 2.0)}, atol=1e-5)
    lowered, _ = check_int(model, calib("x", shape, low=low, high=2.0), {"x": sweep(shape, low, 2.0)}, max_lsb=1)
    assert _tosa_ops(lowered) == ["TABLE"]
    _assert_on_npu(lowered)


@pytest.mark.parametrize("slope", [np.array([0.25], np.float32), np.array([0.1, -0.3, 0.5, 1.5], np.float32)],
                         ids=["shared", "per-channel"])
def test_prelu(slope):
    shape = SHAPES["nchw"]
    s = slope.reshape(-1, 1, 1) if slope.size > 1 else slope
    model = single_op_model("PRelu", {"x": shape}, {"y": None}, {"s": s})
    check_fp(model, {"x": rand(shape, 1, -2, 2)})
    lowered, _ = check_int(model, calib("x", shape, low=-2, high=2), {"x": sweep(shape, -2, 2)},
                           max_lsb=1 if slope.size == 1 else 0)
    if slope.size > 1:  # U85's branches with MAXIMUM / MINIMUM of the zero point: the same integers
        u85, _ = check_int(model, calib("x", shape, low=-2, high=2), {"x": sweep(shape, -2, 2)}, max_lsb=0,
                           options=FAMILY_OPTIONS["u85"])
        assert {"MAXIMUM", "MINIMUM"} <= set(_tosa_ops(u85)) and "CLAMP" not in _tosa_ops(u85)
    if slope.size == 1:
        assert _tosa_ops(lowered) == ["TABLE"]
    else:  # two int8 branches (a 1x1 depthwise for the slope): no int32 MUL, which Vela runs at ~8 cycles an element
        assert "MUL" not in _tosa_ops(lowered) and "DEPTHWISE_CONV2D" in _tosa_ops(lowered)
    _assert_on_npu(lowered)


def test_table_matches_definition():
    """entry[i] = quantize_out(f(dequantize_in(i - 128))), applied by TABLE as table[x + 128]."""
    in_q = QParams(np.array(0.1), np.array(-10), np.dtype(np.int8))
    out_q = QParams(np.array(1 / 255), np.array(-128), np.dtype(np.int8))
    table = build_table(lambda v: 1 / (1 + np.exp(-v)), in_q, out_q)
    codes = np.arange(-128, 128)
    expect = out_q.quantize(1 / (1 + np.exp(-in_q.dequantize(codes))))
    assert np.abs(table[codes.astype(np.int64) + 128].astype(int) - expect.astype(int)).max() <= 1  # TABLE: int8 x reads entry x + 128
    assert table[0] == -128 and table[-1] == 127  # saturates at both ends


def _conv_then(act: str, shape, extra_nodes=()) -> onnx.ModelProto:
    rng = np.random.default_rng(0)
    c = shape[1]
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], name="conv", kernel_shape=[1, 1]),
             helper.make_node(act, ["c"], ["a"], name="act"), *extra_nodes]
    out = nodes[-1].output[0]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
                              [helper.make_tensor_value_info(out, TensorProto.FLOAT, shape)],
                              [onnx.numpy_helper.from_array(rng.normal(0, 0.7, (c, c, 1, 1)).astype(np.float32), "w")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("act", ["HardSwish", "Sigmoid", "Tanh"])
def test_activation_after_conv(act):
    shape = [1, 4, 6, 6]
    model = _conv_then(act, shape)
    check_fp(model, {"x": rand(shape, 5)})
    lowered, _ = check_int(model, calib("x", shape), {"x": rand(shape, 6)}, max_lsb=1)
    assert lowered.node_ops["act"] == ["TABLE"]
    _assert_on_npu(lowered)


def _gelu_graph(form: str, shape) -> onnx.ModelProto:
    def c(name, v):
        return onnx.numpy_helper.from_array(np.array(v, np.float32), name)

    if form == "torch":  # x * (1 + erf(x / sqrt2)) * 0.5, as torch.onnx exports nn.GELU() before opset 20
        nodes = [("Div", ["x", "sqrt2"], "d"), ("Erf", ["d"], "e"), ("Add", ["e", "one"], "a"),
                 ("Mul", ["x", "a"], "m"), ("Mul", ["m", "half"], "y")]
    elif form == "half-x":  # (x * 0.5) * (1 + erf(x * 1/sqrt2))
        nodes = [("Mul", ["x", "half"], "h"), ("Mul", ["x", "isqrt2"], "d"), ("Erf", ["d"], "e"),
                 ("Add", ["one", "e"], "a"), ("Mul", ["h", "a"], "y")]
    else:  # x * ((1 + erf(x / sqrt2)) * 0.5)
        nodes = [("Div", ["x", "sqrt2"], "d"), ("Erf", ["d"], "e"), ("Add", ["e", "one"], "a"),
                 ("Mul", ["a", "half"], "m"), ("Mul", ["m", "x"], "y")]
    inits = [c("sqrt2", np.sqrt(2.0)), c("isqrt2", 1 / np.sqrt(2.0)), c("one", 1.0), c("half", 0.5)]
    used = {i for _, ins, _ in nodes for i in ins}
    graph = helper.make_graph([helper.make_node(t, ins, [o], name=f"n{k}") for k, (t, ins, o) in enumerate(nodes)],
                              "gelu", [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, shape)],
                              [i for i in inits if i.name in used])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("form", ["torch", "half-x", "half-last"])
def test_erf_gelu_pattern_is_one_table(form):
    """The TABLE rounds each of the five nodes' results where onnxruntime's QDQ graph does: bit-exact with it
    (rounding once instead differed by 1 LSB on every calibration seed tried)."""
    shape = [1, 4, 8, 8]
    model = _gelu_graph(form, shape)
    check_fp(model, {"x": rand(shape, 1, -4, 4)})
    for seed in (100, 101):
        lowered, _ = check_int(model, calib("x", shape, low=-4, high=4, seed=seed), {"x": sweep(shape, -4, 4)},
                               max_lsb=0)
    assert _tosa_ops(lowered) == ["TABLE"]
    _assert_on_npu(lowered)


def test_erf_pattern_with_other_uses_is_not_fused():
    """If an intermediate (here x / sqrt2) is used elsewhere, the nodes lower one by one and stay correct."""
    shape = [1, 8]
    model = _gelu_graph("torch", shape)
    model.graph.node.append(helper.make_node("Add", ["d", "x"], ["z"], name="extra"))
    model.graph.output.append(helper.make_tensor_value_info("z", TensorProto.FLOAT, shape))
    check_fp(model, {"x": rand(shape, 1, -4, 4)})
    lowered, _ = check_int(model, calib("x", shape, low=-4, high=4), {"x": rand(shape, 2, -4, 4)}, max_lsb=3)
    assert _tosa_ops(lowered).count("TABLE") == 1 and len(_tosa_ops(lowered)) > 4


def test_torch_exported_gelu():
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.GELU()).eval()
    buf = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(net, (torch.randn(1, 16),), buf, dynamo=False, opset_version=17, input_names=["x"],
                          output_names=["y"])
    model = onnx.load_from_string(buf.getvalue())
    assert "Erf" in [n.op_type for n in model.graph.node]
    check_fp(model, {"x": rand([1, 16], 1, -2, 2)})
    lowered, _ = check_int(model, calib("x", [1, 16], low=-2, high=2), {"x": rand([1, 16], 2, -2, 2)}, max_lsb=1)
    assert _tosa_ops(lowered).count("TABLE") == 1 and "ERF" not in _tosa_ops(lowered)
    _assert_on_npu(lowered)


@pytest.mark.parametrize("order", [["x", "s"], ["s", "x"]], ids=["x-first", "sigmoid-first"])
def test_silu_is_one_table(order):
    """x * Sigmoid(x) (nn.SiLU as torch exports it) becomes one TABLE that rounds the sigmoid to its int8 grid
    before the product, as the QDQ graph does: bit-exact (the float x * sigmoid(x) rounded once was 1 LSB off)."""
    shape = [1, 4, 8, 8]
    nodes = [helper.make_node("Sigmoid", ["x"], ["s"], name="sig"), helper.make_node("Mul", order, ["y"], name="mul")]
    graph = helper.make_graph(nodes, "silu", [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, shape)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    check_fp(model, {"x": rand(shape, 1, -6, 6)})
    lowered, _ = check_int(model, calib("x", shape, low=-6, high=6), {"x": sweep(shape, -6, 6)}, max_lsb=0)
    assert _tosa_ops(lowered) == ["TABLE"] and lowered.node_ops["sig"] == ["TABLE"]
    _assert_on_npu(lowered)


def test_sigmoid_with_other_uses_is_not_fused():
    shape = [1, 16]
    nodes = [helper.make_node("Sigmoid", ["x"], ["s"], name="sig"), helper.make_node("Mul", ["x", "s"], ["y"], name="mul"),
             helper.make_node("Add", ["s", "x"], ["z"], name="add")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
                              [helper.make_tensor_value_info(n, TensorProto.FLOAT, shape) for n in ("y", "z")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    check_fp(model, {"x": rand(shape, 1, -4, 4)})
    lowered, _ = check_int(model, calib("x", shape, low=-4, high=4), {"x": rand(shape, 2, -4, 4)}, max_lsb=1)
    assert lowered.node_ops["sig"] == ["TABLE"] and "MUL" in lowered.node_ops["mul"]


def _chain(nodes, consts: dict[str, float], shape, outputs=("y",)) -> onnx.ModelProto:
    """A graph from (op, inputs, output, attrs) tuples reading x and scalar constants."""
    made = [helper.make_node(t, ins, [o], name=f"n{k}_{t}", **a) for k, (t, ins, o, a) in enumerate(nodes)]
    graph = helper.make_graph(made, "chain", [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
                              [helper.make_tensor_value_info(o, TensorProto.FLOAT, shape) for o in outputs],
                              [onnx.numpy_helper.from_array(np.array(v, np.float32), k) for k, v in consts.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


# GELU's tanh form as torch exports it: 0.5 * x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 * x^3)))
GELU_TANH = ([("Mul", ["x", "x"], "x2", {}), ("Mul", ["x", "x2"], "x3", {}), ("Mul", ["k", "x3"], "kx3", {}),
              ("Add", ["x", "kx3"], "in", {}), ("Mul", ["s", "in"], "z", {}), ("Tanh", ["z"], "t", {}),
              ("Add", ["one", "t"], "a", {}), ("Mul", ["x", "a"], "m", {}), ("Mul", ["half", "m"], "y", {})],
             {"k": 0.044715, "s": float(np.sqrt(2 / np.pi)), "one": 1.0, "half": 0.5})
# hard-swish written out: x * Clip(x + 3, 0, 6) / 6
HARD_SWISH = ([("Add", ["x", "three"], "p", {}), ("Clip", ["p", "zero", "six"], "c", {}), ("Mul", ["x", "c"], "m", {}),
               ("Div", ["m", "six"], "y", {})], {"three": 3.0, "zero": 0.0, "six": 6.0})


@pytest.mark.parametrize("chain", [GELU_TANH, HARD_SWISH], ids=["gelu-tanh", "hard-swish"])
def test_elementwise_chain_is_one_table(chain):
    """Any chain of elementwise nodes computing f(x) of one tensor is one TABLE, each intermediate (x^2 and x^3
    too, for the tanh GELU; the Clip's saturation for hard-swish) rounded on its int8 grid as in onnxruntime's
    QDQ graph: bit-exact with it."""
    shape = [1, 4, 8, 8]
    model = _chain(*chain, shape)
    check_fp(model, {"x": rand(shape, 1, -4, 4)})
    lowered, _ = check_int(model, calib("x", shape, low=-4, high=4), {"x": sweep(shape, -4, 4)}, max_lsb=0)
    assert _tosa_ops(lowered) == ["TABLE"]
    _assert_on_npu(lowered)


def test_cheap_chains_are_not_tables():
    """Affine ops and clamps stay RESCALE/CLAMP (Vela fuses those into the op before them)."""
    shape = [1, 4, 6, 6]
    model = _chain([("Mul", ["x", "k"], "m", {}), ("Relu", ["m"], "r", {}), ("Sub", ["r", "k"], "y", {})],
                   {"k": 0.5}, shape)
    lowered, _ = check_int(model, calib("x", shape), {"x": rand(shape, 2)}, max_lsb=1)
    assert "TABLE" not in _tosa_ops(lowered)


def test_fusion_keeps_other_users_of_x():
    """x feeds SiLU and, separately, an Abs that is a graph output: SiLU is one TABLE, Abs another."""
    shape = [1, 16]
    model = _chain([("Sigmoid", ["x"], "s", {}), ("Mul", ["s", "x"], "y", {}), ("Abs", ["x"], "z", {})], {}, shape,
                   outputs=("y", "z"))
    check_fp(model, {"x": rand(shape, 1, -4, 4)})
    lowered, _ = check_int(model, calib("x", shape, low=-4, high=4), {"x": sweep(shape, -4, 4)}, max_lsb=1)
    assert _tosa_ops(lowered) == ["TABLE", "TABLE"]
