"""A whole-plane average that keeps its scale: U55/U65 sum the stored int8 values by REDUCE_SUM where that is
the pool's integers, U85 keeps AVG_POOL2D.

Vela's U55 pooling of an 8x8 window costs more than its REDUCE_SUM (ResNet-8's head: 3152 vs
2662 cycles on U55-128). round(sum(x) / n) is the pool's only where no rounding tie falls below the zero
point: n odd (no tie), or n a power of two at the int8 minimum zero point (a ReLU's output, as ResNet-8's
head). TOSA's pool rounds a tie below the zero point down, the raw sum up: a power of two at another zero
point keeps the pool (mp_selfie_segmentation's masks were off model.tosa on real images). Checked against
onnxruntime, the portable graph, Vela and npu-sim.
"""

from __future__ import annotations

import tempfile
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from npbtest.lowering import assert_same_reference, npu_bitexact, ops, wrapped
from npbtest.npusim import reference, vela_raw
from npbtest.ops import calib, check_int, io_dict, quantize_model, vela_run

from npubuild.lowering.driver import lower_model
from npubuild.lowering.options import FAMILY_OPTIONS, PlaneSumLimits
from npubuild.npusim.npz import load_raw
from npubuild.npusim.sim import run


def _gap_model(shape: list[int]):
    """An AveragePool over the whole plane, which onnxruntime quantizes with its input's scale."""
    return wrapped("AveragePool", shape, [*shape[:2], 1, 1], kernel_shape=shape[2:])


def _relu_range(shape: list[int]) -> dict[str, np.ndarray]:
    """Calibration from 0 up: the zero point is the int8 minimum (-128), as after a ReLU."""
    return calib("x", shape, low=0.0, high=3.0)


# a power-of-two count, an odd one, and a 4x4 window of 16 channels (U55 sums from 4x4, U65 from 8x8)
@pytest.mark.parametrize("shape", [[1, 64, 8, 8], [1, 32, 9, 9], [1, 16, 4, 4]])
def test_u55_sum_identical_to_the_pool_and_faster(shape):
    model = _gap_model(shape)
    cal = _relu_range(shape)
    check_int(model, cal, {"x": np.random.default_rng(5).uniform(0, 3, shape).astype(np.float32)})
    qdq = quantize_model(model, cal)
    portable, u55, u65 = (lower_model(qdq, "int", family=f) for f in (None, "u55", "u65"))
    assert io_dict(portable)["inputs"][0]["zero_point"] == -128
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
    qdq = quantize_model(_gap_model([1, 32, 8, 8]), _relu_range([1, 32, 8, 8]))
    npu_bitexact(lower_model(qdq, "int", family="u55"))


@pytest.mark.parametrize("shape", [[1, 64, 2, 2], [1, 8, 8, 8], [1, 128, 8, 8], [1, 32, 10, 10]])
def test_small_wide_or_inexact_means_keep_the_pool_on_u55(shape):
    """A window under 4x4, fewer than 16 or more than 96 channels are cheaper pooled on U55-128 (forced, the
    sum is slower); a count of 100 could round a tie differently as a raw sum."""
    qdq = quantize_model(_gap_model(shape), _relu_range(shape))
    pooled = lower_model(qdq, "int", family="u55")
    assert pooled.tosa == lower_model(qdq, "int").tosa
    if shape[2] * shape[3] == 100:
        return
    forced = replace(FAMILY_OPTIONS["u55"], plane_sum=PlaneSumLimits(0, 0, 1 << 30))
    summed = lower_model(qdq, "int", options=forced)
    assert "REDUCE_SUM" in ops(summed)
    assert vela_run(summed.tosa, "ethos-u55-128").cycles > vela_run(pooled.tosa, "ethos-u55-128").cycles


def _ties(h: int, w: int, channels: int) -> np.ndarray:
    """NHWC int8 planes whose sum is a tie (n * (k + 1/2)): half of each plane k, half k + 1, k from -124 to
    -53 over the channels: below, at and above a zero point of -64."""
    n = h * w
    x = np.empty((1, h, w, channels), np.int8)
    for c in range(channels):
        k = -124 + (c * 71) // max(channels - 1, 1)
        x[0, :, :, c] = np.repeat([k, k + 1], n // 2).reshape(h, w)
    return x


# the selfie segmentation's windows, 16x16 and 64x64, at a zero point above the int8 minimum (-64), where the raw
# sum rounds a tie below it 1 LSB above the pool, and at the minimum (-128), where no tie is below it
@pytest.mark.parametrize(("shape", "low", "zp"), [([1, 32, 16, 16], -1.0, -64), ([1, 32, 64, 64], -1.0, -64),
                                                  ([1, 32, 16, 16], 0.0, -128), ([1, 32, 64, 64], 0.0, -128)])
def test_a_mean_on_a_tie_below_the_zero_point_is_the_pools(shape, low, zp):
    """Planes whose mean is a tie, below and above a zero point of -64: at that zero point U55 and U65 keep the
    pool (the raw sum gave 27 of these 32 means 1 LSB higher); at -128 they sum, and the sum gives the pool's
    integers on the TOSA reference model and on npu-sim for Vela's U55-128 and U65-256 streams."""
    qdq = quantize_model(_gap_model(shape), calib("x", shape, low=low, high=3.0))
    portable = lower_model(qdq, "int")
    u55, u65 = (lower_model(qdq, "int", family=f) for f in ("u55", "u65"))
    assert io_dict(portable)["inputs"][0]["zero_point"] == zp
    assert u65.tosa == u55.tosa
    if zp != -128:
        assert u55.tosa == portable.tosa
        forced = replace(FAMILY_OPTIONS["u55"], plane_sum=PlaneSumLimits(0, 0, 1 << 30))
        assert lower_model(qdq, "int", options=forced).tosa == portable.tosa  # never summed, whatever the limits
        return
    assert "REDUCE_SUM" in ops(u55)
    x = [_ties(shape[2], shape[3], shape[1])]
    want = reference(portable.tosa, x)[0]
    got = reference(u55.tosa, x)[0]
    assert np.array_equal(want, got), f"{int(np.count_nonzero(want != got))} of {want.size} means differ"
    for accelerator in ("ethos-u55-128", "ethos-u65-256"):
        with tempfile.TemporaryDirectory() as tmp:
            sim = run(load_raw(vela_raw(u55.tosa, Path(tmp), accelerator)), x).outputs[0]
        assert np.array_equal(want.ravel(), np.asarray(sim).ravel()), accelerator
