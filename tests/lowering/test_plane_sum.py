"""A whole-plane average that keeps its scale: U55/U65 sum the raw int8 values, U85 keeps AVG_POOL2D.

Vela's U55 pooling of an 8x8 window costs more than its REDUCE_SUM (ResNet-8's head: 3152 vs
2662 cycles on U55-128); the sum needs no zero-point term because round(sum(x - zp) / n) + zp is
round(sum(x) / n). Checked against onnxruntime, the portable graph, Vela and npu-sim.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from npbtest.lowering import assert_same_reference, npu_bitexact, ops, wrapped
from npbtest.ops import calib, check_int, quantize_model, vela_run

from npubuild.lowering.driver import lower_model
from npubuild.lowering.options import FAMILY_OPTIONS, PlaneSumLimits


def _gap_model(shape: list[int]):
    """An AveragePool over the whole plane, which onnxruntime quantizes with its input's scale."""
    return wrapped("AveragePool", shape, [*shape[:2], 1, 1], kernel_shape=shape[2:])


# a power-of-two count, an odd one, and a 4x4 window of 16 channels (U55 sums from 4x4, U65 from 8x8)
@pytest.mark.parametrize("shape", [[1, 64, 8, 8], [1, 32, 9, 9], [1, 16, 4, 4]])
def test_u55_sum_identical_to_the_pool_and_faster(shape):
    model = _gap_model(shape)
    cal = calib("x", shape, low=-1.0, high=3.0)
    check_int(model, cal, {"x": np.random.default_rng(5).uniform(-1, 3, shape).astype(np.float32)})
    qdq = quantize_model(model, cal)
    portable, u55, u65 = (lower_model(qdq, "int", family=f) for f in (None, "u55", "u65"))
    assert "AVG_POOL2D" in ops(portable)  # onnxruntime kept the scale: the exact pool
    assert "REDUCE_SUM" in ops(u55) and "AVG_POOL2D" not in ops(u55)
    assert lower_model(qdq, "int", family="u85").tosa == portable.tosa
    assert_same_reference(portable, u55)
    assert vela_run(u55.tosa, "ethos-u55-128").cycles < vela_run(portable.tosa, "ethos-u55-128").cycles
    if shape[2] * shape[3] >= 64:  # U65 sums from 8x8
        assert u65.tosa == u55.tosa
        assert vela_run(u65.tosa, "ethos-u65-256").cycles < vela_run(portable.tosa, "ethos-u65-256").cycles
    else:
        assert u65.tosa == portable.tosa


def test_u55_sum_bitexact_on_npusim():
    qdq = quantize_model(_gap_model([1, 32, 8, 8]), calib("x", [1, 32, 8, 8], low=-1.0, high=3.0))
    npu_bitexact(lower_model(qdq, "int", family="u55"))


@pytest.mark.parametrize("shape", [[1, 64, 2, 2], [1, 8, 8, 8], [1, 128, 8, 8], [1, 32, 10, 10]])
def test_small_wide_or_inexact_means_keep_the_pool_on_u55(shape):
    """A window under 4x4, fewer than 16 or more than 96 channels are cheaper pooled on U55-128 (forced, the
    sum is slower); a count of 100 could round a tie differently as a raw sum."""
    qdq = quantize_model(_gap_model(shape), calib("x", shape, low=-1.0, high=3.0))
    pooled = lower_model(qdq, "int", family="u55")
    assert pooled.tosa == lower_model(qdq, "int").tosa
    if shape[2] * shape[3] == 100:
        return
    forced = replace(FAMILY_OPTIONS["u55"], plane_sum=PlaneSumLimits(0, 0, 1 << 30))
    summed = lower_model(qdq, "int", options=forced)
    assert "REDUCE_SUM" in ops(summed)
    assert vela_run(summed.tosa, "ethos-u55-128").cycles > vela_run(pooled.tosa, "ethos-u55-128").cycles
