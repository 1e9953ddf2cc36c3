"""A conv dilated past 2 as a wider kernel with zero taps, convolved at dilation 2 (even d) or 1 (odd d).

Ethos-U convolves at dilation 1 or 2; Vela's TOSA path splits a larger dilation into one conv per phase
(a TCN's d = 8 Conv1d: eight convs), where the zero taps make it one conv of the same sums. Checked against
the portable graph (dilation as TOSA states it) on the TOSA reference model and with Vela on each family.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from npbtest.ops import calib, quantize_model, vela_run
from onnx import TensorProto, helper, numpy_helper

from npubuild.lowering.driver import lower_model
from npubuild.lowering.ops.conv import taps_for_dilation
from npubuild.lowering.options import FAMILY_OPTIONS
from npubuild.tosa.run import run_tosa

SHAPE = [1, 16, 128]  # [N, C, L]


def dilated_stack(dilations=(4, 8, 3), group: int = 1):
    """Conv1d k=3 at each dilation (valid padding), ReLU between: a TCN's temporal stack (depthwise: group 16)."""
    rng = np.random.default_rng(0)
    nodes, inits, x, length = [], [], "x", SHAPE[2]
    for i, d in enumerate(dilations):
        inits += [numpy_helper.from_array(rng.normal(0, 0.3, (16, 16 // group, 3)).astype(np.float32), f"w{i}"),
                  numpy_helper.from_array(rng.normal(0, 0.1, 16).astype(np.float32), f"b{i}")]
        nodes += [helper.make_node("Conv", [x, f"w{i}", f"b{i}"], [f"c{i}"], dilations=[d], kernel_shape=[3],
                                   group=group),
                  helper.make_node("Relu", [f"c{i}"], [f"r{i}"])]
        x, length = f"r{i}", length - 2 * d
    g = helper.make_graph(nodes, "tcn", [helper.make_tensor_value_info("x", TensorProto.FLOAT, SHAPE)],
                          [helper.make_tensor_value_info(x, TensorProto.FLOAT, [1, 16, length])], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def test_taps_keep_every_product_in_place():
    w = np.arange(1, 7, dtype=np.float32).reshape(1, 2, 1, 3)
    even, (dh, dw) = taps_for_dilation(w, (1, 4))
    assert (dh, dw) == (1, 2) and even.shape == (1, 2, 1, 5)  # taps 2 apart, each 2 apart in the input: 4
    assert np.array_equal(even[..., ::2], w) and not even[..., 1::2].any()
    odd, hw = taps_for_dilation(w, (1, 3))
    assert hw == (1, 1) and odd.shape == (1, 2, 1, 7) and np.array_equal(odd[..., ::3], w)
    assert taps_for_dilation(w, (1, 64))[1] == (1, 64)  # past Vela's 64-wide kernel: left to Vela


@pytest.mark.parametrize("fam, target", [("u55", "ethos-u55-128"), ("u65", "ethos-u65-256"),
                                         ("u85", "ethos-u85-256")])
@pytest.mark.parametrize("group", [1, 16])
def test_zero_taps_identical_and_faster(fam, target, group):
    qdq = quantize_model(dilated_stack(group=group), calib("x", SHAPE))
    taps = lower_model(qdq, "int", family=fam)
    split = lower_model(qdq, "int", options=replace(FAMILY_OPTIONS[fam], dilation_taps=False))
    assert taps.tosa != split.tosa
    for seed in range(2):
        feeds = {"x": np.random.default_rng(seed).uniform(-1, 1, SHAPE).astype(np.float32)}
        a, b = run_tosa(split.tosa, split, feeds), run_tosa(taps.tosa, taps, feeds)
        assert all(np.array_equal(a[k], b[k]) for k in a)
    assert vela_run(taps.tosa, target).cycles < 0.8 * vela_run(split.tosa, target).cycles
