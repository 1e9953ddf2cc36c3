"""A constant-weight MatMul and its bias Add as one fully connected layer, as TFLite's FullyConnected.

The quantize stage (qdq_linear.py) removes the Q/DQ pair between MatMul(x, W)
and its bias Add and gives the bias int32 at the accumulator's scale; the
lowering folds it into the 1x1 CONV2D's bias (epilogue.py), bit-exact with
onnxruntime on that QDQ model, and Vela runs one pass instead of two. Checked
against onnxruntime, the TOSA reference model and Vela's own estimates.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np
import onnx
import pytest
from npbtest.npusim import compile_and_check
from npbtest.ops import calib, check_int, quantize_model, rand, run_onnx, vela_run
from onnx import TensorProto, helper, numpy_helper

import npubuild.frontend.quantize as quantize_stage
from npubuild.frontend.qdq_linear import fold_linear_bias
from npubuild.lowering.ops import conv as ops_conv

ROOT = Path(__file__).resolve().parents[2]
SHAPE = [1, 8, 16]


def linear(o: int = 24, bias_first: bool = False, gelu: bool = False, second_reader: bool = False,
           bias_shape: tuple[int, ...] | None = None) -> onnx.ModelProto:
    """x [1, 8, 16] -> MatMul(W [16, o]) -> Add(b) (-> Gelu), the way torch exports a Linear on rank-3 input."""
    rng = np.random.default_rng(7)
    b = rng.uniform(-0.3, 0.3, bias_shape or (o,)).astype(np.float32)
    inits = [numpy_helper.from_array(rng.uniform(-0.5, 0.5, (SHAPE[-1], o)).astype(np.float32), "w"),
             numpy_helper.from_array(b, "b")]
    nodes = [helper.make_node("MatMul", ["x", "w"], ["mm"], name="fc"),
             helper.make_node("Add", ["b", "mm"] if bias_first else ["mm", "b"], ["y"], name="bias")]
    out = "y"
    if gelu:
        nodes.append(helper.make_node("Gelu", ["y"], ["g"], name="gelu"))
        out = "g"
    outputs = [helper.make_tensor_value_info(out, TensorProto.FLOAT, [*SHAPE[:-1], o])]
    if second_reader:
        nodes.append(helper.make_node("Relu", ["mm"], ["r"], name="relu"))
        outputs.append(helper.make_tensor_value_info("r", TensorProto.FLOAT, [*SHAPE[:-1], o]))
    graph = helper.make_graph(nodes, "linear", [helper.make_tensor_value_info("x", TensorProto.FLOAT, SHAPE)],
                              outputs, inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)])
    model.ir_version = 9
    return model


def unfolded(monkeypatch) -> None:
    """Quantize as onnxruntime alone does (the Q/DQ pair and the int8 bias stay)."""
    monkeypatch.setattr(quantize_stage, "fold_linear_bias", lambda *a, **k: 0)


def producers(model: onnx.ModelProto) -> dict[str, onnx.NodeProto]:
    return {o: n for n in model.graph.node for o in n.output}


def snr_db(ref: np.ndarray, got: np.ndarray) -> float:
    return float(10 * np.log10(np.sum(ref.astype(np.float64) ** 2) / np.sum((ref - got).astype(np.float64) ** 2)))


def run(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "m.onnx"
        onnx.save(model, path)
        return run_onnx(str(path), feeds)


@pytest.mark.parametrize("bias_first", [False, True])
@pytest.mark.parametrize("per_channel", [True, False])
def test_qdq_adds_int32_bias_to_the_product(bias_first, per_channel):
    model = linear(bias_first=bias_first)
    qdq = quantize_model(model, calib("x", SHAPE), per_channel=per_channel)
    p = producers(qdq)
    add = next(n for n in qdq.graph.node if n.op_type == "Add")
    side = 1 if bias_first else 0
    assert p[add.input[side]].op_type == "MatMul"  # no Q -> DQ between them
    bias_dq, w_dq = p[add.input[1 - side]], p[p[add.input[side]].input[1]]
    x_dq = p[p[add.input[side]].input[0]]
    inits = {i.name: numpy_helper.to_array(i) for i in qdq.graph.initializer}
    assert bias_dq.op_type == "DequantizeLinear" and inits[bias_dq.input[0]].dtype == np.int32
    acc_scale = (inits[x_dq.input[1]].astype(np.float32) * inits[w_dq.input[1]].astype(np.float32))
    np.testing.assert_array_equal(np.broadcast_to(inits[bias_dq.input[1]], (24,)), np.broadcast_to(acc_scale, (24,)))
    assert not [n for n in qdq.graph.node if n.op_type == "DequantizeLinear" and n.input[0] == "b_quantized"]


def test_qdq_model_is_closer_to_float(monkeypatch):
    """One rounding fewer and a 32-bit bias: onnxruntime's QDQ output is nearer the float model's."""
    model, feeds = linear(), {"x": rand(SHAPE, 3)}
    ref = run(model, feeds)["y"]
    folded = run(quantize_model(model, calib("x", SHAPE)), feeds)["y"]
    unfolded(monkeypatch)
    plain = run(quantize_model(model, calib("x", SHAPE)), feeds)["y"]
    assert snr_db(ref, folded) >= snr_db(ref, plain)


@pytest.mark.parametrize("bias_first", [False, True])
@pytest.mark.parametrize("per_channel", [True, False])
def test_int_is_one_conv_with_bias(bias_first, per_channel):
    """The lowering is the CONV2D's int32 bias and one RESCALE, within 1 LSB of onnxruntime on the QDQ model."""
    lowered, worst = check_int(linear(bias_first=bias_first), calib("x", SHAPE), {"x": rand(SHAPE, 4)},
                               max_lsb=1.0, per_channel=per_channel)
    ops = sum(lowered.node_ops.values(), [])
    assert "bias" not in lowered.node_ops and "ADD" not in ops, lowered.node_ops
    assert ops.count("CONV2D") == 1 and ops.count("RESCALE") == 1, ops


