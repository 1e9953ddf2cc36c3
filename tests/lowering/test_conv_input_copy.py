"""A conv whose input is copied first (LoweringOptions.conv_input_copy_nodes: a MAXIMUM of the input with itself
over its long-rows view) computes the same integers, and U85's measured choice takes the copy only where Vela's
estimate says it pays (ethosu/measured.CONV_INPUT_COPY: PP-OCRv4 det's FPN head, whose 40x40x96 concat Vela
leaves in DRAM, 3.26 -> 2.29 ms on U85-256; a concat Vela keeps in SRAM, as here, gains nothing from it)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import onnx
from npbtest.lowering import model_of
from npbtest.ops import calib, quantize_model
from onnx import helper

from npubuild.ethosu.measured import choose, convs_reading_concats
from npubuild.lowering.driver import lower_model
from npubuild.lowering.options import FAMILY_OPTIONS
from npubuild.tosa.graph import read_tosa
from npubuild.tosa.run import run_tosa


def fpn_head(side: int = 80, c: int = 32) -> onnx.ModelProto:
    """A small feature pyramid: three stride-2 convs, the two deeper maps upsampled back, a concat of four maps and
    a 3x3 head conv over it (named `head`)."""
    rng = np.random.default_rng(0)

    def w(o: int, i: int, k: int) -> np.ndarray:
        return (rng.standard_normal((o, i, k, k)) * 0.2).astype(np.float32)

    def conv(x: str, wt: str, y: str, k: int, s: int = 1, name: str = "") -> list[onnx.NodeProto]:
        return [helper.make_node("Conv", [x, wt], [y + "_c"], kernel_shape=[k, k], strides=[s, s],
                                 pads=[k // 2] * 4, name=name or y), helper.make_node("Relu", [y + "_c"], [y])]

    nodes = [*conv("x", "w0", "a", 3, 2), *conv("a", "w1", "b", 3, 2), *conv("b", "w2", "d", 3, 2),
             helper.make_node("Resize", ["d", "", "s4"], ["ud"], mode="nearest"),
             helper.make_node("Resize", ["b", "", "s2"], ["ub"], mode="nearest"), *conv("a", "w3", "e", 1),
             helper.make_node("Concat", ["a", "ub", "ud", "e"], ["cat"], axis=1), *conv("cat", "w", "y", 3, name="head")]
    half = side // 2
    inits = {"w0": w(c, 16, 3), "w1": w(c, c, 3), "w2": w(c, c, 3), "w3": w(c, c, 1), "w": w(c, 4 * c, 3) * 0.3,
             "s4": np.array([1, 1, 4, 4], np.float32), "s2": np.array([1, 1, 2, 2], np.float32)}
    model = model_of(nodes, {"x": [1, 16, side, side]}, {"y": [1, c, half, half]}, inits)
    return quantize_model(model, calib("x", [1, 16, side, side], n=4))


def test_the_copy_keeps_the_integers():
    qdq = fpn_head(side=32, c=16)
    assert convs_reading_concats(qdq) == ["head"]
    own = FAMILY_OPTIONS["u85"]
    plain, copied = (lower_model(qdq, "int", options=o) for o in (own, replace(own, conv_input_copy_nodes={"head"})))
    ops = [op.op for op in read_tosa(copied.tosa).ops]
    assert ops.count("MAXIMUM") == 1 + [op.op for op in read_tosa(plain.tosa).ops].count("MAXIMUM")
    for seed in range(3):
        feeds = {"x": np.random.default_rng(seed).uniform(-1, 1, (1, 16, 32, 32)).astype(np.float32)}
        a, b = run_tosa(plain.tosa, plain, feeds), run_tosa(copied.tosa, copied, feeds)
        assert all(np.array_equal(a[k], b[k]) for k in a)


def test_u85_leaves_out_a_copy_that_only_costs():
    """Vela keeps this concat in SRAM: the head conv reads it at 39k DRAM cycles either way, and the copy would
    add a MAXIMUM pass (U85-256: 512k -> 729k cycles), so the choice measures both and keeps the conv as it is."""
    qdq = fpn_head()
    options, record = choose(qdq, "u85", lambda o: lower_model(qdq, "int", options=o))
    (copy,) = [r for r in record if r["choice"] == "conv input copied out of DRAM"]
    (plain_cycles, copy_cycles), = copy["nodes"].values()
    assert copy_cycles > plain_cycles and not options.conv_input_copy_nodes
