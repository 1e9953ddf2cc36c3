"""A residual Add's ADD with its operands swapped (LoweringOptions.add_operands_swapped).

int32 addition commutes, so the swapped ADD gives the same integers; Vela 5.2 schedules a residual block's two
branches by the ADD's operand order, and on U55 the order where each stage's big 3x3 conv runs right after the
weightless ADD before it has that conv's weights fetched from flash during the ADD. Checked on the ResNet-8
example (configs/models/resnet8.onnx, quantised as its build does): the ADDs' operands swapped, the same
integers (TOSA reference model), fewer Vela U55-128 cycles, and the lower stage's measured choice takes it where
Vela says it is faster.
"""

from __future__ import annotations

import copy
from dataclasses import replace
from pathlib import Path

import numpy as np
import onnx
import pytest
from npbtest.ops import calib, quantize_model, rand, vela_run

from npubuild.ethosu.measured import ADD_ORDER, branched_adds, choose
from npubuild.lowering.driver import LoweredGraph, lower_model
from npubuild.lowering.options import FAMILY_OPTIONS
from npubuild.tosa.graph import read_tosa
from npubuild.tosa.run import run_tosa

RESNET8 = Path(__file__).resolve().parents[2] / "configs" / "models" / "resnet8.onnx"
SHAPE = [1, 3, 32, 32]


@pytest.fixture(scope="module")
def qdq() -> onnx.ModelProto:
    return quantize_model(onnx.load(RESNET8), calib("input", SHAPE, n=8))


def lowered(model: onnx.ModelProto, swapped: bool) -> LoweredGraph:
    return lower_model(copy.deepcopy(model), "int",
                       options=replace(FAMILY_OPTIONS["u55"], add_operands_swapped=swapped))


def add_operands(g: LoweredGraph) -> list[list[str]]:
    return [op.inputs for op in read_tosa(g.tosa).ops if op.op == "ADD"]


def test_swapped_adds_give_the_same_integers(qdq) -> None:
    plain, swapped = lowered(qdq, False), lowered(qdq, True)
    assert branched_adds(qdq)
    pairs = list(zip(add_operands(plain), add_operands(swapped), strict=True))
    assert sum(s == p[::-1] != p for p, s in pairs) == 3  # the three residual ADDs (the softmax's own stays)
    out = plain.outputs[0].onnx_name
    for seed in (1, 2, 3):
        feeds = {"input": rand(SHAPE, seed=seed)}
        np.testing.assert_array_equal(run_tosa(plain.tosa, plain, feeds)[out], run_tosa(swapped.tosa, swapped, feeds)[out])


def test_swapped_adds_cost_fewer_u55_cycles(qdq) -> None:
    plain, swapped = (vela_run(lowered(qdq, s).tosa, "ethos-u55-128") for s in (False, True))
    assert swapped.cycles < plain.cycles  # the example's build: 208228 -> 201644
    adds = [[int(r["Op Cycles"]) for r in run.layers if r["NNG Operator"] == "Add"] for run in (plain, swapped)]
    assert adds[0] == adds[1]  # the ADDs themselves cost the same: the gain is the convs' weight fetch


def test_lower_stage_measures_it(qdq) -> None:
    options, record = choose(qdq, "u55", lambda o: lower_model(copy.deepcopy(qdq), "int", options=o))
    (row,) = [r for r in record if r["choice"] == ADD_ORDER.name]
    own, form = row["figures"]
    assert row["taken"] == int(form["ms"] < own["ms"]) == int(options.add_operands_swapped) == 1


@pytest.mark.parametrize(("model", "branched"), [("resnet8", True), ("resnet8_torch", True), ("tcn_imu", False),
                                                 ("mobilenet_v3_block", False), ("transformer", False)])
def test_compiled_only_where_both_branches_fetch_weights(model: str, branched: bool) -> None:
    """ResNet-8's projection shortcuts (a 1x1 conv beside the 3x3 convs) are measured; an identity shortcut
    (MobileNetV3's, the transformer's, the TCN's) runs the same ops in either order and compiles nothing more."""
    assert branched_adds(onnx.load(RESNET8.parent / f"{model}.onnx")) is branched