@pytest.mark.parametrize("kind", ["second_reader", "matrix_bias"])
def test_left_alone(kind):
    """A product read twice, or a bias that is not one value per column, keeps onnxruntime's form."""
    model = linear(second_reader=True) if kind == "second_reader" else linear(bias_shape=(8, 24))
    qdq = quantize_model(model, calib("x", SHAPE))
    assert fold_linear_bias(qdq, model) == 0
    mm = next(n for n in qdq.graph.node if n.op_type == "MatMul")
    assert [n.op_type for n in qdq.graph.node if mm.output[0] in n.input] == ["QuantizeLinear"]
    check_int(model, calib("x", SHAPE), {"x": rand(SHAPE, 5)}, max_lsb=1.0)


def total_cycles(layers: list[dict]) -> int:
    return sum(int(float(r["Op Cycles"])) for r in layers)


def stack(layers: int = 3, width: int = 32) -> onnx.ModelProto:
    """x [1, 8, width] through `layers` MatMul + bias Add pairs (a transformer's projections, back to back)."""
    rng = np.random.default_rng(11)
    nodes, inits, cur = [], [], "x"
    for i in range(layers):
        inits += [numpy_helper.from_array(rng.uniform(-0.3, 0.3, (width, width)).astype(np.float32), f"w{i}"),
                  numpy_helper.from_array(rng.uniform(-0.3, 0.3, (width,)).astype(np.float32), f"b{i}")]
        nodes += [helper.make_node("MatMul", [cur, f"w{i}"], [f"m{i}"], name=f"fc{i}"),
                  helper.make_node("Add", [f"m{i}", f"b{i}"], [f"a{i}"], name=f"bias{i}")]
        cur = f"a{i}"
    shape = [1, 8, width]
    graph = helper.make_graph(nodes, "stack", [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
                              [helper.make_tensor_value_info(cur, TensorProto.FLOAT, shape)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)])
    model.ir_version = 9
    return model


