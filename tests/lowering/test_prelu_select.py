"""A per-channel PRelu as the max / min of its two linear pieces (LoweringOptions.prelu_select, U85's per-node
measured form): the same integers as the two-branch form for every int8 input, saturation included, on the TOSA
reference model and npu-sim, and one chained pass a kind of channel on U85."""

from __future__ import annotations

import tempfile
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from npbtest.lowering import ops
from npbtest.npusim import assert_bitexact, reference, vela_raw
from npbtest.ops import calib, io_dict, quantize_model, single_op_model

from npubuild.lowering.driver import lower_model
from npubuild.lowering.options import FAMILY_OPTIONS, PORTABLE

SLOPES = {  # slope <= 1: convex channels (max); > 1: concave (min); 0 and 1 exactly, large and negative ones
    "mixed": [0.0, 1.0, -0.3, 0.25, 1.5, 5.3, -4.1, 0.999, 1.001, 2.0, -1.0, 0.5],
    "convex": [0.0, 1.0, -0.3, 0.25, -4.1, 0.999, -1.0, 0.5],
    "concave": [1.5, 5.3, 1.2, 2.0],
}


def prelu_qdq(slopes: list[float], size: int = 16):
    c = len(slopes)
    model = single_op_model("PRelu", {"x": [1, c, size, size]}, {"y": None},
                            {"s": np.array(slopes, np.float32).reshape(c, 1, 1)})
    # a calibration range that leaves the output's range narrower than the input's: both ends saturate
    return quantize_model(model, calib("x", [1, c, size, size], low=-2, high=1.5))


def every_int8(lowered) -> list[np.ndarray]:
    """An NHWC int8 input holding each of the 256 values once in every channel (a different order in each)."""
    (spec,) = io_dict(lowered)["inputs"]
    n, h, w, c = spec["shape"]
    assert h * w == 256
    rng = np.random.default_rng(0)
    planes = [rng.permutation(np.arange(-128, 128)) for _ in range(c)]
    return [np.stack(planes, -1).reshape(n, h, w, c).astype(np.int8)]


@pytest.mark.parametrize("kind", sorted(SLOPES))
def test_same_integers_as_the_branches_for_every_input(kind):
    qdq = prelu_qdq(SLOPES[kind])
    branches = lower_model(qdq, "int", options=PORTABLE)
    select = lower_model(qdq, "int", options=replace(PORTABLE, prelu_select=True))
    assert "DEPTHWISE_CONV2D" in ops(branches) and "ADD" in ops(branches)
    dws = ops(select).count("DEPTHWISE_CONV2D")
    assert dws == (2 if kind == "mixed" else 1) and "ADD" not in ops(select)
    xs = every_int8(branches)
    want, got = reference(branches.tosa, xs), reference(select.tosa, xs)
    assert np.array_equal(want[0], got[0]), f"{int(np.count_nonzero(want[0] != got[0]))} elements differ"
    # the test input reaches both saturated ends, where the argument about saturation matters
    assert want[0].min() == -128 and want[0].max() == 127


def test_named_nodes_only():
    qdq = prelu_qdq(SLOPES["mixed"])
    (node,) = [n.name for n in qdq.graph.node if n.op_type == "PRelu"]
    named = lower_model(qdq, "int", options=replace(PORTABLE, prelu_select_nodes=frozenset({node})))
    other = lower_model(qdq, "int", options=replace(PORTABLE, prelu_select_nodes=frozenset({"another"})))
    assert named.tosa == lower_model(qdq, "int", options=replace(PORTABLE, prelu_select=True)).tosa
    assert other.tosa == lower_model(qdq, "int", options=PORTABLE).tosa


@pytest.mark.parametrize("kind", ["mixed", "convex"])
def test_bitexact_on_npusim_u85(kind):
    qdq = prelu_qdq(SLOPES[kind])
    lowered = lower_model(qdq, "int", options=replace(FAMILY_OPTIONS["u85"], prelu_select=True))
    with tempfile.TemporaryDirectory() as tmp:
        assert_bitexact(lowered.tosa, io_dict(lowered), vela_raw(lowered.tosa, Path(tmp), "ethos-u85-256"))
