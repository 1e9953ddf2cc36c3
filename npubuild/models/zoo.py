"""The example networks (MLPerf-Tiny style), each a function returning an ONNX model."""

from __future__ import annotations

from collections.abc import Callable

import onnx

from npubuild.models.builder import GraphBuilder


def ds_cnn(seed: int = 0) -> onnx.ModelProto:
    """Keyword spotting DS-CNN (MLPerf Tiny KWS): 49x10 MFCC in, 12 classes out.

    Conv 10x4/2 + BN + ReLU, four depthwise-separable blocks (3x3 depthwise +
    1x1 pointwise, each with BN + ReLU), global average pool, fully connected.
    """
    g = GraphBuilder("ds_cnn_kws", seed)
    x = g.input("input", ["N", 1, 49, 10])
    c = 64
    x = g.relu(g.batchnorm(g.conv(x, 1, c, (10, 4), stride=(2, 2), pads=[4, 1, 5, 2]), c))
    for _ in range(4):
        x = g.relu(g.batchnorm(g.conv(x, c, c, (3, 3), group=c), c))
        x = g.relu(g.batchnorm(g.conv(x, c, c, (1, 1)), c))
    x = g.node("GlobalAveragePool", [x])
    x = g.node("Flatten", [x], axis=1)
    x = g.gemm(x, c, 12)
    g.output(x, ["N", 12])
    return g.model()


MODELS: dict[str, Callable[[], onnx.ModelProto]] = {
    "ds_cnn": ds_cnn,
}
