"""Per-row statistics laid along channels (LoweringOptions.row_stats_channels, reduction.stats_as_channels), and
the layer norm's variance from int8 squares (LoweringOptions.norm_raw_squares, norm_rows.normalized_int16) and
its gamma / beta depthwise on one row of blocks (LoweringOptions.norm_affine_one_row, ops_norm).

A layer norm's rsqrt chain and a softmax's reciprocal run ~20 elementwise ops on one value per row. As
[rows, 1] Vela 5.2 runs each of them on U55 as `rows` 1x1 blocks (320 cycles for 16 rows) and holds each
int32 per-row tensor brick-padded to 16 channels (4 KiB for 64 rows); viewed by a RESHAPE as one channel
row [1, 1, 1, rows] the same ops take 20 cycles and 256 bytes. K sum(x^2) - s^2 is the variance's
K sum(c^2) - t^2 (c = x - round(mean)) for the int8 x itself: an int8 MUL instead of an int32 one, and t = s - K m0
per row instead of a REDUCE_SUM of c. The depthwise reads the rows as [1, 1, rows, K] (W) rather than
[1, rows, 1, K] (H): the same products. Each checked against the form without it (the same integers on the TOSA
reference model), onnxruntime's QDQ result, Vela's estimate and npu-sim.
"""

from __future__ import annotations

import tempfile
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from npbtest.lowering import assert_same_reference, ops, rows_of_every_spread
from npbtest.npusim import assert_bitexact, vela_raw
from npbtest.ops import calib, check_int, io_dict, quantize_model, rand, single_op_model, vela_run

from npubuild.lowering.driver import lower_model
from npubuild.lowering.options import FAMILY_OPTIONS

FAMILY_TARGETS = [("u55", "ethos-u55-128"), ("u65", "ethos-u65-256"), ("u85", "ethos-u85-256")]


def _layer_norm(shape: list[int]):
    rng = np.random.default_rng(0)
    k = shape[-1]
    inits = {"g": rng.uniform(-2, 2, k).astype(np.float32), "b": rng.normal(0, 0.5, k).astype(np.float32)}
    return single_op_model("LayerNormalization", {"x": shape}, {"y": None}, inits, axis=-1, epsilon=1e-5)


def _softmax(shape: list[int]):
    return single_op_model("Softmax", {"x": shape}, {"y": None}, axis=-1)


CASES = {"layer_norm_16x64": (_layer_norm, [1, 16, 64], 2.0), "softmax_4x16x16": (_softmax, [1, 4, 16, 16], 4.0)}


def _without(family: str, option: str = "row_stats_channels"):
    return replace(FAMILY_OPTIONS[family], **{option: False})


def _staging_peak(layers: list[dict[str, str]]) -> int:
    return max(int(float(r["Staging Usage"])) for r in layers)


@pytest.mark.parametrize("case,option,family,target",
                         [(c, "row_stats_channels", f, t) for c in sorted(CASES) for f, t in FAMILY_TARGETS]
                         + [("layer_norm_16x64", "norm_raw_squares", f, t) for f, t in FAMILY_TARGETS[:2]]
                         + [("layer_norm_16x64", "norm_affine_one_row", f, t) for f, t in FAMILY_TARGETS])
def test_same_integers_within_one_lsb_and_no_slower(case, option, family, target):
    make, shape, spread = CASES[case]
    model, cal = make(shape), calib("x", shape, low=-spread, high=spread)
    stats, err = check_int(model, cal, {"x": rand(shape, 3, -spread, spread)}, options=FAMILY_OPTIONS[family])
    assert err <= 1
    rows = lower_model(quantize_model(model, cal), "int", options=_without(family, option))
    if option == "row_stats_channels":
        assert ops(stats).count("RESHAPE") > ops(rows).count("RESHAPE")  # the channel views are there
    elif option == "norm_raw_squares":
        assert ops(stats).count("REDUCE_SUM") == ops(rows).count("REDUCE_SUM") - 1
    assert_same_reference(rows, stats)
    with_view, without = vela_run(stats.tosa, target), vela_run(rows.tosa, target)
    assert with_view.cycles <= without.cycles
    assert _staging_peak(with_view.layers) <= _staging_peak(without.layers)


