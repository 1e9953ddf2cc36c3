"""Issue 21: a residual network with ReLU6, depthwise convolutions and residual adds of differently scaled
inputs stays within 1 LSB of onnxruntime's QDQ model (DQ -> float op -> Q, the TOSA check's reference) on
the U55 and U85 family lowerings and the portable one."""

from __future__ import annotations

import numpy as np
import pytest
from npbtest.ops import calib, check_int, rand

from npubuild.lowering.options import LoweringOptions
from npubuild.models.builder import GraphBuilder


def residual_dw_model(blocks: int = 3):
    """Inverted-residual blocks (1x1 expand, 3x3 depthwise, 1x1 project, each ReLU6 but the projection);
    each branch is scaled by its own gain before the Add, so the two Add inputs sit on different scales."""
    g = GraphBuilder("residual_dw", seed=3)
    y = g.conv_bn(g.input("x", [1, 8, 16, 16]), 8, 16, (3, 3), act="Relu6")
    for i in range(blocks):
        h = g.conv_bn(y, 16, 32, (1, 1), act="Relu6")
        h = g.conv_bn(h, 32, 32, (3, 3), act="Relu6", group=32)
        h = g.conv_bn(h, 32, 16, (1, 1), act=None)
        h = g.node("Mul", [h, g.const(np.float32(0.3 + 1.7 * i), "gain")])
        y = g.node("Add", [y, h])
    g.output(g.conv(y, 16, 4, (1, 1)), [1, 4, 16, 16])
    return g.model()


@pytest.mark.parametrize("family", ["u55", "u85", None])
def test_residual_depthwise_relu6_within_one_lsb(family):
    model = residual_dw_model()
    feeds = {"x": rand([1, 8, 16, 16], seed=7)}
    lowered, worst = check_int(model, calib("x", [1, 8, 16, 16], n=32), feeds, max_lsb=1.0,
                               options=LoweringOptions.for_family(family), qdq_semantics=True)
    ops = {op for v in lowered.node_ops.values() for op in v}
    assert "DEPTHWISE_CONV2D" in ops and "ADD" in ops  # the ops under test are really there
    assert worst <= 1.0
