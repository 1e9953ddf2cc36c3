"""A whole-plane mean at a new scale summed row by row first (LoweringOptions.plane_rows, reduction.row_sums).

The exact int32 sum over H and W (one rounding into the output's scale) costs Vela a transpose of the whole
plane in front of its REDUCE_SUM; a (1, W) depthwise convolution of ones sums each row first (exact, passed
through int16), so the transpose moves W times less data. Checked against onnxruntime, the one-REDUCE_SUM
form (same integers), Vela's cycle estimate and npu-sim.
"""

from __future__ import annotations

import tempfile
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from npbtest.lowering import assert_same_reference, ops, se_pool_model
from npbtest.npusim import assert_bitexact, vela_raw
from npbtest.ops import calib, check_int, io_dict, quantize_model, vela_run

from npubuild.ethosu.measured import choose
from npubuild.lowering.driver import lower_model
from npubuild.lowering.options import FAMILY_OPTIONS, PlaneRowsLimits

FAMILY_TARGETS = [("u55", "ethos-u55-128"), ("u65", "ethos-u65-256"), ("u85", "ethos-u85-256")]


def _without_rows(family: str):
    return replace(FAMILY_OPTIONS[family], plane_rows=None)


@pytest.mark.parametrize("op", ["ReduceMean", "GlobalAveragePool"])
@pytest.mark.parametrize("family,target", FAMILY_TARGETS)
def test_row_sums_same_integers_and_faster(op, family, target):
    shape = [1, 8, 16, 16]
    model = se_pool_model(64, 16, 16, op)
    cal = calib("x", shape, low=-1.0, high=3.0)
    rows, _ = check_int(model, cal, {"x": np.random.default_rng(5).uniform(-1, 3, shape).astype(np.float32)},
                        options=FAMILY_OPTIONS[family])
    qdq = quantize_model(model, cal)
    one_sum = lower_model(qdq, "int", options=_without_rows(family))
    assert "DEPTHWISE_CONV2D" in ops(rows) and "DEPTHWISE_CONV2D" not in ops(one_sum)
    assert ops(one_sum).count("REDUCE_SUM") == ops(rows).count("REDUCE_SUM") == 1
    assert_same_reference(one_sum, rows)
    assert vela_run(rows.tosa, target).cycles < vela_run(one_sum.tosa, target).cycles


@pytest.mark.parametrize("target", ["ethos-u55-128", "ethos-u85-256"])
def test_row_sums_bitexact_on_npusim(target):
    """As int16 the row sums are bit-exact on U55 too; kept int32, Vela's U55 transpose of them for the
    REDUCE_SUM gives sums npu-sim does not reproduce."""
    qdq = quantize_model(se_pool_model(64, 16, 16), calib("x", [1, 8, 16, 16], low=-1.0, high=3.0))
    lowered = lower_model(qdq, "int", family=target.split("-")[1][:3])
    assert "DEPTHWISE_CONV2D" in ops(lowered)
    with tempfile.TemporaryDirectory() as tmp:
        assert_bitexact(lowered.tosa, io_dict(lowered), vela_raw(lowered.tosa, Path(tmp), target))


@pytest.mark.parametrize("family,target,hwc", [("u55", "ethos-u55-128", (4, 4, 96)),
                                               ("u65", "ethos-u65-256", (8, 8, 16)),
                                               ("u85", "ethos-u85-256", (6, 6, 256))])
def test_small_planes_keep_one_sum(family, target, hwc):
    """Few positions of many channels, and U65's planes under 10x10, are cheaper as one REDUCE_SUM (forced,
    the rows form is slower there): the limits leave them alone."""
    h, w, c = hwc
    qdq = quantize_model(se_pool_model(c, h, w), calib("x", [1, 8, h, w], low=-1.0, high=3.0))
    kept = lower_model(qdq, "int", family=family)
    assert kept.tosa == lower_model(qdq, "int", options=_without_rows(family)).tosa
    forced = lower_model(qdq, "int", options=replace(FAMILY_OPTIONS[family], plane_rows=PlaneRowsLimits(1, 1, 1, 1 << 30)))
    assert "DEPTHWISE_CONV2D" in ops(forced)
    assert vela_run(forced.tosa, target).cycles > vela_run(kept.tosa, target).cycles


def test_u85_small_plane_rows_measured_per_model():
    """On U85 the rows' ones weights and per-channel scales (W*C + 10*C bytes of DRAM constants) are a small gain
    on small planes: DS-CNN's 25x5x64 head 2.6% for 0.7 KiB (bench/perf_choices.md). The family's options keep one
    REDUCE_SUM under 16384 elements; the lower stage measures the rows for every plane (ethosu/measured.py): the
    faster form in performance mode, the smallest one in size mode."""
    qdq = quantize_model(se_pool_model(64, 25, 5), calib("x", [1, 8, 25, 5], low=-1.0, high=3.0))
    kept = lower_model(qdq, "int", family="u85")
    assert kept.tosa == lower_model(qdq, "int", options=_without_rows("u85")).tosa
    forced = lower_model(qdq, "int", options=replace(FAMILY_OPTIONS["u85"], plane_rows=PlaneRowsLimits(4, 49, 0, 256)))
    assert "DEPTHWISE_CONV2D" in ops(forced) and "DEPTHWISE_CONV2D" not in ops(kept)
    one, rows = vela_run(kept.tosa, "ethos-u85-256"), vela_run(forced.tosa, "ethos-u85-256")
    offchip = "off_chip_flash_memory_used", "dram_memory_used"
    assert sum(float(rows.summary[k]) for k in offchip) > sum(float(one.summary[k]) for k in offchip)
    assert rows.cycles < one.cycles  # 11436 vs 11855 here: 3.5% of this layer, 2.6% of DS-CNN
    lower = lambda o: lower_model(qdq, "int", options=o)  # noqa: E731
    perf, _ = choose(qdq, "u85", lower)
    size, _ = choose(qdq, "u85", lower, optimise="size")
    # size mode: not the rows, and here not the one REDUCE_SUM either but the constant-free pooled row sums
    # (reduction.pooled_row_sums), which Vela stores less for
    pooled = lower_model(qdq, "int", options=replace(FAMILY_OPTIONS["u85"], plane_pool_rows=True))
    assert lower(perf).tosa == forced.tosa and lower(size).tosa == pooled.tosa
    assert sum(float(vela_run(pooled.tosa, "ethos-u85-256").summary[k]) for k in offchip) < \
        sum(float(one.summary[k]) for k in offchip)