def test_layer_norm_of_16_rows_a_third_faster_on_u55():
    """The transformer's [16, 64] layer norm: 15076 -> 9916 U55-128 cycles (the per-row ops 320 -> 20 each),
    8936 with the int8 squares."""
    make, shape, spread = CASES["layer_norm_16x64"]
    qdq = quantize_model(make(shape), calib("x", shape, low=-spread, high=spread))
    both = vela_run(lower_model(qdq, "int", family="u55").tosa, "ethos-u55-128").cycles
    rows = replace(FAMILY_OPTIONS["u55"], row_stats_channels=False, norm_raw_squares=False, norm_affine_one_row=False)
    assert both < 0.65 * vela_run(lower_model(qdq, "int", options=rows).tosa, "ethos-u55-128").cycles


def test_layer_norm_of_wide_rows_keeps_the_centred_squares():
    """K = 768 needs the variance shift (K sum(x^2) would pass int32): the centred form, with or without."""
    make = CASES["layer_norm_16x64"][0]
    qdq = quantize_model(make([1, 4, 768]), calib("x", [1, 4, 768], low=-2, high=2))
    assert lower_model(qdq, "int", family="u55").tosa == lower_model(qdq, "int", options=_without(
        "u55", "norm_raw_squares")).tosa


def test_softmax_reciprocal_holds_less_sram():
    """The attention softmax's reciprocal chain on [4, 16, 1] int32 values set the transformer's SRAM peak."""
    make, shape, spread = CASES["softmax_4x16x16"]
    qdq = quantize_model(make(shape), calib("x", shape, low=-spread, high=spread))
    for family, target in (("u55", "ethos-u55-128"), ("u85", "ethos-u85-256")):
        stats, rows = lower_model(qdq, "int", family=family), lower_model(qdq, "int", options=_without(family))
        assert _staging_peak(vela_run(stats.tosa, target).layers) < _staging_peak(vela_run(rows.tosa, target).layers)


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("family,target", [("u55", "ethos-u55-128"), ("u85", "ethos-u85-256")])
def test_bitexact_on_npusim(case, family, target):
    make, shape, spread = CASES[case]
    lowered = lower_model(quantize_model(make(shape), calib("x", shape, low=-spread, high=spread)), "int",
                          family=family)
    with tempfile.TemporaryDirectory() as tmp:
        assert_bitexact(lowered.tosa, io_dict(lowered), vela_raw(lowered.tosa, Path(tmp), target))


def test_more_rows_than_a_tensor_dimension_keep_their_shape():
    """Over 65536 rows the channel row would pass Vela's largest dimension: the statistics stay [rows, 1]."""
    shape = [1, 70000, 2]
    qdq = quantize_model(_softmax(shape), calib("x", shape, n=2, low=-4, high=4))
    assert lower_model(qdq, "int", family="u55").tosa == lower_model(qdq, "int", options=_without("u55")).tosa


@pytest.mark.parametrize("family,target", [("u55", "ethos-u55-128"), ("u65", "ethos-u65-256")])
def test_layer_norm_rows_of_every_spread_on_npusim(family, target):
    """Near-constant rows (variance at eps) to full-range ones through the family's forms: <= 1 LSB from
    onnxruntime's QDQ result, and npu-sim bit-exact with the TOSA reference."""
    shape = [12, 64]
    model = _layer_norm(shape)
    lowered, err = check_int(model, calib("x", shape, low=-2, high=2), {"x": rows_of_every_spread(shape)},
                             options=FAMILY_OPTIONS[family])
    assert err <= 1 and FAMILY_OPTIONS[family].norm_raw_squares
    with tempfile.TemporaryDirectory() as tmp:
        assert_bitexact(lowered.tosa, io_dict(lowered), vela_raw(lowered.tosa, Path(tmp), target))
