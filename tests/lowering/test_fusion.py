"""Affine epilogues folded into a fully connected layer: MatMul(x, W) + b (* c), as torch exports a Linear.

FP and INT against onnxruntime, the folded nodes emitting no TOSA op, fewer
Vela ops than the unfolded lowering, and npu-sim bit-exact with the reference.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from npbtest.npusim import compile_and_check
from npbtest.ops import calib, check_fp, check_int, rand, vela_op_counts
from onnx import TensorProto, helper

import npubuild.frontend.quantize as quantize_stage
from npubuild.lowering.fusion import epilogue
from npubuild.lowering.options import LoweringOptions

SHAPE = [1, 6, 16]
INT_BIAS_ADD = LoweringOptions(int_bias_add=True)  # off by default: see epilogue.py


def linear_chain(tail: list[str], o: int = 12, extra_use: bool = False) -> onnx.ModelProto:
    """x [1, 6, 16] -> MatMul(W) -> each of `tail` ("add", "mul", "div") with a constant; optional second reader."""
    rng = np.random.default_rng(3)
    inits = [onnx.numpy_helper.from_array(rng.uniform(-0.5, 0.5, (SHAPE[-1], o)).astype(np.float32), "w"),
             onnx.numpy_helper.from_array(rng.uniform(-0.4, 0.4, (o,)).astype(np.float32), "b"),
             onnx.numpy_helper.from_array(np.array(0.35, np.float32), "c"),
             onnx.numpy_helper.from_array(np.array(2.5, np.float32), "d")]
    nodes = [helper.make_node("MatMul", ["x", "w"], ["t0"], name="fc")]
    for i, kind in enumerate(tail):
        op, const = {"add": ("Add", "b"), "mul": ("Mul", "c"), "div": ("Div", "d")}[kind]
        nodes.append(helper.make_node(op, [f"t{i}", const], [f"t{i + 1}"], name=f"{kind}{i}"))
    outputs = [helper.make_tensor_value_info(f"t{len(tail)}", TensorProto.FLOAT, [*SHAPE[:-1], o])]
    if extra_use:  # the product is read twice: nothing may be folded
        nodes.append(helper.make_node("Relu", ["t0"], ["r"], name="relu"))
        outputs.append(helper.make_tensor_value_info("r", TensorProto.FLOAT, [*SHAPE[:-1], o]))
    graph = helper.make_graph(nodes, "chain", [helper.make_tensor_value_info("x", TensorProto.FLOAT, SHAPE)],
                              outputs, inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def folded(lowered, tail: list[str]) -> bool:
    """True if no tail node emitted a TOSA op (all of them went into the MatMul's conv)."""
    return not any(name in lowered.node_ops for name in (f"{k}{i}" for i, k in enumerate(tail)))


CHAINS = [["add"], ["add", "mul"], ["mul", "add"], ["add", "div"]]


@pytest.mark.parametrize("tail", CHAINS, ids="-".join)
def test_fp_chain_folds(tail):
    lowered = check_fp(linear_chain(tail), {"x": rand(SHAPE, 1)}, rtol=1e-4, atol=1e-5)
    assert folded(lowered, tail)
    assert "ADD" not in sum(lowered.node_ops.values(), [])


@pytest.mark.parametrize("tail", CHAINS, ids="-".join)
def test_int_chain_folds_within_one_lsb(tail):
    """With INT bias Adds switched on, every chain becomes the conv's bias and one RESCALE, within 1 LSB."""
    lowered, worst = check_int(linear_chain(tail), calib("x", SHAPE), {"x": rand(SHAPE, 2)}, max_lsb=1.0,
                               options=INT_BIAS_ADD)
    assert folded(lowered, tail), lowered.node_ops
    ops = sum(lowered.node_ops.values(), [])
    assert "ADD" not in ops and ops.count("RESCALE") == 1, ops


def test_int_default_folds_scalar_mul_and_bias_add():
    """The bias Add folds by default because the quantize stage drops its Q/DQ pair (qdq_linear.py)."""
    lowered, _ = check_int(linear_chain(["mul"]), calib("x", SHAPE), {"x": rand(SHAPE, 2)})
    assert folded(lowered, ["mul"]) and sum(lowered.node_ops.values(), []).count("RESCALE") == 1
    lowered, _ = check_int(linear_chain(["add"]), calib("x", SHAPE), {"x": rand(SHAPE, 2)})
    assert folded(lowered, ["add"]) and "ADD" not in sum(lowered.node_ops.values(), [])


def test_second_reader_blocks_folding():
    model = linear_chain(["add"], extra_use=True)
    lowered, _ = check_int(model, calib("x", SHAPE), {"x": rand(SHAPE, 4)})
    assert not folded(lowered, ["add"])
    check_fp(model, {"x": rand(SHAPE, 4)})


@pytest.mark.parametrize("accelerator", ["ethos-u55-128", "ethos-u85-256"])
def test_vela_ops_drop(accelerator, monkeypatch):
    model = linear_chain(["add", "mul"])
    lowered, _ = check_int(model, calib("x", SHAPE), {"x": rand(SHAPE, 5)}, options=INT_BIAS_ADD)
    npu, cpu = vela_op_counts(lowered.tosa, accelerator)
    monkeypatch.setattr(epilogue, "follow", lambda *a, **k: None)  # our own fold off: the per-node lowering
    monkeypatch.setattr(quantize_stage, "fold_linear_bias", lambda *a, **k: 0)  # and onnxruntime's Q/DQ pair back
    unfolded, _ = check_int(model, calib("x", SHAPE), {"x": rand(SHAPE, 5)})
    npu0, cpu0 = vela_op_counts(unfolded.tosa, accelerator)
    assert cpu == cpu0 == 0
    assert npu < npu0, (npu, npu0)


@pytest.mark.parametrize("bias_add", [False, True])
def test_npusim_bitexact_u55(bias_add):
    compile_and_check(linear_chain(["add", "mul"]), SHAPE, "ethos-u55-128",
                      options=LoweringOptions(int_bias_add=bias_add))


def scores_scaled(op: str) -> onnx.ModelProto:
    """Attention scores: MatMul(q, kT) on two activations, then Mul by 1/sqrt(d) or Div by sqrt(d)."""
    const = np.array(0.25 if op == "Mul" else 4.0, np.float32)
    nodes = [helper.make_node("MatMul", ["q", "k"], ["s"], name="scores"),
             helper.make_node(op, ["s", "c"], ["y"], name="scale")]
    graph = helper.make_graph(
        nodes, "scores", [helper.make_tensor_value_info("q", TensorProto.FLOAT, [2, 6, 8]),
                          helper.make_tensor_value_info("k", TensorProto.FLOAT, [2, 8, 6])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 6, 6])], [onnx.numpy_helper.from_array(const, "c")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


@pytest.mark.parametrize("op", ["Mul", "Div"])
def test_scores_scale_folds_into_rescale(op):
    model = scores_scaled(op)
    feeds = {"q": rand([2, 6, 8], 6), "k": rand([2, 8, 6], 7)}
    check_fp(model, feeds)
    cal = {**calib("q", [2, 6, 8], seed=8), **calib("k", [2, 8, 6], seed=9)}
    lowered, _ = check_int(model, cal, feeds)
    ops = sum(lowered.node_ops.values(), [])
    assert "scale" not in lowered.node_ops, lowered.node_ops  # folded: the MATMUL's one RESCALE applies it
    assert ops.count("RESCALE") == 1, ops
