"""npu-sim on what Vela builds from other layers: IFM upscale (ConvTranspose), data movement as 1x1 pools, PRelu, ReduceMean."""

from __future__ import annotations

import numpy as np
import pytest
from npbtest.npusim import compile_and_check
from npbtest.ops import rand, single_op_model

from npubuild.npusim.cmdstream import decode

S = [1, 16, 8, 8]


def test_conv_transpose_uses_ifm_upscale_bitexact():
    m = single_op_model("ConvTranspose", {"x": S}, {"y": None}, {"w": rand((16, 8, 3, 3), 3), "b": rand((8,), 4)},
                        strides=[2, 2], pads=[1, 1, 1, 1], output_padding=[1, 1])
    model = compile_and_check(m, S)
    assert any(c.regs.get("IFM_UPSCALE") == 2 for c in decode(model.commands) if c.kind == "CONV")


def test_resize_nearest_2x_uses_ifm_upscale_bitexact():
    m = single_op_model("Resize", {"x": S}, {"y": None}, {"roi": np.zeros(0, np.float32),
                        "scales": np.array([1, 1, 2, 2], np.float32)}, mode="nearest")
    model = compile_and_check(m, S)
    assert any(c.regs.get("IFM_UPSCALE") == 1 for c in decode(model.commands) if c.kind != "DMA_START")


@pytest.mark.parametrize("name", ["concat", "pad", "transpose", "reducemean", "hardswish", "prelu", "prelu_signed"])
def test_layers_bitexact(name):
    if name == "concat":
        m = single_op_model("Concat", {"x": S, "x2": S}, {"y": None}, axis=1)
    elif name == "pad":
        m = single_op_model("Pad", {"x": S}, {"y": None}, {"p": np.array([0, 0, 1, 2, 0, 0, 2, 1], np.int64)})
    elif name == "transpose":
        m = single_op_model("Transpose", {"x": S}, {"y": None}, perm=[0, 2, 1, 3])
    elif name == "reducemean":
        m = single_op_model("ReduceMean", {"x": S}, {"y": None}, {"axes": np.array([1], np.int64)}, opset=18)
    elif name == "hardswish":
        m = single_op_model("HardSwish", {"x": S}, {"y": None})
    elif name == "prelu":
        m = single_op_model("PRelu", {"x": S}, {"y": None}, {"s": rand((16, 1, 1), 2, 0, 0.3)})
    else:  # slopes below 0 and above 1 (MediaPipe's): the two-branch form with a signed depthwise
        m = single_op_model("PRelu", {"x": S}, {"y": None}, {"s": rand((16, 1, 1), 2, -1.5, 2.5)})
    compile_and_check(m, S)
