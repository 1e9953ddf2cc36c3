"""A residual Add / Sub of two conv branches as one 1x2 depthwise conv (ops/elementwise._depthwise_sum).

The quantize stage puts the operands' scales in a ratio p / 64 (frontend/qdq_add_ratio.py); the ADD then
widens both by integers and U55's depthwise form must give its integers for any zero points (TOSA reference
model, npu-sim on Vela's command stream), cost fewer U55 cycles, and stay out of the sums it does not pay on.
"""

from __future__ import annotations

import tempfile
from dataclasses import replace
from pathlib import Path

import numpy as np
import onnx
import pytest
from npbtest.lowering import assert_same_reference, model_of, ops
from npbtest.npusim import assert_bitexact, vela_raw
from npbtest.ops import calib, check_qdq, io_dict, prepare, quantize_model, vela_run
from onnx import helper, numpy_helper

from npubuild.ethosu.measured import ADD_DEPTHWISE, choose
from npubuild.frontend import qdq_add_ratio
from npubuild.frontend.ptq.choose import Scorer
from npubuild.frontend.qdq_add_ratio import (
    MAX_COARSEN,
    STEPS,
    coarsened,
    depthwise_sums,
    snap_add_ratios,
    snap_if_free,
    weights,
)
from npubuild.frontend.quantize import quantize_chosen
from npubuild.lowering.driver import lower_model
from npubuild.lowering.options import FAMILY_OPTIONS