@pytest.mark.parametrize("accelerator", ["ethos-u55-128", "ethos-u85-256"])
def test_vela_runs_one_pass_per_layer(accelerator, monkeypatch):
    """No ADD pass for the biases, and fewer cycles. (On U85 a layer writing the graph output itself costs
    more than a conv chained with an ADD that writes it; the layers inside the network gain more.)"""
    model, shape = stack(), [1, 8, 32]
    lowered, _ = check_int(model, calib("x", shape), {"x": rand(shape, 6)})
    layers = vela_run(lowered.tosa, accelerator).layers
    unfolded(monkeypatch)
    plain, _ = check_int(model, calib("x", shape), {"x": rand(shape, 6)})
    plain_layers = vela_run(plain.tosa, accelerator).layers
    assert [r["NNG Operator"] for r in layers].count("Add") == 0
    assert [r["NNG Operator"] for r in plain_layers].count("Add") == 3
    assert total_cycles(layers) < total_cycles(plain_layers)


@pytest.mark.parametrize("accelerator", ["ethos-u55-128", "ethos-u85-256"])
def test_gelu_table_fuses_into_the_conv(accelerator, monkeypatch):
    """The conv's NHWC view has the shape the TABLE reads, so Vela runs the LUT as the conv's activation."""
    model, feeds = linear(gelu=True), {"x": rand(SHAPE, 7)}
    lowered, _ = check_int(model, calib("x", SHAPE), feeds, max_lsb=2.0)
    layers = vela_run(lowered.tosa, accelerator).layers
    luts = [r for r in layers if r["NNG Operator"] == "LUT"]
    assert luts and all(int(float(r["Op Cycles"])) == 0 for r in luts), layers
    monkeypatch.setattr(ops_conv, "fc_view", lambda s: (1, int(np.prod(s[:-1])), 1, int(s[-1])))  # the old view
    old, _ = check_int(model, calib("x", SHAPE), feeds, max_lsb=2.0)
    assert total_cycles(layers) < total_cycles(vela_run(old.tosa, accelerator).layers)


def residual() -> onnx.ModelProto:
    """x -> Linear -> Add(x, .): x is read by the layer and by the residual Add, as in a transformer block."""
    model = linear(o=SHAPE[-1])
    model.graph.node.append(helper.make_node("Add", ["x", "y"], ["r"], name="residual"))
    del model.graph.output[:]
    model.graph.output.append(helper.make_tensor_value_info("r", TensorProto.FLOAT, SHAPE))
    return model


@pytest.mark.parametrize("accelerator", ["ethos-u55-128", "ethos-u85-256"])
def test_shared_input_is_not_copied(accelerator, monkeypatch):
    """A whole-tensor SLICE gives the FC's RESHAPE its own input: Vela reads it in place instead of a MemoryCopy."""
    model, feeds = residual(), {"x": rand(SHAPE, 8)}
    lowered, _ = check_int(model, calib("x", SHAPE), feeds)
    assert "SLICE" in lowered.node_ops["fc"], lowered.node_ops
    layers = vela_run(lowered.tosa, accelerator).layers
    monkeypatch.setattr(ops_conv, "unshared", lambda ctx, x: x)
    plain, _ = check_int(model, calib("x", SHAPE), feeds)
    plain_layers = vela_run(plain.tosa, accelerator).layers
    assert [r["NNG Operator"] for r in layers].count("MemoryCopy") == 0, layers
    assert [r["NNG Operator"] for r in plain_layers].count("MemoryCopy") == 1, plain_layers
    assert total_cycles(layers) < total_cycles(plain_layers)


@pytest.mark.parametrize("kind", ["stack", "residual"])
def test_npusim_bitexact_u55(kind):
    """The compiled U55 command stream (bias in the conv, the in-place SLICE) matches the TOSA reference model."""
    compile_and_check(stack() if kind == "stack" else residual(), [1, 8, 32] if kind == "stack" else SHAPE)
