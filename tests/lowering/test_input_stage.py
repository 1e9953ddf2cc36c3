"""U65: a strided conv's thin graph input is padded by its own PAD read as wide rows, then copied to bricks.

Vela reads a 3-channel NHWC input in DRAM three bytes at a time when the conv reads it itself (MobileNetV1
96x96 on U65-256: 133448 of 264315 cycles); the PAD over each row as one wide pixel copies it in long
bursts and the TRANSPOSE pair (one SRAM copy in Vela) leaves the brick layout the conv reads fast. The same
integers: the PAD value is the input's zero point, as the conv's own padding. Checked against onnxruntime,
the portable graph and Vela; stride-1 or small inputs keep the plain conv (slower staged).
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from ophelpers import calib, check_int, quantize_model, vela_run
from test_depthwise_requantize import assert_same_reference, ops
from test_ops_compute import _conv

from npubuild.lowering.driver import lower_model
from npubuild.lowering.options import FAMILY_OPTIONS, InputStageLimits


@pytest.mark.parametrize("shape", [[1, 3, 96, 96], [1, 3, 64, 64]])
def test_u65_staged_input_identical_to_the_conv_and_faster(shape):
    model = _conv(shape, 8, 3, stride=2)
    cal = calib("x", shape)
    check_int(model, cal, {"x": np.random.default_rng(4).uniform(-1, 1, shape).astype(np.float32)})
    qdq = quantize_model(model, cal)
    portable, u65 = lower_model(qdq, "int"), lower_model(qdq, "int", family="u65")
    assert "PAD" not in ops(portable)
    assert ops(u65)[:5] == ["RESHAPE", "PAD", "RESHAPE", "TRANSPOSE", "TRANSPOSE"]
    assert_same_reference(portable, u65)
    assert vela_run(u65.tosa, "ethos-u65-256").cycles < 0.8 * vela_run(portable.tosa, "ethos-u65-256").cycles


@pytest.mark.parametrize("shape, stride", [([1, 3, 32, 32], 2), ([1, 3, 64, 64], 1), ([1, 8, 64, 64], 2)])
def test_small_unstrided_or_deep_inputs_are_read_by_the_conv(shape, stride):
    qdq = quantize_model(_conv(shape, 8, 3, stride=stride), calib("x", shape))
    assert lower_model(qdq, "int", family="u65").tosa == lower_model(qdq, "int").tosa


@pytest.mark.parametrize("fam, target", [("u55", "ethos-u55-128"), ("u85", "ethos-u85-256")])
def test_u55_and_u85_are_slower_staged(fam, target):
    """U55 reads the input from SRAM (Shared_Sram), U85's read is DRAM-bound either way (forced, slower)."""
    shape = [1, 3, 96, 96]
    qdq = quantize_model(_conv(shape, 8, 3, stride=2), calib("x", shape))
    plain = lower_model(qdq, "int", family=fam)
    staged = lower_model(qdq, "int", options=replace(FAMILY_OPTIONS[fam], input_stage=InputStageLimits()))
    assert "PAD" in ops(staged) and "PAD" not in ops(plain)
    assert vela_run(staged.tosa, target).cycles > vela_run(plain.tosa, target).cycles
