"""U55's bilinear 2x replicated by depthwise copies into CONCATs (LoweringOptions.replicate_copies).

Vela 5.2 runs the U55 RESIZE (pixel replication) as an AvgPool that upscales its input, about one output element a
cycle on U55-128; the same replication as CONCAT([x, x]) along C and then along W, whose bytes are the replicated
tensor (the RESHAPEs are views), with each input a 1x1 depthwise copy Vela writes straight into the CONCAT, costs
fewer cycles. Checked on U-Net steps: no RESIZE left, the same integers (TOSA reference model), fewer Vela cycles on
U55-128, and the lower stage's measured choice takes it where Vela says it is faster.
"""

from __future__ import annotations

import copy
from dataclasses import replace

import numpy as np
import onnx
import pytest
from npbtest.lowering import BIG_UNET, qdq_unet_step
from npbtest.ops import rand, vela_run

from npubuild.ethosu.measured import choose
from npubuild.lowering.driver import LoweredGraph, lower_model
from npubuild.lowering.options import FAMILY_OPTIONS
from npubuild.tosa.graph import read_tosa
from npubuild.tosa.run import run_tosa

LARGE = (64, 8, 16)  # a 32x32x16 upsample (in halves on U55)


@pytest.fixture(scope="module", params=[BIG_UNET, LARGE], ids=["16x16x32", "32x32x16"])
def qdq(request) -> onnx.ModelProto:
    return qdq_unet_step(*request.param)


def lowered(model: onnx.ModelProto, copies: bool) -> LoweredGraph:
    return lower_model(copy.deepcopy(model), "int", options=replace(FAMILY_OPTIONS["u55"], replicate_copies=copies))


def ops(g: LoweredGraph) -> list[str]:
    return [op.op for op in read_tosa(g.tosa).ops]


def test_replication_without_resize_gives_the_same_integers(qdq) -> None:
    resize, copies = lowered(qdq, False), lowered(qdq, True)
    assert "RESIZE" in ops(resize) and "RESIZE" not in ops(copies)
    shape = [d.dim_value for d in qdq.graph.input[0].type.tensor_type.shape.dim]
    for seed in (5, 6):
        feeds = {"x": rand(shape, seed=seed)}
        np.testing.assert_array_equal(run_tosa(resize.tosa, resize, feeds)["y"], run_tosa(copies.tosa, copies, feeds)["y"])


def test_copies_cost_vela_fewer_u55_cycles(qdq) -> None:
    resize, copies = (vela_run(lowered(qdq, c).tosa, "ethos-u55-128") for c in (False, True))
    assert copies.cycles < resize.cycles  # 16x16x32: 141050 -> 135298, 32x32x16: 241538 -> 228478
    assert [any(r["NNG Operator"] == "AvgPool" for r in run.layers) for run in (resize, copies)] == [True, False]


def test_lower_stage_measures_it(qdq) -> None:
    options, record = choose(qdq, "u55", lambda o: lower_model(copy.deepcopy(qdq), "int", options=o))
    (row,) = [r for r in record if r["choice"] == "2x replication as depthwise copies into CONCATs"]
    own, form = row["figures"]
    assert row["taken"] == int(form["ms"] < own["ms"]) == int(options.replicate_copies)
