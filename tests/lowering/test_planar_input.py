"""U65: a 3-channel image input stays planar (NCHW, as the model takes it) and is transposed on the NPU.

Vela reads an NHWC input of three channels from DRAM a pixel (three bytes) at a time when the first conv
reads it itself (MobileNetV1 96x96 on U65-256: 133448 of 264315 cycles, ExecuTorch's route with its NCHW
input and TRANSPOSE 0.2015 ms against npubuild's 0.2643); NCHW planes it reads in long bursts. The io
records the layout (perm), the integers are the same. Checked against the portable graph on the TOSA
reference model and with Vela; one channel (NCHW is NHWC) and the other families keep NHWC.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from npbtest.lowering import conv_model, npu_bitexact, ops
from npbtest.ops import calib, quantize_model, vela_run

from npubuild.lowering.driver import lower_model
from npubuild.lowering.options import FAMILY_OPTIONS
from npubuild.tosa.run import run_tosa


def _same_outputs(a, b, shape) -> None:
    for seed in range(3):
        feeds = {"x": np.random.default_rng(seed).uniform(-1, 1, shape).astype(np.float32)}
        ya, yb = run_tosa(a.tosa, a, feeds), run_tosa(b.tosa, b, feeds)
        assert all(np.array_equal(ya[k], yb[k]) for k in ya)


@pytest.mark.parametrize("shape, stride", [([1, 3, 96, 96], 2), ([1, 3, 32, 32], 1)])
def test_u65_planar_input_identical_and_faster(shape, stride):
    qdq = quantize_model(conv_model(shape, 16, 3, stride=stride), calib("x", shape))
    portable, u65 = lower_model(qdq, "int"), lower_model(qdq, "int", family="u65")
    assert u65.inputs[0].perm == (0, 1, 2, 3) and portable.inputs[0].perm == (0, 2, 3, 1)
    assert ops(u65)[0] == "TRANSPOSE" and "TRANSPOSE" not in ops(portable)
    _same_outputs(portable, u65, shape)
    assert vela_run(u65.tosa, "ethos-u65-256").cycles < 0.95 * vela_run(portable.tosa, "ethos-u65-256").cycles


def test_planar_input_bitexact_on_npusim():
    """Vela's TRANSPOSE of the planar input and the conv after it: the command stream equals the TOSA reference."""
    shape = [1, 3, 16, 16]
    npu_bitexact(lower_model(quantize_model(conv_model(shape, 8, 3), calib("x", shape)), "int", family="u65"))


def test_one_channel_and_deep_inputs_stay_nhwc():
    for shape in ([1, 1, 49, 10], [1, 8, 32, 32]):
        qdq = quantize_model(conv_model(shape, 8, 3), calib("x", shape))
        assert lower_model(qdq, "int", family="u65").tosa == lower_model(qdq, "int").tosa


@pytest.mark.parametrize("fam, target", [("u55", "ethos-u55-128"), ("u85", "ethos-u85-256")])
def test_u55_and_u85_keep_nhwc(fam, target):
    """U55 reads the input from SRAM (Shared_Sram), U85's DRAM read costs the same either way: the TRANSPOSE
    is then extra (forced, slower)."""
    shape = [1, 3, 96, 96]
    qdq = quantize_model(conv_model(shape, 16, 3, stride=2), calib("x", shape))
    nhwc = lower_model(qdq, "int", family=fam)
    planar = lower_model(qdq, "int", options=replace(FAMILY_OPTIONS[fam], planar_input_channels=4))
    assert nhwc.inputs[0].perm == (0, 2, 3, 1) and planar.inputs[0].perm == (0, 1, 2, 3)
    assert vela_run(planar.tosa, target).cycles > vela_run(nhwc.tosa, target).cycles
