"""npu-sim runs Vela's compiled CONV and DEPTHWISE ops bit-exactly against the TOSA reference model."""

from __future__ import annotations

import pytest
from npbtest.npusim import compile_and_check
from npbtest.ops import rand, single_op_model


def conv(cin: int, cout: int, k: int, size: int, stride: int = 1, dilation: int = 1, pad: int | None = None,
         group: int = 1):
    pad = (k // 2) * dilation if pad is None else pad
    w = rand((cout, cin // group, k, k), 7, -0.5, 0.5)
    m = single_op_model("Conv", {"x": [1, cin, size, size]}, {"y": None}, {"w": w, "b": rand((cout,), 8)},
                        pads=[pad] * 4, strides=[stride, stride], dilations=[dilation, dilation], group=group)
    return m, [1, cin, size, size]


@pytest.mark.parametrize("k,stride,dilation,cin,cout", [
    (1, 1, 1, 16, 24), (3, 1, 1, 8, 16), (3, 2, 1, 8, 16), (5, 1, 1, 3, 8), (7, 2, 1, 4, 8),
    (3, 1, 2, 8, 8), (3, 1, 1, 40, 20),
])
def test_conv_bitexact(k, stride, dilation, cin, cout):
    compile_and_check(*conv(cin, cout, k, 12, stride, dilation))


@pytest.mark.parametrize("k,stride,dilation", [(3, 1, 1), (3, 2, 1), (5, 1, 1), (3, 1, 2)])
def test_depthwise_bitexact(k, stride, dilation):
    compile_and_check(*conv(24, 24, k, 11, stride, dilation, group=24))


@pytest.mark.parametrize("accel", ["ethos-u55-32", "ethos-u55-64", "ethos-u55-256", "ethos-u65-256", "ethos-u65-512"])
def test_conv_other_accelerators(accel):
    compile_and_check(*conv(20, 36, 3, 10), accel)
    compile_and_check(*conv(32, 32, 3, 9, group=32), accel)


def test_unpadded_conv_and_size_optimised():
    compile_and_check(*conv(8, 16, 3, 13, 2, pad=0), "ethos-u55-128", "--optimise", "Size")
