"""onnxruntime's fused GELU contrib ops (com.microsoft Gelu, FastGelu, BiasGelu, QuickGelu): one int8 TABLE (after
an int32 bias add for the bias forms) within 1 LSB of onnxruntime's QDQ graph, which runs the contrib kernels
themselves; FP compositions against onnxruntime on the float graph; Vela runs them on the NPU on U55 and U85."""

from __future__ import annotations

import numpy as np
import pytest
from npbtest.ops import calib, check_fp, check_int, prepare, rand, single_op_model, vela_op_counts

from npubuild.errors import UnsupportedOpError
from npubuild.lowering.driver import lower_model
from npubuild.lowering.registry import LOWERINGS, supported_op_types

MS = "com.microsoft"
SHAPE = [1, 4, 8, 8]
BIAS = np.linspace(-1.5, 1.0, SHAPE[-1]).astype(np.float32)  # along the last axis, as the kernels broadcast it
# (op, attributes, bias or None): each attribute form the kernels take
CASES = [
    ("Gelu", {}, None),
    ("FastGelu", {}, None),
    ("FastGelu", {}, BIAS),
    ("BiasGelu", {}, BIAS),
    ("QuickGelu", {}, None),
    ("QuickGelu", {"alpha": 1.0}, None),
    ("QuickGelu", {"alpha": 2.5}, None),
]


def _id(case) -> str:
    op, attrs, bias = case
    return op + "".join(f"-{k}{v}" for k, v in attrs.items()) + ("-bias" if bias is not None else "")


def _model(case, shape=SHAPE):
    op, attrs, bias = case
    inits = {"bias": bias} if bias is not None else {}
    return single_op_model(op, {"x": shape}, {"y": shape}, inits, domain=MS, **attrs)


def sweep(low: float, high: float, shape=SHAPE) -> np.ndarray:
    n = int(np.prod(shape))
    return np.random.default_rng(0).permutation(np.linspace(low, high, n, dtype=np.float32)).reshape(shape)


@pytest.mark.parametrize("case", CASES, ids=_id)
def test_fp_matches_onnxruntime_contrib_kernel(case):
    check_fp(_model(case), {"x": rand(SHAPE, 1, -4, 4)}, rtol=1e-5, atol=2e-5)


@pytest.mark.parametrize("case", CASES, ids=_id)
def test_int_is_one_table_within_one_lsb_of_the_qdq_graph(case):
    op, _, bias = case
    model = _model(case)
    lowered, worst = check_int(model, calib("x", SHAPE, low=-4, high=4), {"x": sweep(-4, 4)}, max_lsb=1)
    ops = [o for ops in lowered.node_ops.values() for o in ops]
    assert ops.count("TABLE") == 1
    if bias is None:
        assert ops == ["TABLE"] and worst == 0  # onnxruntime's own kernel tabulated: exact
    else:
        assert ops == ["RESCALE", "ADD", "RESCALE", "TABLE"]
    for accel in ("ethos-u55-128", "ethos-u85-256"):
        assert vela_op_counts(lowered.tosa, accel)[1] == 0, accel


def test_bias_broadcasts_along_the_last_axis_of_a_transformer_activation():
    """BiasGelu as the optimiser leaves it after a MatMul: [batch, seq, hidden] with a [hidden] bias."""
    shape = [1, 16, 32]
    bias = np.random.default_rng(3).uniform(-1, 1, 32).astype(np.float32)
    model = single_op_model("BiasGelu", {"x": shape}, {"y": shape}, {"bias": bias}, domain=MS)
    check_fp(model, {"x": rand(shape, 2, -3, 3)}, rtol=1e-5, atol=2e-5)
    check_int(model, calib("x", shape, low=-3, high=3), {"x": sweep(-3, 3, shape)}, max_lsb=1)


def test_a_bias_that_does_not_match_the_last_axis_is_placed_on_the_host():
    model = single_op_model("BiasGelu", {"x": SHAPE}, {"y": SHAPE}, {"bias": BIAS[:3]}, domain=MS)
    with pytest.raises(UnsupportedOpError, match="bias of 3 values"):
        lower_model(prepare(model), "fp")


def test_onnx_gelu_and_the_contrib_gelu_are_two_lowerings():
    ops = supported_op_types()
    assert {"Gelu", "com.microsoft:Gelu", "com.microsoft:FastGelu", "com.microsoft:BiasGelu",
            "com.microsoft:QuickGelu"} <= set(ops)
    assert LOWERINGS["Gelu"] is not LOWERINGS["com.microsoft:Gelu"]


def test_a_chain_into_a_contrib_op_is_not_fused_as_onnx_gelu():
    """Sigmoid -> com.microsoft:Gelu: the one-TABLE chain fusion takes ONNX's own ops only (it would evaluate the
    contrib Gelu as ONNX's Gelu, which opset 17 lacks), so each node is its own exact TABLE."""
    from onnx import TensorProto, helper

    nodes = [helper.make_node("Sigmoid", ["x"], ["s"], name="sig"),
             helper.make_node("Gelu", ["s"], ["y"], name="gelu", domain=MS)]
    graph = helper.make_graph(nodes, "chain", [helper.make_tensor_value_info("x", TensorProto.FLOAT, SHAPE)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, SHAPE)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(MS, 1)])
    model.ir_version = 8
    lowered, _ = check_int(model, calib("x", SHAPE, low=-4, high=4), {"x": sweep(-4, 4)}, max_lsb=1)
    assert [o for ops in lowered.node_ops.values() for o in ops] == ["TABLE", "TABLE"]
