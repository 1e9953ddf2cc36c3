"""U85: a strided conv whose stride never reaches the last input row/col gets zero taps instead of a SLICE.

TOSA wants (in - 1 + pads - (k - 1)) to divide by the stride where ONNX floors,
so a 1x1 stride-2 shortcut over a 16x16 map must not read row/col 15. Slicing
the input to 15x15 leaves the block input with two readers of different widths
(the 3x3 stride-2 branch reads all 16), which makes Vela give up its brick
format and pick a worse block; a 2x2 kernel whose extra taps are zero computes
the same integers from the full-width input. Checked against onnxruntime, the
portable graph and Vela.
"""

from __future__ import annotations

import numpy as np
from npbtest.lowering import assert_same_reference, downsampling_block, ops
from npbtest.ops import calib, check_int, quantize_model, vela_run

from npubuild.lowering.driver import lower_model


def test_u85_zero_taps_identical_to_the_slice_and_faster():
    model = downsampling_block()
    shape = [1, 32, 16, 16]
    cal = calib("x", shape)
    check_int(model, cal, {"x": np.random.default_rng(3).uniform(-1, 1, shape).astype(np.float32)})
    qdq = quantize_model(model, cal)
    portable, u85 = lower_model(qdq, "int"), lower_model(qdq, "int", family="u85")
    assert "SLICE" in ops(portable) and "SLICE" not in ops(u85)
    assert_same_reference(portable, u85)
    assert vela_run(u85.tosa, "ethos-u85-256").cycles < vela_run(portable.tosa, "ethos-u85-256").cycles


def test_u55_keeps_the_slice():
    """On U55 the zero taps cost more MAC cycles than the brick format saves."""
    qdq = quantize_model(downsampling_block(), calib("x", [1, 32, 16, 16]))
    assert "SLICE" in ops(lower_model(qdq, "int", family="u55"))