def _branches(kind: str = "Add", shortcut: str = "conv", c: int = 16, hw: int = 16) -> onnx.ModelProto:
    """x -> conv -> relu -> conv (a) and x -> 1x1 conv (b, or x itself for an identity shortcut); a kind b;
    relu; a last conv reads the sum."""
    rng = np.random.default_rng(4)

    def w(o, i, k):
        return (rng.standard_normal((o, i, k, k)) * 0.4).astype(np.float32)

    nodes = [helper.make_node("Conv", ["x", "w0"], ["h"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["h"], ["hr"]),
             helper.make_node("Conv", ["hr", "w1"], ["a"], pads=[1, 1, 1, 1])]
    inits = {"w0": w(c, c, 3), "w1": w(c, c, 3) * 0.5, "w3": w(c, c, 1)}
    if shortcut == "conv":
        nodes.append(helper.make_node("Conv", ["x", "w2"], ["b"]))
        inits["w2"] = w(c, c, 1) * 2.0
    nodes += [helper.make_node(kind, ["a", "b" if shortcut == "conv" else "x"], ["s"]),
              helper.make_node("Relu", ["s"], ["r"]), helper.make_node("Conv", ["r", "w3"], ["y"])]
    return model_of(nodes, {"x": [1, c, hw, hw]}, {"y": [1, c, hw, hw]}, inits)


def _operand_scales(qdq: onnx.ModelProto, kind: str) -> tuple[float, float]:
    inits = {t.name: numpy_helper.to_array(t) for t in qdq.graph.initializer}
    dq = {n.output[0]: n for n in qdq.graph.node if n.op_type == "DequantizeLinear"}
    (node,) = [n for n in qdq.graph.node if n.op_type == kind]
    sa, sb = (float(inits[dq[i].input[1]]) for i in node.input)
    return sa, sb


def test_ratio_helpers():
    assert weights(0.5, 0.25) == (STEPS, STEPS // 2) and weights(0.25, 0.5) == (STEPS // 2, STEPS)
    assert weights(0.3, 0.3) == (STEPS, STEPS)
    assert weights(1.0, 0.3) is None  # 19.2 / 64
    assert weights(1.0, 1.0 / 256) is None  # below 1 / 64 of the other
    for s_move, s_fixed in [(0.3, 1.0), (0.97, 1.0), (1.5, 1.0), (0.02, 1.0)]:
        new = coarsened(s_move, s_fixed)
        assert new is not None and new >= s_move * (1 - 1e-12)
        assert weights(new, s_fixed) is not None or weights(s_fixed, new) is not None
    assert coarsened(0.3, 1.0) == pytest.approx(20 / 64) and coarsened(1.5, 1.0) == pytest.approx(64 / 42)


@pytest.mark.parametrize("kind", ["Add", "Sub"])
def test_quantize_stage_puts_the_operands_in_a_64ths_ratio_by_a_small_coarsening(kind):
    model = _branches(kind)
    plain = quantize_model(model, calib("x", [1, 16, 16, 16]))
    before = _operand_scales(plain, kind)
    qdq = quantize_model(model, calib("x", [1, 16, 16, 16]))
    assert snap_add_ratios(qdq) == 1
    after = _operand_scales(qdq, kind)
    assert weights(*after) is not None and weights(*before) is None
    moved = [b / a - 1 for a, b in zip(before, after, strict=True) if a != b]
    assert len(moved) == 1 and 0 < moved[0] <= MAX_COARSEN


def test_identity_shortcut_keeps_its_scales():
    """x is read by the branch's first conv too: the depthwise form would cost Vela a copy of x into the CONCAT,
    so the stage moves nothing and the ADD stays."""
    model = _branches(shortcut="identity")
    qdq = quantize_model(model, calib("x", [1, 16, 16, 16]))
    assert snap_add_ratios(qdq) == 0
    u55 = replace(FAMILY_OPTIONS["u55"], add_as_depthwise=True)
    assert "DEPTHWISE_CONV2D" not in ops(lower_model(qdq, "int", options=u55))


@pytest.mark.parametrize("kind", ["Add", "Sub"])
@pytest.mark.parametrize("swapped", [False, True])
def test_depthwise_sum_gives_the_add_integers(kind, swapped):
    model = _branches(kind)
    qdq = quantize_model(model, calib("x", [1, 16, 16, 16]))
    snap_add_ratios(qdq)
    u55 = replace(FAMILY_OPTIONS["u55"], add_operands_swapped=swapped, add_as_depthwise=True)
    as_dw = lower_model(qdq, "int", options=u55)
    as_add = lower_model(qdq, "int", options=replace(u55, add_as_depthwise=False))
    assert "DEPTHWISE_CONV2D" in ops(as_dw) and kind.upper() not in ops(as_dw)
    assert kind.upper() in ops(as_add)
    assert_same_reference(as_add, as_dw)
    # and within 1 LSB of onnxruntime's QDQ model (DQ -> float -> Q) on random inputs, as before the ratio
    check_qdq(qdq, {"x": np.random.default_rng(7).uniform(-1, 1, (1, 16, 16, 16)).astype(np.float32)},
              max_lsb=1.0, options=u55)


def test_depthwise_sum_bitexact_on_npusim_and_faster_on_u55():
    qdq = _snapped(_branches())
    as_dw = lower_model(qdq, "int", options=replace(FAMILY_OPTIONS["u55"], add_as_depthwise=True))
    as_add = lower_model(qdq, "int", family="u55")
    assert "DEPTHWISE_CONV2D" in ops(as_dw)
    with tempfile.TemporaryDirectory() as tmp:
        assert_bitexact(as_dw.tosa, io_dict(as_dw), vela_raw(as_dw.tosa, Path(tmp), "ethos-u55-128"))
    with tempfile.TemporaryDirectory() as tmp:  # the ADD of integer widenings: Vela's elementwise add too
        assert_bitexact(as_add.tosa, io_dict(as_add), vela_raw(as_add.tosa, Path(tmp), "ethos-u55-128"))
    assert vela_run(as_dw.tosa, "ethos-u55-128").cycles < vela_run(as_add.tosa, "ethos-u55-128").cycles


def test_u55_measures_the_form_per_model_and_other_families_keep_the_add():
    """U55 compiles both forms of a model with such sums and takes the faster by Vela's estimate; a model whose
    sums cannot take it (an identity shortcut) compiles nothing more."""
    qdq = _snapped(_branches())
    assert depthwise_sums(qdq) == 1
    for family in ("u55", "u65", "u85"):
        assert "ADD" in ops(lower_model(qdq, "int", family=family))
    options, record = choose(qdq, "u55", lambda o: lower_model(qdq, "int", options=o))
    (entry,) = [r for r in record if r["choice"] == ADD_DEPTHWISE.name]
    assert entry["taken"] == 1 and options.add_as_depthwise
    assert entry["figures"][1]["ms"] < entry["figures"][0]["ms"]
    plain = quantize_model(_branches(shortcut="identity"), calib("x", [1, 16, 16, 16]))
    assert depthwise_sums(plain) == 0
    assert not [r for r in choose(plain, "u55", lambda o: lower_model(plain, "int", options=o))[1]
                if r["choice"] == ADD_DEPTHWISE.name]


def _snapped(model: onnx.ModelProto) -> onnx.ModelProto:
    qdq = quantize_model(model, calib("x", [1, 16, 16, 16]))
    assert snap_add_ratios(qdq) == 1
    return qdq


def test_a_concat_member_or_value_moving_output_is_never_moved():
    """The moved operand's grid is its own: an operand a Concat also reads keeps the scale the concat group
    shares (share_concat_scales), and so does a MaxPool's output (onnxruntime names it on its input's grid)."""
    rng = np.random.default_rng(2)
    c = 8
    nodes = [helper.make_node("Conv", ["x", "w0"], ["a"]), helper.make_node("Conv", ["x", "w1"], ["p"]),
             helper.make_node("MaxPool", ["p"], ["b"], kernel_shape=[1, 1]),
             helper.make_node("Add", ["a", "b"], ["s"]), helper.make_node("Conv", ["s", "w2"], ["y"])]
    inits = {k: (rng.standard_normal((c, c, 1, 1)) * s).astype(np.float32)
             for k, s in (("w0", 0.3), ("w1", 1.7), ("w2", 0.5))}
    model = model_of(nodes, {"x": [1, c, 8, 8]}, {"y": [1, c, 8, 8]}, inits)
    qdq = quantize_model(model, calib("x", [1, c, 8, 8]))
    sa, sb = _operand_scales(qdq, "Add")
    # the MaxPool's output b would take the ratio for the least coarsening (a is 12.1 / 64 of it: b +1.2%, a +7%)
    assert coarsened(sb, sa) / sb - 1 < MAX_COARSEN < coarsened(sa, sb) / sa - 1
    assert snap_add_ratios(qdq) == 0 and _operand_scales(qdq, "Add") == (sa, sb)
    inits["w3"] = np.eye(c, dtype=np.float32).reshape(c, c, 1, 1)  # b by a conv of its own (b = p): b is moved
    nodes[2] = helper.make_node("Conv", ["p", "w3"], ["b"])
    qdq = quantize_model(model_of(nodes, {"x": [1, c, 8, 8]}, {"y": [1, c, 8, 8]}, inits), calib("x", [1, c, 8, 8]))
    assert snap_add_ratios(qdq) == 1 and weights(*_operand_scales(qdq, "Add")) is not None


@pytest.mark.parametrize("tolerance,kept", [(1e9, True), (-1e9, False)])
def test_the_stage_keeps_the_ratio_only_within_its_accuracy_tolerance(monkeypatch, tolerance, kept):
    """snap_if_free scores the QDQ model with and without the ratio against float on the calibration samples
    (the recipes' scorer) and keeps it only if neither the worst nor the mean output loses more than the
    tolerance; its record says what it measured and did."""
    monkeypatch.setattr(qdq_add_ratio, "SNAP_TOLERANCE_DB", tolerance)
    model = _branches()
    arrays = calib("x", [1, 16, 16, 16])
    qdq = quantize_model(model, arrays)
    before = _operand_scales(qdq, "Add")
    record = snap_if_free(qdq, prepare(model), arrays)
    assert record is not None and record["moved"] == 1 and record["kept"] is kept
    after = _operand_scales(qdq, "Add")
    assert (weights(*after) is not None and after != before) if kept else after == before
    scorer = Scorer(prepare(model), arrays)
    assert round(scorer.score(qdq)[0], 2) == record["snr_db"][1 if kept else 0]


def test_quantize_stage_records_the_ratio_step():
    model = _branches()
    arrays = calib("x", [1, 16, 16, 16])
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "m.onnx"
        onnx.save(prepare(model), path)
        qdq, choice = quantize_chosen(path, prepare(model), arrays, {"per_channel": True, "method": "minmax",
                                      "symmetric_activations": False, "bias_correction": False,
                                      "equalization": False})
    record = choice.to_json()["add_ratio"]
    assert record["moved"] == 1
    assert (weights(*_operand_scales(qdq, "Add")) is not None) is record["kept"]
