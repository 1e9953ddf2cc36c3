"""A whole-plane mean at a new scale with no constant (LoweringOptions.plane_pool_rows, reduction.pooled_row_sums):
exact int16 row sums by AVG_POOL2D (1, W) of (x - zp) W in bands of rows, then REDUCE_SUM over H. The integers of
the one-REDUCE_SUM form on the TOSA reference model and npu-sim (a width that is not a power of two: the pool's
division by W must still be exact), and less off-chip memory than it in Vela's figures."""

from __future__ import annotations

import tempfile
from dataclasses import replace
from pathlib import Path

import pytest
from npbtest.lowering import assert_same_reference, ops, se_pool_model
from npbtest.npusim import assert_bitexact, vela_raw
from npbtest.ops import calib, io_dict, quantize_model

from npubuild.ethosu.measured import vela_figures
from npubuild.lowering.driver import lower_model
from npubuild.lowering.options import FAMILY_OPTIONS


def _qdq(h: int, w: int, op: str = "GlobalAveragePool"):
    return quantize_model(se_pool_model(32, h, w, op), calib("x", [1, 8, h, w], low=-1.0, high=3.0))


@pytest.mark.parametrize("op", ["ReduceMean", "GlobalAveragePool"])
def test_same_integers_as_one_reduce_sum_no_constants(op):
    qdq = _qdq(12, 10, op)
    one_sum = lower_model(qdq, "int", options=replace(FAMILY_OPTIONS["u55"], plane_rows=None))
    pooled = lower_model(qdq, "int", options=replace(FAMILY_OPTIONS["u55"], plane_pool_rows=True))
    assert "AVG_POOL2D" in ops(pooled) and "DEPTHWISE_CONV2D" not in ops(pooled)
    assert ops(pooled).count("REDUCE_SUM") == 1
    assert_same_reference(one_sum, pooled)


@pytest.mark.parametrize("family,target", [("u55", "ethos-u55-128"), ("u85", "ethos-u85-256")])
def test_less_off_chip_and_bitexact_on_npusim(family, target):
    qdq = _qdq(12, 10)
    pooled = lower_model(qdq, "int", options=replace(FAMILY_OPTIONS[family], plane_pool_rows=True))
    one_sum = lower_model(qdq, "int", options=replace(FAMILY_OPTIONS[family], plane_rows=None))
    assert vela_figures(pooled.tosa, target, "size")["offchip_kib"] < \
        vela_figures(one_sum.tosa, target, "size")["offchip_kib"]
    with tempfile.TemporaryDirectory() as tmp:
        assert_bitexact(pooled.tosa, io_dict(pooled), vela_raw(pooled.tosa, Path(tmp), target))


def test_too_wide_a_row_keeps_the_reduce_sum():
    """255 W must fit int16: a 130-wide plane sums as before."""
    qdq = _qdq(2, 130)
    pooled = lower_model(qdq, "int", options=replace(FAMILY_OPTIONS["u85"], plane_pool_rows=True))
    assert pooled.tosa == lower_model(qdq, "int", options=FAMILY_OPTIONS["u85"]).tosa
