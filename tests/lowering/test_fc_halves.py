"""A fully connected layer in two output halves (LoweringOptions.fc_halves_nodes, ops/conv._fully_connected).

Each half is a 1x1 CONV2D of half the output channels on the output's one quantisation, joined by a CONCAT: every
channel's integers are the ones the whole conv gives (TOSA reference model; npu-sim runs Vela's command stream
bit for bit), so the form is exact. Size mode takes it where Vela then buffers a transformer's FFN weights as
after the depthwise (tests/ethosu/test_measured.py).
"""

from __future__ import annotations

import tempfile
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from npbtest.lowering import assert_same_reference, model_of, ops
from npbtest.npusim import assert_bitexact, vela_raw
from npbtest.ops import calib, check_int, io_dict, quantize_model
from onnx import helper

from npubuild.lowering.driver import lower_model
from npubuild.lowering.options import FAMILY_OPTIONS


def _norm_then_ffn(rows: int = 16, k: int = 64, o: int = 128):
    """LayerNorm -> MatMul (k -> o) + bias -> Relu: a transformer FFN's first layer after its layer norm."""
    rng = np.random.default_rng(3)
    nodes = [helper.make_node("LayerNormalization", ["x", "g", "b"], ["n"], axis=-1, name="norm"),
             helper.make_node("MatMul", ["n", "w"], ["m"], name="ffn1"), helper.make_node("Add", ["m", "bias"], ["a"]),
             helper.make_node("Relu", ["a"], ["y"])]
    inits = {"g": rng.uniform(0.8, 1.2, k).astype(np.float32), "b": rng.uniform(-0.15, 0.15, k).astype(np.float32),
             "w": (rng.standard_normal((k, o)) * 0.2).astype(np.float32),
             "bias": (rng.standard_normal(o) * 0.1).astype(np.float32)}
    return model_of(nodes, {"x": [1, rows, k]}, {"y": [1, rows, o]}, inits)


@pytest.mark.parametrize("family", ["u55", "u65", "u85"])
def test_halves_give_the_whole_convs_integers(family):
    model = _norm_then_ffn()
    cal = calib("x", [1, 16, 64], n=8)
    qdq = quantize_model(model, cal)
    mm = "ffn1"
    halves = replace(FAMILY_OPTIONS[family], fc_halves_nodes=frozenset([mm]))
    whole = lower_model(qdq, "int", options=FAMILY_OPTIONS[family])
    split = lower_model(qdq, "int", options=halves)
    assert ops(split).count("CONV2D") == ops(whole).count("CONV2D") + 1 and "CONCAT" in ops(split)
    assert_same_reference(whole, split)
    assert halves.exact_only().fc_halves_nodes == {mm}  # an exact form: exact_only keeps it
    # and against onnxruntime's QDQ result as any lowering is
    check_int(model, cal, {"x": np.random.default_rng(7).uniform(-1, 1, (1, 16, 64)).astype(np.float32)},
              options=halves)


def test_halves_run_bit_for_bit_on_npusim():
    qdq = quantize_model(_norm_then_ffn(), calib("x", [1, 16, 64], n=8))
    mm = "ffn1"
    split = lower_model(qdq, "int", options=replace(FAMILY_OPTIONS["u65"], fc_halves_nodes=frozenset([mm])))
    with tempfile.TemporaryDirectory() as tmp:
        assert_bitexact(split.tosa, io_dict(split), vela_raw(split.tosa, Path(tmp), "ethos-u65-256"))


def test_other_nodes_and_odd_widths_stay_whole():
    """Only the nodes named are split, and only an even number of output channels."""
    model = _norm_then_ffn(o=127)
    qdq = quantize_model(model, calib("x", [1, 16, 64], n=8))
    mm = "ffn1"
    whole = lower_model(qdq, "int", family="u65")
    assert lower_model(qdq, "int", options=replace(FAMILY_OPTIONS["u65"], fc_halves_nodes=frozenset([mm]))).tosa \
        == whole.tosa
    assert lower_model(qdq, "int", options=replace(FAMILY_OPTIONS["u65"], fc_halves_nodes=frozenset(["other"]))).tosa \
        == whole.tosa
