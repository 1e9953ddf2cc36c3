"""The int8 layer norm in Vela's fewest passes: rows of any spread, long rows, and what Vela makes of it."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from npbtest.lowering import assert_same_reference, npu_bitexact, rows_of_every_spread
from npbtest.ops import calib, check_int, quantize_model, single_op_model, vela_run

from npubuild.lowering.driver import lower_model
from npubuild.lowering.fusion.norm_rows import A0_MAX, fraction_bits, variance_shift
from npubuild.lowering.options import EVERY_FAMILY, FAMILY_OPTIONS, PORTABLE


@pytest.mark.parametrize("count", [2, 64, 768, 4096])
def test_fraction_bits_keep_every_int32_in_range(count):
    """The per-row multiplier K a, the per-element product c (K a) and the result n 2^(frac + e) fit int32."""
    frac, e, a_sh = fraction_bits(count, 14)
    sh = variance_shift(count)
    sp = 30 + sh // 2 - a_sh - frac - e
    assert 65025 * count * count / 2**sh <= 2**30 and sh % 2 == 0
    assert count * A0_MAX / 2**a_sh < 2**31 and sp >= 1
    assert np.sqrt(count) * 2.0 ** (frac + e) <= 2**30 and frac >= 8


@pytest.mark.parametrize("shape", [[12, 8], [12, 64], [6, 768]])
def test_rows_of_every_spread_within_one_lsb(shape):
    """Near-constant rows (variance down at eps) and full-range ones alike: <= 1 LSB from onnxruntime's QDQ
    result, and the NPU (npu-sim, U55) bit-exact with the TOSA reference."""
    rng = np.random.default_rng(0)
    k = shape[-1]
    inits = {"g": rng.uniform(-2, 2, k).astype(np.float32), "b": rng.normal(0, 0.5, k).astype(np.float32)}
    model = single_op_model("LayerNormalization", {"x": shape}, {"y": None}, inits, axis=-1, epsilon=1e-5)
    lowered, err = check_int(model, calib("x", shape, low=-2, high=2), {"x": rows_of_every_spread(shape)})
    print(f"layer norm {shape}: max error {err} LSB")
    npu_bitexact(lowered)


@pytest.mark.parametrize("accelerator,rescales", [("ethos-u55-128", 2), ("ethos-u85-256", 1)])
def test_vela_fuses_every_full_size_rescale(accelerator, rescales):
    """A transformer's [16, 64] layer norm: the widenings vanish into the REDUCE_SUM and the SUB/MUL that read
    them, the mean's and K sum(c^2)'s RESCALEs into their REDUCE_SUMs, the int16 rounding into the last SUB
    and the output RESCALE into the depthwise conv. Only the per-row seed widening is left (U55 runs it as an
    ADD and a MUL)."""
    shape = [16, 64]
    rng = np.random.default_rng(0)
    inits = {"g": rng.uniform(-2, 2, 64).astype(np.float32), "b": rng.normal(0, 0.5, 64).astype(np.float32)}
    model = single_op_model("LayerNormalization", {"x": shape}, {"y": None}, inits, axis=-1)
    lowered, _ = check_int(model, calib("x", shape, low=-2, high=2), {"x": rows_of_every_spread(shape)})
    rows = vela_run(lowered.tosa, accelerator).layers
    assert sum(r["Original Operator"] == "Rescale" for r in rows) == rescales
    assert sum(r["Original Operator"] == "DepthwiseConv2D" for r in rows) == 1


def test_u55_form_identical_and_faster_on_u55_and_u65():
    """U55/U65 take the seed index as one RESCALE and widen the seed by an ADD of two int8 operands (Vela runs
    a lone widening RESCALE as two ops there): the same integers, fewer cycles; U85 keeps the portable graph,
    where the RESCALE index costs ~450 cycles more."""
    shape = [16, 64]
    rng = np.random.default_rng(0)
    inits = {"g": rng.uniform(-2, 2, 64).astype(np.float32), "b": rng.normal(0, 0.5, 64).astype(np.float32)}
    qdq = quantize_model(single_op_model("LayerNormalization", {"x": shape}, {"y": None}, inits, axis=-1),
                         calib("x", shape, low=-2, high=2))
    portable, u55 = lower_model(qdq, "int"), lower_model(qdq, "int", family="u55")
    assert_same_reference(portable, u55)
    assert vela_run(u55.tosa, "ethos-u55-128").cycles < vela_run(portable.tosa, "ethos-u55-128").cycles
    assert vela_run(u55.tosa, "ethos-u65-256").cycles < vela_run(portable.tosa, "ethos-u65-256").cycles
    # U85 differs from the portable graph only by the row statistics and depthwise views (test_row_stats_channels.py)
    u85_form = lower_model(qdq, "int", options=replace(PORTABLE, **EVERY_FAMILY, norm_affine_one_row=True))
    assert lower_model(qdq, "int", family="u85").tosa == u85_form.tosa
    # the int8-squares form adds three per-row RESCALEs (m0, K m0 in the channel row: ~170 cycles); without it
    centred = lower_model(qdq, "int", options=replace(FAMILY_OPTIONS["u55"], norm_raw_squares=False))
    rows = vela_run(centred.tosa, "ethos-u55-128").layers
    rescales = [r["Name"] for r in rows if r["Original Operator"] == "Rescale"]
    assert len(rescales) == 1  # only the seed index, which runs the TABLE as its LUT
    assert [float(r["Op Cycles"]) for r in rows if r["NNG Operator"] == "LUT" and r["Name"] in rescales] == [0.0]
    npu_bitexact(u55)
